/*
 * Run-time dispatch: ONE table of variant configs, best first; the first the CPU supports is
 * chosen at the first call, unless REFCG_ISA names another supported one. Drivers: copy the input
 * once into the variant's domain (padded, NHWC), then split tiles over threads.
 */
#include <stdlib.h>
#include <string.h>
#include "refcg_fast_internal.h"

static inline int refcg_cpu_any(void) { return 1; }

/* Portable variant on the packed layout (dense under the scalar variant, any architecture). */
static void refcg_tiles_portable(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;
  const int32_t nblocks = (j->n + 15) / 16;
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t i = (int32_t)(t / nblocks), nb = (int32_t)(t % nblocks);
    const uint8_t* row = refcg_job_row(j, i);
    const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
    uint32_t acc[16] = {0};
    for (int32_t s = 0; s < j->nseg; ++s)
      for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64)
        for (int l = 0; l < 16; ++l)
          for (int q = 0; q < 4; ++q) acc[l] += (uint32_t)(row[j->seg_off[s] + k + q] * wp[4 * l + q]);
    const int32_t c0 = nb * 16;
    refcg_epi_scalar(&j->epi, (const int32_t*)acc, c0, j->n - c0 < 16 ? j->n - c0 : 16, refcg_job_out(j, i));
  }
}

static void refcg_dw_portable(const void* ctx, int64_t r0, int64_t r1) {
  refcg_dw_rows((const refcg_dw_job*)ctx, r0, r1, refcg_dw16_portable, refcg_epi_scalar);
}

static const refcg_isa_config refcg_isa_scalar = {
    .name = "scalar",
    .features = "",
    .supported = refcg_cpu_any,
    .signed_domain = 0,
    .gemm = {.mr = 1, .nv = 1, .tiles = refcg_tiles_portable, .planes = NULL, .flips = NULL, .wino = NULL,
             .reads_a16 = NULL},
    .dw = {.rows = refcg_dw_portable, .planes = NULL, .pairs = 0, .quads = 0, .qmax = 0, .flips = 0},
    .binary_rows = NULL,
    .pool = NULL,
    .quantize = NULL,
    .requantize = NULL,
    .lut = NULL,
    .reduce = NULL,
    .gather = NULL,
    .gather_by16 = NULL,
};

static const refcg_isa_config* const refcg_isa_table[] = {
#if defined(REFCG_HAVE_X86)
    &refcg_isa_avx512vnni, &refcg_isa_avxvnni, &refcg_isa_avx2,
#endif
#if defined(REFCG_HAVE_ARM)
    &refcg_isa_dotprod, &refcg_isa_neon,
#endif
    &refcg_isa_scalar,
};
enum { REFCG_NUM_ISA = sizeof(refcg_isa_table) / sizeof(refcg_isa_table[0]) };

static const refcg_isa_config* refcg_isa_find(const char* name) {
  for (int i = 0; i < REFCG_NUM_ISA; ++i)
    if (!strcmp(refcg_isa_table[i]->name, name) && refcg_isa_table[i]->supported()) return refcg_isa_table[i];
  return NULL;
}

static const refcg_isa_config* refcg_isa_best(void) {
  for (int i = 0; i < REFCG_NUM_ISA; ++i)
    if (refcg_isa_table[i]->supported()) return refcg_isa_table[i];
  return &refcg_isa_scalar;
}

/* The variant in use: chosen once, at the first call (REFCG_ISA read then), or by refcg_set_isa. */
static const refcg_isa_config* refcg_isa_chosen;

static inline const refcg_isa_config* refcg_isa_current(void) {
  const refcg_isa_config* isa = __atomic_load_n(&refcg_isa_chosen, __ATOMIC_ACQUIRE);
  if (isa) return isa;
  const char* forced = getenv("REFCG_ISA");
  const refcg_isa_config* want = forced && *forced ? refcg_isa_find(forced) : NULL;
  if (!want) want = refcg_isa_best();
  /* threads racing here compute the same choice; an earlier refcg_set_isa wins */
  if (__atomic_compare_exchange_n(&refcg_isa_chosen, &isa, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return want;
  return isa;
}

REFCG_API const char* refcg_isa_name(void) { return refcg_isa_current()->name; }

REFCG_API int refcg_isa_supported(const char* name) { return refcg_isa_find(name) != NULL; }

REFCG_API const char* refcg_isa_variant(int32_t i, const char** features) {
  if (i < 0 || i >= REFCG_NUM_ISA) return NULL;
  if (features) *features = refcg_isa_table[i]->features;
  return refcg_isa_table[i]->name;
}

REFCG_API int refcg_set_isa(const char* name) {
  const int named = name && *name;
  const refcg_isa_config* want = named ? refcg_isa_find(name) : NULL;
  __atomic_store_n(&refcg_isa_chosen, want ? want : refcg_isa_best(), __ATOMIC_RELEASE);
  return named && !want ? -1 : 0;
}

/* ---- padded input copy ---- */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* 8 channels x 8 pixels of an NCHW input (rows src + c * cs) into 8 pixels x 8 channels
 * (rows dst + w * ds), XOR-ing the domain shift in. SSE2 is baseline on x86-64. */
REFCG_INLINE void refcg_transpose8x8(const uint8_t* src, int64_t cs, uint8_t* dst, int64_t ds, uint8_t flip) {
#if defined(__SSE2__)
  const __m128i f = _mm_set1_epi8((char)flip);
  __m128i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_xor_si128(_mm_loadl_epi64((const __m128i*)(src + i * cs)), f);
  const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
  const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
  const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
  const __m128i d[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                        _mm_unpackhi_epi32(b1, b3)};
  for (int i = 0; i < 4; ++i) {
    _mm_storel_epi64((__m128i*)(dst + (2 * i) * ds), d[i]);
    _mm_storel_epi64((__m128i*)(dst + (2 * i + 1) * ds), _mm_srli_si128(d[i], 8));
  }
#else
  for (int c = 0; c < 8; ++c)
    for (int w = 0; w < 8; ++w) dst[w * ds + c] = (uint8_t)(src[c * cs + w] ^ flip);
#endif
}

/* n pixels of 4 channel planes interleaved byte by byte into dst (4 bytes a pixel): planes
 * src[r] for r < real, XOR flip; the others read as 0. */
static void refcg_interleave4(const uint8_t* const* src, int real, uint8_t flip, uint8_t* dst, int64_t n) {
  int64_t p = 0;
#if defined(__SSE2__)
  const __m128i f = _mm_set1_epi8((char)flip), zero = _mm_setzero_si128();
  for (; p + 16 <= n; p += 16) {
    __m128i v[4];
    for (int r = 0; r < 4; ++r) v[r] = r < real ? _mm_xor_si128(_mm_loadu_si128((const __m128i*)(src[r] + p)), f) : zero;
    const __m128i ab0 = _mm_unpacklo_epi8(v[0], v[1]), ab1 = _mm_unpackhi_epi8(v[0], v[1]);
    const __m128i cd0 = _mm_unpacklo_epi8(v[2], v[3]), cd1 = _mm_unpackhi_epi8(v[2], v[3]);
    _mm_storeu_si128((__m128i*)(dst + 4 * p), _mm_unpacklo_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i*)(dst + 4 * p + 16), _mm_unpackhi_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i*)(dst + 4 * p + 32), _mm_unpacklo_epi16(ab1, cd1));
    _mm_storeu_si128((__m128i*)(dst + 4 * p + 48), _mm_unpackhi_epi16(ab1, cd1));
  }
#endif
  for (; p < n; ++p)
    for (int r = 0; r < 4; ++r) dst[4 * p + r] = r < real ? (uint8_t)(src[r][p] ^ flip) : 0;
}

/* n RGB pixels (3 bytes each) as 4 bytes (XOR flip, a zero fourth): 4 pixels from one 8-byte and one 4-byte
 * load, two 8-byte stores (byte by byte this was a fifth of a 224x224 stem conv). Little-endian. */
static void refcg_rgb_to_rgb0(const uint8_t* src, uint8_t flip, uint8_t* dst, int64_t n) {
  const uint64_t m = 0xFFFFFFu, f = (uint64_t)flip * 0x0001010100010101u;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4, src += 12, dst += 16) {
    uint64_t a, out[2];
    uint32_t b;
    memcpy(&a, src, 8);
    memcpy(&b, src + 8, 4);
    out[0] = ((a & m) | ((a >> 24) & m) << 32) ^ f;
    out[1] = ((((a >> 48) | (uint64_t)b << 16) & m) | (uint64_t)(b >> 8) << 32) ^ f;
    memcpy(dst, out, 16);
  }
  for (; i < n; ++i, src += 3, dst += 4) {
    const uint32_t v = ((uint32_t)src[0] | (uint32_t)src[1] << 8 | (uint32_t)src[2] << 16) ^ (uint32_t)(f & m);
    memcpy(dst, &v, 4);
  }
}

typedef struct {
  const refcg_conv2d_params* p;
  const void* input;      /* one batch */
  uint8_t* a;             /* [hp][wp][cp], from padded row row0 on */
  int64_t row0;
  int32_t hp, wp, cp, cin;
  uint8_t flip;           /* 0x80 when the input dtype differs from the domain */
  uint8_t pad;            /* izp in the domain */
} refcg_pad_job;

/* Chunks [c0, c1) of refcg_widen_job (the last one with 64 zero lanes of read slack after it). */
static void refcg_widen_chunks(const void* ctx, int64_t c0, int64_t c1) {
  const refcg_widen_job* j = (const refcg_widen_job*)ctx;
  const int64_t i1 = c1 * REFCG_WIDEN_CHUNK < j->n ? c1 * REFCG_WIDEN_CHUNK : j->n;
  const uint8_t* src = j->src;
  uint16_t* dst = j->dst; /* locals: the compiler vectorizes the loop */
  const uint8_t flip = j->flip;
  for (int64_t i = c0 * REFCG_WIDEN_CHUNK; i < i1; ++i) dst[i] = (uint8_t)(src[i] ^ flip);
  if (i1 == j->n) memset(dst + j->n, 0, 64 * sizeof(uint16_t));
}

/* Rows [r0, r1) of the padded copy: border = izp, channels beyond cin = 0. */
static void refcg_pad_rows(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_pad_job* j = (const refcg_pad_job*)ctx;
  const refcg_conv2d_params* p = j->p;
  const uint8_t* in = (const uint8_t*)j->input;
  /* locals: the byte stores below may alias any field read through j or p, which would make
   * the compiler reload every field per byte and forbid vectorizing the copies */
  const int64_t cp = j->cp, cin = j->cin, in_w = p->in_w, s2 = p->in_stride[2], s3 = p->in_stride[3];
  const int32_t wp = j->wp, pad_left = p->pad_left;
  const uint8_t flip = j->flip, pad = j->pad;
  /* NCHW into 4 channels a pixel (a first conv's 3): whole pixels written by refcg_interleave4 */
  const int planes4 = s3 != 1 && cp == 4 && s2 == 1;
  for (int64_t r = r0; r < r1; ++r) {
    uint8_t* row = j->a + (r - j->row0) * wp * cp;
    const int64_t ih = r - p->pad_top;
    const int inside = ih >= 0 && ih < p->in_h;
    for (int32_t x = 0; x < wp; ++x) { /* border pixels: izp, channels beyond cin 0 */
      if (inside && x == pad_left) x += (int32_t)in_w;
      if (x >= wp) break;
      uint8_t* px = row + (int64_t)x * cp;
      memset(px, pad, cin);
      if (cp > cin) memset(px + cin, 0, cp - cin);
    }
    if (!inside) continue;
    const uint8_t* src = in + ih * p->in_stride[1];
    uint8_t* dst = row + (int64_t)pad_left * cp;
    if (planes4) {
      const uint8_t* planes[4];
      for (int c = 0; c < 4; ++c) planes[c] = src + (c < cin ? c : 0) * s3; /* past cin: not read */
      refcg_interleave4(planes, (int)cin, flip, dst, in_w);
      continue;
    }
    if (s3 == 1 && s2 == 3 && cin == 3 && cp == 4) { /* NHWC RGB (a first conv): whole 32-bit pixels */
      refcg_rgb_to_rgb0(src, flip, dst, in_w);
      continue;
    }
    if (cp > cin) memset(dst, 0, in_w * cp); /* the copies below write the cin channels only */
    if (s3 == 1 && (s2 == cp || in_w == 1)) { /* NHWC, no channel padding (or one pixel): one run */
      const int64_t n = in_w == 1 ? cin : in_w * cp;
      for (int64_t i = 0; i < n; ++i) dst[i] = (uint8_t)(src[i] ^ flip);
    } else if (s3 == 1) { /* NHWC: channels contiguous */
      for (int64_t iw = 0; iw < in_w; ++iw) {
        uint8_t* d = dst + iw * cp;
        const uint8_t* sp = src + iw * s2;
        for (int64_t c = 0; c < cin; ++c) d[c] = (uint8_t)(sp[c] ^ flip);
      }
    } else { /* NCHW: transpose 8 channels x 8 pixels at a time through a small tile */
      for (int64_t c0 = 0; c0 < cin; c0 += 8) {
        const int64_t cn = cin - c0 < 8 ? cin - c0 : 8;
        for (int64_t w0 = 0; w0 < in_w; w0 += 8) {
          const int64_t wn = in_w - w0 < 8 ? in_w - w0 : 8;
          if (cn == 8 && wn == 8 && s2 == 1) {
            refcg_transpose8x8(src + c0 * s3 + w0, s3, dst + w0 * cp + c0, cp, flip);
            continue;
          }
          uint8_t tile[8][8];
          for (int64_t c = 0; c < cn; ++c) {
            const uint8_t* sp = src + (c0 + c) * s3 + w0 * s2;
            for (int64_t w = 0; w < wn; ++w) tile[w][c] = (uint8_t)(sp[w * s2] ^ flip);
          }
          for (int64_t w = 0; w < wn; ++w) memcpy(dst + (w0 + w) * cp + c0, tile[w], cn);
        }
      }
    }
  }
}

/* Channel-major (NCHW) byte outputs: the tiles store pixel-major rows into a workspace and these
 * 8x8 transposes write them out, instead of one scattered byte store per channel and pixel. */
typedef struct {
  const uint8_t* src; /* [out_h][out_w][c] */
  uint8_t* dst;
  int64_t w, c, dst_h, dst_c; /* dst strides of a row and a channel; pixels are contiguous */
} refcg_unpack_job;

static void refcg_unpack_rows(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_unpack_job* j = (const refcg_unpack_job*)ctx;
  const int64_t w = j->w, c = j->c, dh = j->dst_h, dc = j->dst_c;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = j->src + r * w * c;
    uint8_t* dst = j->dst + r * dh;
    for (int64_t c0 = 0; c0 < c; c0 += 8)
      for (int64_t w0 = 0; w0 < w; w0 += 8) {
        if (c - c0 >= 8 && w - w0 >= 8) {
          refcg_transpose8x8(src + w0 * c + c0, c, dst + c0 * dc + w0, dc, 0);
          continue;
        }
        for (int64_t ci = c0; ci < c && ci < c0 + 8; ++ci)
          for (int64_t wi = w0; wi < w && wi < w0 + 8; ++wi) dst[ci * dc + wi] = src[wi * c + ci];
      }
  }
}

/* refcg_gemmp_job's input: planes of 4 channels interleaved byte by byte (x ^ flip), channels
 * past cin read as 0 (their packed weights are 0). Rows are groups of 4 channels. */
typedef struct {
  const uint8_t* x; /* [c][hw] */
  uint8_t* xi;      /* [kp/4][hw][4] */
  int64_t hw;
  int32_t cin;
  uint8_t flip;
} refcg_interleave_job;

static void refcg_interleave_rows(const void* ctx, int64_t q0, int64_t q1) {
  const refcg_interleave_job* j = (const refcg_interleave_job*)ctx;
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t c0 = 4 * q, real = j->cin - c0 < 4 ? j->cin - c0 : 4;
    const uint8_t* src[4];
    for (int r = 0; r < 4; ++r) src[r] = j->x + (c0 + (r < real ? r : 0)) * j->hw; /* past cin: not read */
    refcg_interleave4(src, (int)real, j->flip, j->xi + q * j->hw * 4, j->hw);
  }
}

/* Planar compact 4-D tensor: pixels contiguous, rows of w, planes of h * w. */
static inline int refcg_planar(const int64_t* stride, int32_t h, int32_t w) {
  return stride[2] == 1 && stride[1] == w && stride[3] == (int64_t)h * w;
}

/* Padded extent needed by the output: rows up to (out-1)*stride + (k-1)*dilation. */
static inline int32_t refcg_padded_extent(int32_t in, int32_t pad, int32_t out, int32_t stride, int32_t k, int32_t dil) {
  const int32_t need = (out - 1) * stride + (k - 1) * dil + 1;
  return need > in + pad ? need : in + pad;
}

static inline refcg_epi refcg_make_epi(const refcg_requant* rq, int32_t channels, const int32_t* corr, void* out,
                                       int32_t out_dtype, int64_t o_c) {
  refcg_epi e = {rq, refcg_rq_vector_ok(rq, channels), corr, out, out_dtype, o_c};
  return e;
}

static inline int refcg_fast_usable(const refcg_conv2d_params* p, const refcg_conv2d_fast* f) {
  if (!f || f->kind == REFCG_FAST_NONE || p->in_dtype == REFCG_S32) return 0;
  if (p->kernel_h * p->kernel_w > REFCG_DW_MAX_TAPS) return 0;
  if (f->kind == REFCG_FAST_DEPTHWISE) return p->groups == p->in_c && p->out_c % p->in_c == 0; /* multiplier */
  return p->groups == 1;
}

/* The plane kernels read pixel j's taps q from its 16-byte window (3 * sw + (q - 1) * dw <= 15);
 * returns the taps per lane, 0 when the layout, stride or buffers do not fit. */
static inline int32_t refcg_dwp_taps(const refcg_isa_config* isa, const refcg_conv2d_params* p, const refcg_conv2d_fast* f) {
  if (!isa->dw.planes || f->kind != REFCG_FAST_DEPTHWISE || p->in_stride[2] != 1 || p->out_stride[2] != 1) return 0;
  if (p->stride_w > 4) return 0;
  int32_t q = isa->dw.qmax < p->kernel_w ? isa->dw.qmax : p->kernel_w;
  while (q > 1 && 3 * p->stride_w + (q - 1) * p->dilation_w > 15) --q;
  return q;
}

/* Depthwise through the plane kernels, threads over input channels. Returns 1 when the shape
 * does not fit the stack buffers (the caller then takes the NHWC path). */
static int refcg_dw_planes(const refcg_isa_config* isa, int32_t q, const refcg_conv2d_params* p,
                           const refcg_conv2d_consts* k, const refcg_conv2d_fast* f, const void* input, void* output) {
  refcg_dwp_job j;
  memset(&j, 0, sizeof(j));
  j.p = p;
  j.q = q;
  j.g = (p->kernel_w + q - 1) / q;
  j.owp = (p->out_w + 15) / 16 * 16;
  const int32_t wp = refcg_padded_extent(p->in_w, p->pad_left, p->out_w, p->stride_w, p->kernel_w, p->dilation_w);
  const int64_t reach = (int64_t)(j.owp - 16) * p->stride_w + (int64_t)(j.g - 1) * q * p->dilation_w + 64;
  const int64_t pitch = reach > wp ? reach : wp, row_bytes = (int64_t)j.g * j.owp * 4;
  const int64_t span = (int64_t)(p->kernel_h - 1) * p->dilation_h + 1; /* padded rows of one output row */
  if (pitch > REFCG_DWP_ROW || span * row_bytes > REFCG_DWP_EXPANDED) return 1;
  j.pitch = (int32_t)pitch;
  j.strip = (int32_t)((REFCG_DWP_EXPANDED / row_bytes - span) / p->stride_h + 1);
  for (int l = 0; l < 16; ++l) j.ix[l] = (l / 4) * p->stride_w + l % 4;
  for (int b = 0; b < 64; ++b) { /* pixel j of a 16-byte lane; taps as bytes, or int16 with zero high bytes */
    const int32_t pix = b % 16 / 4, tap = isa->dw.qmax == 4 ? b % 4 : b % 4 / 2;
    const int low = isa->dw.qmax == 4 || b % 2 == 0;
    j.ctl[b] = low && tap < q ? (uint8_t)(pix * p->stride_w + tap * p->dilation_w) : 0x80;
  }
  j.flip = (p->in_dtype == REFCG_S8) == isa->signed_domain ? 0 : 0x80;
  j.pad = (uint8_t)((p->input_zp & 0xff) ^ j.flip);
  j.mult = p->out_c / p->in_c;
  j.w = f->dw_w;
  j.cp = f->cp;
  j.o_h = p->out_stride[1];
  const int32_t* corr = isa->signed_domain ? f->dw_corr_s8 : f->dw_corr_u8;
  const int out_elem = p->out_dtype == REFCG_S32 ? 4 : 1;
  for (int32_t n = 0; n < p->batch; ++n) {
    j.input = (const uint8_t*)input + n * p->in_stride[0];
    j.epi = refcg_make_epi(&k->requant, p->out_c, corr, (uint8_t*)output + n * p->out_stride[0] * out_elem,
                           p->out_dtype, p->out_stride[3]);
    refcg_parallel(isa->dw.planes, &j, p->in_c);
  }
  return 0;
}

/* 1x1 stride-1 unpadded conv, planar input and output: interleave, then the pixels-in-lanes tiles. */
static int refcg_conv2d_planes(const refcg_isa_config* isa, const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                               const refcg_conv2d_fast* f, const void* input, void* output) {
  const int64_t hw = (int64_t)p->in_h * p->in_w;
  const int32_t kp = f->gemm.kp;
  uint8_t* xi = (uint8_t*)refcg_ws_alloc((size_t)kp * hw + 4 * REFCG_GEMMP_PX); /* tail blocks read past hw */
  if (!xi) return -2;
  const uint8_t flip = (p->in_dtype == REFCG_S8) == isa->signed_domain ? 0 : 0x80;
  const int32_t* corr = isa->signed_domain ? f->gemm.corr_s8 : f->gemm.corr_u8;
  const int out_elem = p->out_dtype == REFCG_S32 ? 4 : 1;
  for (int32_t n = 0; n < p->batch; ++n) {
    const refcg_interleave_job ij = {(const uint8_t*)input + n * p->in_stride[0], xi, hw, p->in_c, flip};
    const refcg_gemmp_job j = {xi, hw, p->out_c, kp, f->gemm.w,
                               refcg_make_epi(&k->requant, p->out_c, corr, (uint8_t*)output + n * p->out_stride[0] * out_elem,
                                              p->out_dtype, p->out_stride[3])};
    const refcg_par_task phases[] = {
        {refcg_interleave_rows, &ij, kp / 4},
        {isa->gemm.planes, &j, (p->out_c + REFCG_GEMMP_MR - 1) / REFCG_GEMMP_MR * ((hw + REFCG_GEMMP_PX - 1) / REFCG_GEMMP_PX)}};
    refcg_parallel_phases(phases, 2);
  }
  refcg_ws_free(xi);
  return 0;
}

/* Winograd weights U = G' g G'^T (G' = 2G) from the packed GEMM weights (k = (kh * 3 + kw) * cp + c),
 * laid out [16][nb][cp / 2][16][2] (refcg_wino_job.u); channels past n are the packing's zeros. */
static void refcg_wino_weights(const refcg_gemm_weights* g, int32_t cp, int32_t n, int16_t* u) {
  static const int8_t g2[4][3] = {{2, 0, 0}, {1, 1, 1}, {1, -1, 1}, {0, 0, 2}};
  const int32_t nb = (n + 15) / 16;
  for (int32_t o = 0; o < nb * 16; ++o)
    for (int32_t c = 0; c < cp; ++c) {
      int32_t w[3][3], gw[4][3];
      for (int32_t t = 0; t < 9; ++t) {
        const int64_t k = (int64_t)t * cp + c;
        w[t / 3][t % 3] = g->w[((int64_t)(o / 16) * (g->kp / 4) + k / 4) * 64 + (o % 16) * 4 + k % 4];
      }
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < 3; ++b) gw[i][b] = g2[i][0] * w[0][b] + g2[i][1] * w[1][b] + g2[i][2] * w[2][b];
      for (int i = 0; i < 4; ++i)
        for (int q = 0; q < 4; ++q)
          u[(((int64_t)(4 * i + q) * nb + o / 16) * (cp / 2) + c / 2) * 32 + (o % 16) * 2 + c % 2] =
              (int16_t)(gw[i][0] * g2[q][0] + gw[i][1] * g2[q][1] + gw[i][2] * g2[q][2]);
    }
}

/* f's Winograd weights, built at the first call (NULL: no memory; the caller runs the GEMM). */
static const int16_t* refcg_wino_weights_of(const refcg_conv2d_fast* f, int32_t n) {
  void* u = __atomic_load_n(&f->wino->w, __ATOMIC_ACQUIRE);
  if (u) return (const int16_t*)u;
  int16_t* built = (int16_t*)malloc((size_t)16 * ((n + 15) / 16 * 16) * f->cp * sizeof(int16_t));
  if (!built) return NULL;
  refcg_wino_weights(&f->gemm, f->cp, n, built);
  void* expected = NULL;
  if (__atomic_compare_exchange_n(&f->wino->w, &expected, (void*)built, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return built;
  free(built); /* another call built them first */
  return (const int16_t*)expected;
}

REFCG_API void refcg_wino_release(refcg_wino_cache* c) { free(__atomic_exchange_n(&c->w, NULL, __ATOMIC_ACQ_REL)); }

static inline int refcg_wino_usable(const refcg_isa_config* isa, const refcg_conv2d_params* p,
                                     const refcg_conv2d_fast* f) {
  return isa->gemm.wino && f->wino && f->kind == REFCG_FAST_GEMM && p->kernel_h == 3 && p->kernel_w == 3 &&
         p->stride_h == 1 && p->stride_w == 1 && p->dilation_h == 1 && p->dilation_w == 1 && f->cp % 16 == 0 &&
         f->cp <= REFCG_WINO_MAX_CP && f->gemm.kp == 9 * f->cp;
}

/* Tile blocks whose V (16 x tb x cp int16) stays within 256 KB (half of a Zen 2 L2), an even count of
 * them (2 threads); under 4 blocks, channel groups split them further. Returns the task count. */
static int64_t refcg_wino_plan(refcg_wino_job* j) {
  const int64_t tiles = (int64_t)j->th * j->tw, most = 8192 / j->cp > 0 ? 8192 / j->cp : 1;
  int64_t blocks = (tiles + most - 1) / most;
  blocks += blocks > 1 && blocks % 2;
  j->tb = (int32_t)((tiles + blocks - 1) / blocks);
  blocks = (tiles + j->tb - 1) / j->tb;
  const int64_t want = blocks >= 4 ? 1 : (4 + blocks - 1) / blocks;
  j->gb = (int32_t)((j->nb + want - 1) / want);
  j->ngroups = (j->nb + j->gb - 1) / j->gb;
  return blocks * j->ngroups;
}

/* A depthwise conv's padded copy and rows in one phase: each task pads the input rows its output
 * rows read into a buffer of its own, then runs them. No barrier between a pad and a rows phase, and
 * a task's rows are padded by the thread that reads them (on 2 threads the separate pad phase took
 * 1.8x its 1-thread CPU time, and the faster task waited at the barrier: MobileNetV2 1.03x). */
typedef struct {
  const refcg_pad_job* pad;
  const refcg_dw_job* dw;
  refcg_range_fn rows;
  int* failed; /* set when a task's buffer could not be allocated (the caller reruns in two phases) */
} refcg_dw_padded_job;

static void refcg_dw_padded_rows(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_dw_padded_job* f = (const refcg_dw_padded_job*)ctx;
  const refcg_dw_job* d = f->dw;
  const int64_t p0 = r0 * d->sh, p1 = (r1 - 1) * d->sh + (int64_t)(d->kh - 1) * d->dh + 1;
  uint8_t* buf = (uint8_t*)refcg_ws_alloc((size_t)(p1 - p0) * d->wp * d->cp + 64);
  if (!buf) {
    __atomic_store_n(f->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  refcg_pad_job pj = *f->pad;
  pj.a = buf;
  pj.row0 = p0;
  refcg_pad_rows(&pj, p0, p1);
  refcg_dw_job dj = *d;
  dj.a = buf;
  dj.a_row0 = p0;
  f->rows(&dj, r0, r1);
  refcg_ws_free(buf);
}

REFCG_API int refcg_conv2d(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                           const refcg_conv2d_fast* f, const void* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  /* the scalar variant of conv is the reference itself, unless the library stored only the packed
   * GEMM weights (dense, and groups == 1 convs: refcodegen emits their weights once) */
  if ((isa == &refcg_isa_scalar && k->weight) || !refcg_fast_usable(p, f))
    return refcg_conv2d_ref(p, k, input, output);
  const int32_t q = refcg_dwp_taps(isa, p, f);
  if (q > 0 && refcg_dw_planes(isa, q, p, k, f, input, output) == 0) return 0;
  if (f->kind == REFCG_FAST_DEPTHWISE && p->out_c != p->in_c) return refcg_conv2d_ref(p, k, input, output);
  if (isa->gemm.planes && f->kind == REFCG_FAST_GEMM && p->kernel_h == 1 && p->kernel_w == 1 && p->stride_h == 1 &&
      p->stride_w == 1 && p->out_h == p->in_h && p->out_w == p->in_w && p->pad_top == 0 && p->pad_left == 0 &&
      refcg_planar(p->in_stride, p->in_h, p->in_w) && refcg_planar(p->out_stride, p->out_h, p->out_w))
    return refcg_conv2d_planes(isa, p, k, f, input, output);
  int32_t hp = refcg_padded_extent(p->in_h, p->pad_top, p->out_h, p->stride_h, p->kernel_h, p->dilation_h);
  int32_t wp = refcg_padded_extent(p->in_w, p->pad_left, p->out_w, p->stride_w, p->kernel_w, p->dilation_w);
  const int32_t cp = f->cp;
  /* Winograd: whole 4x4 patches of every 2x2 output tile */
  const int16_t* wino_u = refcg_wino_usable(isa, p, f) ? refcg_wino_weights_of(f, p->out_c) : NULL;
  const int32_t th = (p->out_h + 1) / 2, tw = (p->out_w + 1) / 2;
  if (wino_u && hp < 2 * th + 2) hp = 2 * th + 2;
  if (wino_u && wp < 2 * tw + 2) wp = 2 * tw + 2;
  const int in_signed = p->in_dtype == REFCG_S8;
  const uint8_t flip = in_signed == isa->signed_domain ? 0 : 0x80;
  const int depthwise = f->kind == REFCG_FAST_DEPTHWISE;
  /* The input is its own padded copy: nothing to pad (every row and pixel the taps reach lies inside it),
   * pixels of exactly cp channels in contiguous channels-last rows. */
  const int unpadded = p->pad_top == 0 && p->pad_left == 0 && hp <= p->in_h && wp <= p->in_w &&
                       p->in_stride[3] == 1 && p->in_stride[2] == cp && p->in_stride[1] == (int64_t)p->in_w * cp;
  /* The GEMM tiles read such an input in place where its rows are as wide as the padded copy's (a 1x1
   * conv on a channels-last tensor), bytes already in the variant's domain (or tiles that flip them as
   * they read where that is cheaper, isa->gemm.flips; Winograd reads the copy). The tiles read 4 bytes at
   * a time below kw * cp. */
  const int in_place = !depthwise && unpadded && wp == p->in_w &&
                       (flip == 0 || (isa->gemm.flips && !wino_u &&
                                      isa->gemm.flips((int64_t)p->kernel_h * p->kernel_w * cp, p->out_c)));
  /* depthwise: each task pads its own rows (refcg_dw_padded_rows), or none when the input is its own
   * padded copy (a producer wrote it inside a halo: refcg_fill_halo) in the variant's domain or in the
   * other, for rows that flip the bytes as they read them (isa->dw.flips: MobileNetV2's int8 96@112
   * stride 2 in float32 numerics ran 1.7x the time of the same conv on a flipped input) */
  const int dw_in_place = depthwise && (flip == 0 || isa->dw.flips) && unpadded;
  const size_t a_bytes = (size_t)hp * wp * cp + 64;
  uint8_t* a = in_place || depthwise ? NULL : (uint8_t*)refcg_ws_alloc(a_bytes);
  if (!in_place && !depthwise && !a) return -2;
  const int32_t* corr = depthwise ? (isa->signed_domain ? f->dw_corr_s8 : f->dw_corr_u8)
                                  : (isa->signed_domain ? f->gemm.corr_s8 : f->gemm.corr_u8);
  const int out_elem = p->out_dtype == REFCG_S32 ? 4 : 1;
  const int unpack = !depthwise && out_elem == 1 && p->out_stride[3] != 1 && p->out_stride[2] == 1;
  uint8_t* rows = unpack ? (uint8_t*)refcg_ws_alloc((size_t)p->out_h * p->out_w * p->out_c + 64) : NULL;
  if (unpack && !rows) {
    if (a) refcg_ws_free(a);
    return -2;
  }
  /* The weights as the variant's rows kernel reads them: packed ahead of time, else built here once per
   * call (serial work before the threads start: ~1 ns per tap and channel). */
  const int16_t* wpair = NULL;
  int16_t* wpair_built = NULL;
  if (depthwise && isa->dw.pairs && !(wpair = f->dw_pairs)) {
    const int32_t taps = p->kernel_h * p->kernel_w;
    wpair = wpair_built = (int16_t*)refcg_ws_alloc((size_t)refcg_dw_pairs_size(taps, cp) * sizeof(int16_t));
    if (!wpair_built) {
      refcg_ws_free(a);
      return -2;
    }
    refcg_dw_pair_weights(f->dw_w, taps, cp, wpair_built);
  }
  const int8_t* wquad = NULL; /* the same for row quads, where every weight fits int8 */
  int8_t* wquad_built = NULL;
  if (depthwise && isa->dw.quads && p->kernel_h == p->kernel_w && (p->kernel_w == 3 || p->kernel_w == 5) &&
      !(wquad = f->dw_quads)) {
    wquad_built = (int8_t*)refcg_ws_alloc((size_t)refcg_dw_quads_size(p->kernel_h, p->kernel_w, cp));
    if (wquad_built && !refcg_dw_quad_weights(f->dw_w, p->kernel_h, p->kernel_w, cp, wquad_built)) {
      refcg_ws_free(wquad_built);
      wquad_built = NULL;
    }
    wquad = wquad_built;
  }
  int64_t seg_off[256];
  int rc = 0;
  for (int32_t n = 0; n < p->batch; ++n) {
    refcg_pad_job pj = {p, (const uint8_t*)input + n * p->in_stride[0], a, 0, hp, wp, cp, p->in_c, flip,
                        (uint8_t)((p->input_zp & 0xff) ^ flip)};
    void* out = (uint8_t*)output + n * p->out_stride[0] * out_elem;
    const refcg_epi epi = refcg_make_epi(&k->requant, p->out_c, corr, unpack ? (void*)rows : out, p->out_dtype,
                                         unpack ? 1 : p->out_stride[3]);
    if (depthwise) {
      const int32_t row_px = dw_in_place ? p->in_w : wp; /* pixels per row of what the rows read */
      refcg_dw_job dj = {a, 0, isa->signed_domain, (uint8_t)(dw_in_place ? flip : 0), row_px, cp, p->out_w, p->out_c, p->kernel_h, p->kernel_w,
                         p->stride_h, p->stride_w, p->dilation_h, p->dilation_w, wpair ? wpair : f->dw_w, f->dw_w, wquad, epi,
                         p->out_stride[1], p->out_stride[2], {0}};
      for (int32_t t = 0; t < p->kernel_h * p->kernel_w; ++t)
        dj.tap_off[t] = ((int64_t)t / p->kernel_w * p->dilation_h * row_px + (int64_t)t % p->kernel_w * p->dilation_w) * cp;
      dj.tap_off[p->kernel_h * p->kernel_w] = dj.tap_off[p->kernel_h * p->kernel_w - 1];
      if (dw_in_place) {
        dj.a = (const uint8_t*)input + n * p->in_stride[0];
        refcg_parallel(isa->dw.rows, &dj, p->out_h);
        continue;
      }
      int failed = 0;
      const refcg_dw_padded_job fj = {&pj, &dj, isa->dw.rows, &failed};
      refcg_parallel(refcg_dw_padded_rows, &fj, p->out_h);
      if (!failed) continue;
      /* a task's buffer did not fit: the whole padded copy, then the rows (allocated and freed here:
       * the workspace frees last in, first out) */
      pj.a = a = (uint8_t*)refcg_ws_alloc(a_bytes);
      dj.a = a;
      if (!a) {
        rc = -2;
        break;
      }
      const refcg_par_task phases[] = {{refcg_pad_rows, &pj, hp}, {isa->dw.rows, &dj, p->out_h}};
      refcg_parallel_phases(phases, 2);
      refcg_ws_free(a);
      a = NULL;
      continue;
    }
    /* segments: one per kernel row when taps of a row are adjacent, else one per tap */
    const int rows_contiguous = p->dilation_w == 1;
    const int32_t nseg = rows_contiguous ? p->kernel_h : p->kernel_h * p->kernel_w;
    for (int32_t s = 0; s < nseg; ++s) {
      const int32_t kh = rows_contiguous ? s : s / p->kernel_w, kw = rows_contiguous ? 0 : s % p->kernel_w;
      seg_off[s] = ((int64_t)kh * p->dilation_h * wp + (int64_t)kw * p->dilation_w) * cp;
    }
    const uint8_t* x = in_place ? (const uint8_t*)input + n * p->in_stride[0] : a;
    refcg_gemm_job j = {p->out_h * p->out_w, p->out_w, (int64_t)p->stride_h * wp * cp, (int64_t)p->stride_w * cp, x,
                        nseg, rows_contiguous ? p->kernel_w * cp : cp, seg_off, p->out_c, f->gemm.kp, f->gemm.w,
                        epi, unpack ? (int64_t)p->out_w * p->out_c : p->out_stride[1],
                        unpack ? p->out_c : p->out_stride[2], f->gemm.pair_safe, in_place ? flip * 0x01010101u : 0, NULL};
    const int64_t nblocks = (p->out_c + 15) / 16, ngroups = (nblocks + isa->gemm.nv - 1) / isa->gemm.nv;
    const refcg_unpack_job uj = {rows, (uint8_t*)out, p->out_w, p->out_c, p->out_stride[1], p->out_stride[3]};
    int failed = 0;
    refcg_wino_job wj = {x, wp, cp, (int32_t)nblocks, th, tw, p->out_h, p->out_w, 0, 0, 0, wino_u, &j, &failed};
    /* the input as 16-bit lanes where the tiles want them (AVX2's widened weights: a broadcast load per
     * row and k-step instead of a load and a vpmovzxbw); none if the workspace is short */
    const int64_t a_n = (int64_t)hp * wp * cp;
    uint16_t* a16 = !wino_u && isa->gemm.reads_a16 && isa->gemm.reads_a16(&j)
                        ? (uint16_t*)refcg_ws_alloc((size_t)(a_n + 64) * sizeof(uint16_t)) : NULL;
    const refcg_widen_job widen = {x, a16, a_n, (uint8_t)(in_place ? flip : 0)};
    j.a16 = a16;
    const refcg_par_task all[] = {{refcg_pad_rows, &pj, in_place ? 0 : hp},
                                  {refcg_widen_chunks, &widen, a16 ? (a_n + REFCG_WIDEN_CHUNK - 1) / REFCG_WIDEN_CHUNK : 0},
                                  {wino_u ? isa->gemm.wino : isa->gemm.tiles, wino_u ? (const void*)&wj : (const void*)&j,
                                   wino_u ? refcg_wino_plan(&wj) : (j.m + isa->gemm.mr - 1) / isa->gemm.mr * ngroups},
                                  {refcg_unpack_rows, &uj, unpack ? p->out_h : 0}};
    refcg_par_task phases[4];
    int count = 0;
    for (int i = 0; i < 4; ++i)
      if (all[i].total > 0 || i == 2) phases[count++] = all[i]; /* the phases this conv has */
    refcg_parallel_phases(phases, count);
    if (a16) refcg_ws_free(a16);
    if (failed) {
      rc = -2;
      break;
    }
  }
  if (wquad_built) refcg_ws_free(wquad_built); /* last in, first out */
  if (wpair_built) refcg_ws_free(wpair_built);
  if (rows) refcg_ws_free(rows);
  if (a) refcg_ws_free(a);
  return rc;
}

REFCG_API int refcg_dense(const refcg_dense_params* p, const refcg_gemm_weights* g, const refcg_requant* rq,
                          const void* input, void* output) {
  const int32_t m = p->batch, kk = p->in_features, n = p->units;
  if (m <= 0 || kk <= 0 || n <= 0 || g->kp < kk || g->np < n || p->in_dtype == REFCG_S32) return -1;
  const int32_t kp = g->kp;
  /* As a 1x1 conv over an m x 1 image: the reference and the padded copy come for free. */
  refcg_conv2d_params cp;
  memset(&cp, 0, sizeof(cp));
  cp.batch = 1;
  cp.in_h = cp.out_h = m;
  cp.in_w = cp.out_w = 1;
  cp.in_c = kk;
  cp.out_c = n;
  cp.kernel_h = cp.kernel_w = cp.stride_h = cp.stride_w = cp.dilation_h = cp.dilation_w = cp.groups = 1;
  cp.in_dtype = p->in_dtype;
  cp.w_dtype = REFCG_S8;
  cp.out_dtype = p->out_dtype;
  cp.input_zp = p->input_zp;
  cp.in_stride[1] = cp.in_stride[0] = kk;
  cp.in_stride[2] = cp.in_stride[3] = 1;
  cp.out_stride[1] = cp.out_stride[0] = n;
  cp.out_stride[2] = cp.out_stride[3] = 1;
  refcg_conv2d_fast f;
  memset(&f, 0, sizeof(f));
  f.kind = REFCG_FAST_GEMM;
  f.cp = kp;
  f.gemm = *g;
  refcg_conv2d_consts k = {NULL, NULL, *rq};
  return refcg_conv2d(&cp, &k, &f, input, output);
}

/* Rows of fewer than REFCG_BIN_SHORT elements, one operand a row broadcast over them (squeeze-excite's
 * x * gate on channels-last tensors: 16..96 channels per pixel) and the other compact: the broadcast row
 * repeated into rows of up to REFCG_BIN_CHUNK elements, so the vector loops run long rows instead of
 * paying their set-up and tail per pixel; the rows left over run as they are. 0: not this case. */
#define REFCG_BIN_SHORT 256
static int refcg_binary_widened(const refcg_binary_params* p, const refcg_bin_job* j, const uint8_t* a,
                                const uint8_t* b, uint8_t* out) {
  const int64_t rows = j->shape[0], n = j->shape[1];
  if (j->ndim != 2 || n >= REFCG_BIN_SHORT) return 0;
  const int row_b = j->as[0] == n && j->as[1] == 1 && j->bs[0] == 0 && j->bs[1] == 1;
  const int row_a = j->bs[0] == n && j->bs[1] == 1 && j->as[0] == 0 && j->as[1] == 1;
  const int64_t per = REFCG_BIN_CHUNK / n; /* rows per widened row */
  if (!(row_a || row_b) || rows < per) return 0;
  uint8_t repeated[REFCG_BIN_CHUNK];
  for (int64_t r = 0; r < per; ++r) memcpy(repeated + r * n, row_b ? b : a, (size_t)n);
  refcg_binary_params q = *p;
  q.ndim = 2;
  q.shape[0] = rows / per;
  q.shape[1] = per * n;
  q.a_stride[0] = row_b ? per * n : 0;
  q.b_stride[0] = row_b ? 0 : per * n;
  q.a_stride[1] = q.b_stride[1] = 1;
  int status = refcg_binary(&q, row_b ? a : repeated, row_b ? repeated : b, out);
  const int64_t done = q.shape[0] * per * n;
  if (status == 0 && rows % per) { /* fewer rows than one widened row: not widened again */
    q.shape[0] = rows % per;
    q.shape[1] = n;
    q.a_stride[0] = row_b ? n : 0;
    q.b_stride[0] = row_b ? 0 : n;
    status = refcg_binary(&q, row_b ? a + done : a, row_b ? b : b + done, out + done);
  }
  return status == 0 ? 1 : status;
}

REFCG_API int refcg_binary(const refcg_binary_params* p, const void* a, const void* b, void* out) {
  const refcg_isa_config* isa = refcg_isa_current();
  if (!isa->binary_rows || p->ndim < 1 || p->ndim > REFCG_MAX_DIMS) return refcg_binary_ref(p, a, b, out);
  refcg_bin_job j;
  memset(&j, 0, sizeof(j));
  const int64_t rows = refcg_bin_merge(p, &j);
  const int64_t sa = j.as[j.ndim - 1], sb = j.bs[j.ndim - 1];
  const int vector = refcg_is_8bit(p->a_dtype) && refcg_is_8bit(p->b_dtype) && refcg_is_8bit(p->out_dtype) &&
                     (sa == 0 || sa == 1) && (sb == 0 || sb == 1) && refcg_rq_vector_ok(&p->rq_a, 1) &&
                     (p->op == REFCG_BIN_MUL || refcg_rq_vector_ok(&p->rq_b, 1));
  if (!vector) return refcg_binary_ref(p, a, b, out);
  const int widened = refcg_binary_widened(p, &j, (const uint8_t*)a, (const uint8_t*)b, (uint8_t*)out);
  if (widened) return widened == 1 ? 0 : widened;
  j.p = p;
  j.a = (const uint8_t*)a;
  j.b = (const uint8_t*)b;
  j.out = (uint8_t*)out;
  refcg_parallel(isa->binary_rows, &j, refcg_bin_chunks(&j, rows));
  return 0;
}

/* Whether requantize p reads and writes overlapping bytes (an in-place requantize from C). */
static int refcg_rq_overlaps(const refcg_requantize_params* p, const void* input, const void* output) {
  const int64_t n = p->channels * p->inner;
  const uintptr_t in0 = (uintptr_t)input, out0 = (uintptr_t)output + (uintptr_t)p->out_offset;
  const uintptr_t in1 = in0 + (uintptr_t)(p->outer * n * (p->in_dtype == REFCG_S32 ? 4 : 1));
  const uintptr_t out1 = out0 + (uintptr_t)((p->outer - 1) * p->out_outer_stride + n);
  return in0 < out1 && out0 < in1;
}

/* An 8-bit to 8-bit requantize on a variant with table lookups and no vector requantize (ARM): its
 * 256 values through refcg_requantize_one (exact in every mode), then the lookup rows (one row where
 * the output rows are contiguous too). */
static int refcg_requantize_tabled(const refcg_requantize_params* p, const void* input, void* output) {
  const int64_t n = p->channels * p->inner;
  const int rows = p->out_outer_stride != n;
  uint8_t table[256];
  for (int32_t v = 0; v < 256; ++v)
    table[v] = (uint8_t)refcg_requantize_one(&p->rq, p->in_dtype == REFCG_S8 ? (int8_t)v : v, 0);
  const refcg_lut_params lp = {p->outer * n, rows ? n : 0, rows ? p->out_outer_stride : 0, 0};
  return refcg_lut(&lp, table, input, (uint8_t*)output + p->out_offset);
}

REFCG_API int refcg_requantize(const refcg_requantize_params* p, const void* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  const int in_ok = refcg_is_8bit(p->in_dtype) || p->in_dtype == REFCG_S32; /* int32: a mean's or a sum's */
  if (!in_ok || !refcg_is_8bit(p->out_dtype) || p->rq.per_channel || p->outer < 1 || p->channels < 1 || p->inner < 1)
    return refcg_requantize_ref(p, input, output);
  const int64_t n = p->channels * p->inner;
  /* the vector rows store a tail as their last full step again, re-reading input: buffers apart only;
   * the lookups read and write each row in place: the same rows too */
  const int overlaps = refcg_rq_overlaps(p, input, output);
  if (!isa->requantize) {
    const int same_rows = input == (const uint8_t*)output + p->out_offset && p->out_outer_stride == n;
    if (isa->lut && refcg_is_8bit(p->in_dtype) && p->out_outer_stride >= n && (!overlaps || same_rows))
      return refcg_requantize_tabled(p, input, output);
    return refcg_requantize_ref(p, input, output);
  }
  if (!refcg_rq_vector_ok(&p->rq, 1) || overlaps) return refcg_requantize_ref(p, input, output);
  refcg_rq_job j = {p, (const uint8_t*)input, (uint8_t*)output, n, 0};
  int64_t rows = p->outer;
  if (p->out_outer_stride == j.n) { /* the output rows are contiguous too: one row */
    j.n *= rows;
    rows = 1;
  }
  j.chunks = (j.n + REFCG_BIN_CHUNK - 1) / REFCG_BIN_CHUNK;
  refcg_parallel(isa->requantize, &j, rows * j.chunks);
  return 0;
}

REFCG_API int refcg_lut(const refcg_lut_params* p, const uint8_t* table, const void* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  int64_t row_len, stride;
  if (!isa->lut || p->size < 1 || !refcg_lut_rows(p, &row_len, &stride)) return refcg_lut_ref(p, table, input, output);
  uint8_t flipped[256];
  if (p->out_xor) { /* the kernels look up a table with the flip in it */
    for (int i = 0; i < 256; ++i) flipped[i] = table[i] ^ p->out_xor;
    table = flipped;
  }
  const int64_t chunks = (row_len + REFCG_BIN_CHUNK - 1) / REFCG_BIN_CHUNK;
  const refcg_lut_job j = {table, (const uint8_t*)input, (uint8_t*)output, row_len, stride, chunks};
  refcg_parallel(isa->lut, &j, p->size / row_len * chunks);
  return 0;
}

/* j's 16-byte windows (refcg_gather_job.by16) for its table take: per output chunk, greedily, a window
 * from the lowest index its unplaced lanes read (inside the row), taking every lane it holds. */
static int refcg_gather_plan16(refcg_gather_job* j, const int32_t* take) {
  if (j->size < 16) return 0;
  memset(j->win16_idx, 0x80, sizeof(j->win16_idx));
  for (int64_t k = 0; 16 * k < j->n; ++k) {
    const int32_t lanes = j->n - 16 * k < 16 ? (int32_t)(j->n - 16 * k) : 16;
    const int32_t* t = take + 16 * k;
    uint32_t left = (1u << lanes) - 1u;
    int32_t w = 0;
    for (; left; ++w) {
      if (w == REFCG_GATHER_W16) return 0;
      int32_t first = INT32_MAX;
      for (int32_t l = 0; l < lanes; ++l)
        if ((left >> l & 1u) && t[l] < first) first = t[l];
      const int32_t at = first < j->size - 16 ? first : (int32_t)j->size - 16; /* holds first: it is < size */
      j->win16_at[k][w] = (int16_t)at;
      for (int32_t l = 0; l < lanes; ++l)
        if ((left >> l & 1u) && t[l] - at < 16) {
          j->win16_idx[k][w][l] = (uint8_t)(t[l] - at);
          left &= ~(1u << l);
        }
    }
    j->nwin16[k] = (uint8_t)w;
  }
  return 1;
}

/* Whether p is a gather refcg_gather_job runs (refcg.h: refcg_copy): j filled if so. */
static int refcg_gather_setup(refcg_gather_job* j, const refcg_copy_params* p, const void* input, void* output,
                              int by16) {
  const int32_t last = p->ndim - 1;
  if (p->ndim < 1 || p->ndim > REFCG_COPY_MAX_DIMS || refcg_copy_unchanged(p) != 1 || !p->take[last] ||
      p->in_stride[last] != 1 || p->pad_before[last] != 0 || p->out_shape[last] < 1 ||
      p->out_shape[last] > REFCG_GATHER_MAX || p->in_shape[last] < 1 || p->in_shape[last] > REFCG_GATHER_MAX)
    return 0;
  j->rows = 1;
  for (int32_t k = 0; k < last; ++k) { /* outer axes: every row inside the input, no table */
    if (p->take[k] || p->pad_before[k] || p->out_shape[k] > p->in_shape[k]) return 0;
    j->rows *= p->out_shape[k];
  }
  j->p = p;
  j->in = (const uint8_t*)input;
  j->out = (uint8_t*)output;
  j->n = p->out_shape[last];
  j->size = p->in_shape[last];
  for (int64_t i = 0; i < j->n; ++i)
    if (p->take[last][i] < 0 || p->take[last][i] >= j->size) return 0; /* reads padding: the reference */
  j->by16 = by16 && refcg_gather_plan16(j, p->take[last]);
  if (by16) return j->rows > 0; /* the windows or bytes: no permute tables (VBMI's, below) */
  memset(j->idx, 0, sizeof(j->idx));
  memset(j->window, 0, sizeof(j->window));
  for (int64_t i = 0; i < j->n; ++i) {
    const int32_t t = p->take[last][i];
    j->idx[i] = (uint8_t)(t % 128);
    j->window[i / 64][t / 128] |= (uint64_t)1 << (i % 64);
  }
  return j->rows > 0;
}

REFCG_API int refcg_copy(const refcg_copy_params* p, const void* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  refcg_gather_job j;
  if (!isa->gather || !refcg_gather_setup(&j, p, input, output, isa->gather_by16 && isa->gather_by16()))
    return refcg_copy_ref(p, input, output);
  refcg_parallel(isa->gather, &j, (j.rows + REFCG_GATHER_ROWS - 1) / REFCG_GATHER_ROWS);
  return 0;
}

REFCG_API int refcg_lut_binary(const refcg_lut_binary_params* p, const uint8_t* table, const void* input,
                               void* output) {
  return refcg_lut_binary_with(p, table, input, output, refcg_binary, refcg_lut);
}

REFCG_API int refcg_quantize(const refcg_quantize_params* p, const float* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  const int to_bytes = p->quant_dtype == REFCG_S8 || p->quant_dtype == REFCG_U8;
  if (!isa->quantize || !to_bytes || p->outer < 0 || p->channels < 1 || p->inner < 8)
    return refcg_quantize_ref(p, input, output); /* per-channel NHWC (inner 1) has no run to vectorize */
  const refcg_quant_job j = {p, input, (uint8_t*)output, (p->inner + REFCG_QUANT_CHUNK - 1) / REFCG_QUANT_CHUNK};
  refcg_parallel(isa->quantize, &j, p->outer * p->channels * j.chunks_per_row);
  return 0;
}


static void refcg_reduce_chunks(const void* ctx, int64_t t0, int64_t t1) {
  refcg_reduce_run_chunks((const refcg_reduce_job*)ctx, t0, t1, NULL); /* the baseline ISA's vectors */
}

REFCG_API int refcg_reduce(const refcg_reduce_params* p, const void* input, void* output) {
  if (p->reduce <= 0 || p->inner <= 0 || p->outer < 0 || p->in_dtype < REFCG_S8 || p->in_dtype > REFCG_S16)
    return refcg_reduce_ref(p, input, output);
  const refcg_reduce_job j = {p, input, output, (p->inner + REFCG_REDUCE_CHUNK - 1) / REFCG_REDUCE_CHUNK};
  const refcg_isa_config* isa = refcg_isa_current();
  refcg_parallel(isa->reduce ? isa->reduce : refcg_reduce_chunks, &j, p->outer * j.chunks);
  return 0;
}

REFCG_API int refcg_pool2d(const refcg_pool2d_params* p, const void* input, void* output) {
  const refcg_isa_config* isa = refcg_isa_current();
  const int out_ok = p->out_dtype == p->in_dtype || (p->is_avg && p->out_dtype == REFCG_S32);
  if (!isa->pool || !refcg_is_8bit(p->in_dtype) || !out_ok || p->stride_h <= 0 || p->stride_w <= 0 ||
      p->dilation_h <= 0 || p->dilation_w <= 0 || (int64_t)p->kernel_h * p->kernel_w > 65536)
    return refcg_pool2d_ref(p, input, output);
  refcg_pool_job j;
  memset(&j, 0, sizeof(j));
  j.p = p;
  j.in = (const uint8_t*)input;
  j.out = output;
  j.flip = p->in_dtype == REFCG_S8 ? 0x80 : 0;
  if (p->in_stride[3] == 1) { /* channels last in (the layout networks are planned in) */
    j.nhwc = 1;
    refcg_parallel(isa->pool, &j, (int64_t)p->batch * p->out_h);
    return 0;
  }
  const int32_t phase_w = p->out_w + (p->kernel_w - 1) * p->dilation_w / p->stride_w + 1;
  const int64_t reach = (int64_t)p->stride_w * phase_w, pitch = reach > p->pad_left + p->in_w ? reach : p->pad_left + p->in_w;
  if (p->in_stride[2] != 1 || p->out_stride[2] != 1 || p->out_w > REFCG_POOL_MAX_W || pitch > REFCG_DWP_ROW)
    return refcg_pool2d_ref(p, input, output);
  j.pitch = (int32_t)pitch;
  j.phase_w = phase_w;
  j.pad = p->is_avg ? j.flip : 0; /* avg: the value 0; max: the dtype minimum */
  refcg_parallel(isa->pool, &j, (int64_t)p->batch * p->channels);
  return 0;
}
