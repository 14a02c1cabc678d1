/*
 * aarch64 variants: NEON (smull/sadalp, baseline on every aarch64 CPU) and NEON dot
 * product (sdot, compiled with a target pragma and used only when HWCAP_ASIMDDP is set).
 * Inputs are in the int8 domain; s8 x s8 products fit int16 exactly (|p| <= 16384), so
 * smull + sadalp never saturates. Epilogue: 16 channels in NEON lanes for the fixed-point modes
 * (refcg_epi_neon), else the scalar requantize per element.
 */
#include "refcg_fast_internal.h"

#if defined(REFCG_HAVE_ARM)
#include <arm_neon.h>
#include <sys/auxv.h>
#include <asm/hwcap.h>

/* Weights: 16 bytes = 4 channels x 4 k; input: its 4 bytes repeated. */
REFCG_INLINE int8x16_t refcg_dup4_neon(const uint8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* 1: rq is int64 UPWARD, 2: TVM's NEON mode (not the identity), both refcg_fpm_neon's; 0: neither. */
REFCG_INLINE int refcg_fpm_neon_mode(const refcg_requant* rq) {
  return rq->identity ? 0 : rq->mode == REFCG_RQ_INT64_UPWARD ? 1 : rq->mode == REFCG_RQ_INT64_UPWARD_NEON ? 2 : 0;
}

/* x requantized before the output zero point and clamp in int64 UPWARD (up) or TVM's NEON mode, with
 * multipliers mv and shifts sv (-31..31) per lane (refcg_epi_neon says how). */
REFCG_INLINE int32x4_t refcg_fpm_neon(int32x4_t x, int32x4_t mv, int32x4_t sv, int up) {
  const int32x4_t zero = vdupq_n_s32(0);
  const int32x4_t ls = vmaxq_s32(sv, zero), rs = vminq_s32(sv, zero); /* rs: minus the right shift */
  if (!up) return vrshlq_s32(vqrdmulhq_s32(vshlq_s32(x, ls), mv), rs);
  const int32x4_t t = vsubq_s32(vdupq_n_s32(31), rs), below = vsubq_s32(t, vdupq_n_s32(1));
  int64x2_t p[2] = {vmull_s32(vget_low_s32(x), vget_low_s32(mv)), vmull_high_s32(x, mv)};
  for (int k = 0; k < 2; ++k) {
    const int64x2_t lsk = vmovl_s32(k ? vget_high_s32(ls) : vget_low_s32(ls));
    const int64x2_t tk = vmovl_s32(k ? vget_high_s32(t) : vget_low_s32(t));
    const int64x2_t rk = vshlq_s64(vdupq_n_s64(1), vmovl_s32(k ? vget_high_s32(below) : vget_low_s32(below)));
    p[k] = vshlq_s64(vaddq_s64(vshlq_s64(p[k], lsk), rk), vnegq_s64(tk));
  }
  return vcombine_s32(vmovn_s64(p[0]), vmovn_s64(p[1]));
}

/* The epilogue of 16 channels from c0 (refcg_epi_scalar's contract) in NEON lanes for the two
 * fixed-point modes of aarch64 targets with 8-bit outputs and shifts in -31..31 (a channel tail's
 * lanes computed, not stored), else the scalar one.
 * int64 UPWARD (TVM's llvm lowering of tir.q_multiply_shift): x * m widened (smull), shifted left by
 * max(s, 0) (the scalar's (x << ls) * m, equal mod 2^64), the rounding bit added, shifted right by
 * 31 - min(s, 0) and truncated to int32 as the scalar is; int64 UPWARD_NEON (TVM's own int32x4 lowering):
 * x << max(s, 0), sqrdmulh, a rounding right shift by -min(s, 0) (srshl), as it is written. */
REFCG_INLINE void refcg_epi_neon(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid, int64_t off) {
  const refcg_requant* rq = e->rq;
  const int mode = refcg_fpm_neon_mode(rq), up = mode == 1;
  int32_t m[16] = {0}, sh[16] = {0}, corr[16] = {0}; /* a tail's lanes past nvalid: zeros, not stored */
  int ok = mode && refcg_is_8bit(e->out_dtype);
  for (int l = 0; l < nvalid && ok; ++l) {
    const int32_t c = rq->per_channel ? c0 + l : 0;
    m[l] = rq->multiplier[c];
    sh[l] = rq->shift[c];
    corr[l] = e->corr[c0 + l];
    ok = sh[l] >= -31 && sh[l] <= 31;
  }
  if (!ok) {
    refcg_epi_scalar(e, acc, c0, nvalid, off);
    return;
  }
  const int32x4_t izp = vdupq_n_s32(rq->input_zp), ozp = vdupq_n_s32(rq->output_zp);
  const int32x4_t lo = vdupq_n_s32(rq->out_min), hi = vdupq_n_s32(rq->out_max);
  int32x4_t v[4];
  for (int g = 0; g < 4; ++g) {
    const int32x4_t x = vsubq_s32(vaddq_s32(vld1q_s32(acc + 4 * g), vld1q_s32(corr + 4 * g)), izp);
    const int32x4_t mv = vld1q_s32(m + 4 * g), sv = vld1q_s32(sh + 4 * g);
    v[g] = vminq_s32(vmaxq_s32(vaddq_s32(refcg_fpm_neon(x, mv, sv, up), ozp), lo), hi);
  }
  const int8x16_t bytes = vcombine_s8(vmovn_s16(vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]))),
                                      vmovn_s16(vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]))));
  int8_t* o = (int8_t*)e->out + off + (int64_t)c0 * e->o_c;
  if (e->o_c == 1 && nvalid == 16) {
    vst1q_s8(o, bytes);
  } else {
    int8_t b[16];
    vst1q_s8(b, bytes);
    for (int l = 0; l < nvalid; ++l) o[l * e->o_c] = b[l];
  }
}

/* MR = 2 rows x 16 channels; per channel two pair-sum lanes, folded by vpaddq at the end. */
REFCG_INLINE void refcg_tile_neon(const refcg_gemm_job* j, int32_t i0, int32_t nb,
                                                                   const int MR) {
  const uint8_t* arow[2];
  int64_t out_off[2];
  const int32_t rows = refcg_tile_rows(j, i0, MR, arow, out_off);
  int32x4_t acc[2][8];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < 8; ++g) acc[r][g] = vdupq_n_s32(0);
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      int8x16_t w[4];
      for (int g = 0; g < 4; ++g) w[g] = vld1q_s8(wp + 16 * g);
      for (int r = 0; r < MR; ++r) {
        const int8x16_t a = refcg_dup4_neon(arow[r] + so + k);
        for (int g = 0; g < 4; ++g) {
          acc[r][2 * g] = vpadalq_s16(acc[r][2 * g], vmull_s8(vget_low_s8(a), vget_low_s8(w[g])));
          acc[r][2 * g + 1] = vpadalq_s16(acc[r][2 * g + 1], vmull_high_s8(a, w[g]));
        }
      }
    }
  }
  const int32_t c0 = nb * 16, nvalid = j->n - c0 < 16 ? j->n - c0 : 16;
  for (int r = 0; r < rows; ++r) {
    int32_t t[16];
    for (int g = 0; g < 4; ++g) vst1q_s32(t + 4 * g, vpaddq_s32(acc[r][2 * g], acc[r][2 * g + 1]));
    refcg_epi_neon(&j->epi, t, c0, nvalid, out_off[r]);
  }
}

REFCG_DEFINE_TILES(refcg_tiles_neon, refcg_tile_neon, 2)

/* int8 inputs widened to int16, multiply-accumulated into int32 lanes (smlal): exact. */
REFCG_INLINE void refcg_dw16_neon(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  int32x4_t a[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int32_t kh = 0; kh < j->kh; ++kh) {
    for (int32_t kw = 0; kw < j->kw; ++kw) {
      const uint8_t* x = base + ((int64_t)kh * j->dh * j->wp + (int64_t)kw * j->dw) * j->cp + c0;
      const int16_t* w = j->w + (int64_t)(kh * j->kw + kw) * j->cp + c0;
      const int8x16_t xv = vld1q_s8((const int8_t*)x);
      const int16x8_t lo = vmovl_s8(vget_low_s8(xv)), hi = vmovl_high_s8(xv);
      const int16x8_t w0 = vld1q_s16(w), w1 = vld1q_s16(w + 8);
      a[0] = vmlal_s16(a[0], vget_low_s16(lo), vget_low_s16(w0));
      a[1] = vmlal_high_s16(a[1], lo, w0);
      a[2] = vmlal_s16(a[2], vget_low_s16(hi), vget_low_s16(w1));
      a[3] = vmlal_high_s16(a[3], hi, w1);
    }
  }
  for (int g = 0; g < 4; ++g) vst1q_s32(acc + 4 * g, a[g]);
}

static void refcg_dw_neon(const void* ctx, int64_t r0, int64_t r1) {
  refcg_dw_rows((const refcg_dw_job*)ctx, r0, r1, refcg_dw16_neon, refcg_epi_neon);
}

/* ---- depthwise on channel planes (refcg_dwp_channels): vqtbl1q gathers the Q taps of 4 pixels
 * (bytes j * sw + q * dw of a 16-byte window) into their 32-bit lanes; the product of a lane with
 * its Q weights is sdot, or smull + sadalp on plain NEON (pair sums in lo and hi). ---- */
typedef struct {
  int32x4_t lo, hi;
} refcg_dwacc_neon;
typedef void (*refcg_dwp_mac_neon_fn)(refcg_dwacc_neon* a, int8x16_t x, int8x16_t w);
typedef int32x4_t (*refcg_dwp_sum_neon_fn)(const refcg_dwacc_neon* a);

REFCG_INLINE void refcg_dwp_expand_neon(const refcg_dwp_job* j, const uint8_t* row, int32_t* e) {
  const uint8x16_t ctl = vld1q_u8(j->ctl);
  const int32_t sw = j->p->stride_w, qdw = j->q * j->p->dilation_w, owp = j->owp;
  for (int32_t i = 0; i < j->g; ++i, row += qdw, e += owp)
    for (int32_t ow = 0; ow < owp; ow += 4) vst1q_u8((uint8_t*)(e + ow), vqtbl1q_u8(vld1q_u8(row + ow * sw), ctl));
}

REFCG_INLINE void refcg_dwp_mac_neon(refcg_dwacc_neon* a, int8x16_t x, int8x16_t w) {
  a->lo = vpadalq_s16(a->lo, vmull_s8(vget_low_s8(x), vget_low_s8(w)));
  a->hi = vpadalq_s16(a->hi, vmull_high_s8(x, w));
}

REFCG_INLINE int32x4_t refcg_dwp_sum_neon(const refcg_dwacc_neon* a) { return vpaddq_s32(a->lo, a->hi); }

/* Output rows [oh0, oh1), 16 pixels per step in 4 independent accumulators; scalar epilogue. */
REFCG_INLINE void refcg_dwp_rows_neon(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                      int32_t oh0, int32_t oh1, refcg_dwp_mac_neon_fn mac, refcg_dwp_sum_neon_fn sum) {
  const refcg_conv2d_params* p = j->p;
  const refcg_epi ep = j->epi;
  const int32_t kh = p->kernel_h, g = j->g, owp = j->owp, out_w = p->out_w;
  const int64_t lanes = (int64_t)g * owp, row_step = lanes * p->dilation_h;
  const int32x4_t corr = vdupq_n_s32(ep.corr[oc]);
  for (int32_t oh = oh0; oh < oh1; ++oh) {
    const int64_t off = oc * ep.o_c + oh * j->o_h;
    for (int32_t ow = 0; ow < out_w; ow += 16) {
      refcg_dwacc_neon acc[4];
      for (int b = 0; b < 4; ++b) acc[b].lo = acc[b].hi = vdupq_n_s32(0);
      const int32_t* er = e + (int64_t)(oh - oh0) * p->stride_h * lanes + ow;
      for (int32_t k = 0; k < kh; ++k, er += row_step)
        for (int32_t i = 0; i < g; ++i) {
          const int8x16_t w = vreinterpretq_s8_s32(vdupq_n_s32(words[k * g + i]));
          for (int b = 0; b < 4; ++b) mac(&acc[b], vld1q_s8((const int8_t*)(er + i * owp + 4 * b)), w);
        }
      int32_t t[16];
      for (int b = 0; b < 4; ++b) vst1q_s32(t + 4 * b, vaddq_s32(sum(&acc[b]), corr));
      const int32_t n = out_w - ow < 16 ? out_w - ow : 16;
      for (int32_t l = 0; l < n; ++l) refcg_store(ep.out, off + ow + l, ep.out_dtype, refcg_requantize_one(ep.rq, t[l], oc));
    }
  }
}

REFCG_INLINE void refcg_dwp_strip_neon(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                       int32_t oh0, int32_t oh1) {
  refcg_dwp_rows_neon(j, e, words, oc, oh0, oh1, refcg_dwp_mac_neon, refcg_dwp_sum_neon);
}

static void refcg_dwp_neon(const void* ctx, int64_t c0, int64_t c1) {
  refcg_dwp_channels((const refcg_dwp_job*)ctx, c0, c1, 8, refcg_dwp_expand_neon, refcg_dwp_strip_neon);
}

static void refcg_pool_neon(const void* ctx, int64_t q0, int64_t q1) {
  refcg_pool_run((const refcg_pool_job*)ctx, q0, q1); /* GCC vectorizes it with NEON */
}

static void refcg_reduce_neon(const void* ctx, int64_t t0, int64_t t1) {
  refcg_reduce_run_chunks((const refcg_reduce_job*)ctx, t0, t1, NULL); /* GCC vectorizes it with NEON */
}

/* refcg_gather_chunk_fn through tbl (index bytes past 15: zero). */
REFCG_INLINE void refcg_gather_chunk_neon(const refcg_gather_job* j, const uint8_t* in, int64_t k, uint8_t* dst) {
  uint8x16_t v = vdupq_n_u8(0);
  for (int32_t w = 0; w < j->nwin16[k]; ++w)
    v = vorrq_u8(v, vqtbl1q_u8(vld1q_u8(in + j->win16_at[k][w]), vld1q_u8(j->win16_idx[k][w])));
  vst1q_u8(dst, v);
}

static void refcg_gather_neon(const void* ctx, int64_t t0, int64_t t1) {
  refcg_gather_tasks(ctx, t0, t1, refcg_gather_chunk_neon);
}

/* ---- qnn.add / subtract / mul rows (no vector binary kernels here): add and subtract
 * through each operand's requantize tabulated over its 256 byte values (refcg_requantize_one, so
 * exact in every mode; 512 calls per task range where the reference made two per element), then the
 * sum and clamp per element; mul element by element as the reference, without its odometer ---- */
typedef struct {
  int32_t qa[256], qb[256]; /* an operand's requantize by its byte read as uint8 */
} refcg_bin_tables;

REFCG_INLINE void refcg_bin_table_row(const refcg_bin_job* j, const void* ctx, int64_t ia, int64_t ib, int64_t io,
                                      int64_t n) {
  const refcg_binary_params* p = j->p;
  const refcg_bin_tables* t = (const refcg_bin_tables*)ctx;
  const int64_t sa = j->as[j->ndim - 1], sb = j->bs[j->ndim - 1];
  const uint8_t* a = j->a + ia;
  const uint8_t* b = j->b + ib;
  uint8_t* out = j->out + io;
  if (p->op == REFCG_BIN_MUL) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = (uint8_t)refcg_binary_one(p, refcg_load(a, i * sa, p->a_dtype), refcg_load(b, i * sb, p->b_dtype));
    return;
  }
  const uint32_t zp = (uint32_t)p->out_zp;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t qa = (uint32_t)t->qa[a[i * sa]], qb = (uint32_t)t->qb[b[i * sb]];
    out[i] = (uint8_t)refcg_clamp((int32_t)(p->op == REFCG_BIN_ADD ? qa + qb - zp : qa - qb + zp), p->out_min, p->out_max);
  }
}

/* Binary row tasks through the tabulated rows (8-bit operands and output: refcg_binary checks). */
static void refcg_bin_tabled(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_bin_job* j = (const refcg_bin_job*)ctx;
  const refcg_binary_params* p = j->p;
  refcg_bin_tables t;
  for (int32_t v = 0; v < 256 && p->op != REFCG_BIN_MUL; ++v) {
    t.qa[v] = refcg_requantize_one(&p->rq_a, p->a_dtype == REFCG_S8 ? (int8_t)v : v, 0);
    t.qb[v] = refcg_requantize_one(&p->rq_b, p->b_dtype == REFCG_S8 ? (int8_t)v : v, 0);
  }
  refcg_bin_rows(j, &t, t0, t1, refcg_bin_table_row);
}

/* 8 8-bit elements from x (stride 1) or x[0] in every lane (stride 0), as int16. */
REFCG_INLINE int16x8_t refcg_bin_load_neon(const uint8_t* x, int64_t stride, int32_t dtype) {
  if (stride == 0) return vdupq_n_s16((int16_t)refcg_load(x, 0, dtype));
  return dtype == REFCG_S8 ? vmovl_s8(vld1_s8((const int8_t*)x)) : vreinterpretq_s16_u16(vmovl_u8(vld1_u8(x)));
}

/* qnn.mul rows (squeeze-excite's x * gate), 8 elements per step: the product of the operands less
 * their zero points (within +-255), exact in int32, then rq_a in NEON lanes where it is int64 UPWARD
 * per tensor (refcg_fpm_neon; refcg_binary sends TVM's NEON mode to the reference); a row's last
 * elements as the reference. */
REFCG_INLINE void refcg_bin_mul_row_neon(const refcg_bin_job* j, const void* ctx, int64_t ia, int64_t ib, int64_t io,
                                         int64_t n) {
  const refcg_binary_params* p = j->p;
  const refcg_requant* rq = &p->rq_a;
  const int64_t sa = j->as[j->ndim - 1], sb = j->bs[j->ndim - 1];
  const uint8_t* a = j->a + ia;
  const uint8_t* b = j->b + ib;
  uint8_t* out = j->out + io;
  const int16x8_t azp = vdupq_n_s16((int16_t)p->a_zp), bzp = vdupq_n_s16((int16_t)p->b_zp);
  const int32x4_t izp = vdupq_n_s32(rq->input_zp), ozp = vdupq_n_s32(rq->output_zp);
  const int32x4_t lo = vdupq_n_s32(rq->out_min), hi = vdupq_n_s32(rq->out_max);
  const int32x4_t mv = vdupq_n_s32(rq->multiplier[0]), sv = vdupq_n_s32(rq->shift[0]);
  (void)ctx;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int16x8_t x = vsubq_s16(refcg_bin_load_neon(a + i * sa, sa, p->a_dtype), azp);
    const int16x8_t y = vsubq_s16(refcg_bin_load_neon(b + i * sb, sb, p->b_dtype), bzp);
    int32x4_t v[2] = {vmull_s16(vget_low_s16(x), vget_low_s16(y)), vmull_high_s16(x, y)};
    for (int k = 0; k < 2; ++k)
      v[k] = vminq_s32(vmaxq_s32(vaddq_s32(refcg_fpm_neon(vsubq_s32(v[k], izp), mv, sv, 1), ozp), lo), hi);
    vst1_s8((int8_t*)out + i, vmovn_s16(vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]))));
  }
  for (; i < n; ++i)
    out[i] = (uint8_t)refcg_binary_one(p, refcg_load(a, i * sa, p->a_dtype), refcg_load(b, i * sb, p->b_dtype));
}

/* binary_rows: mul in NEON lanes where rq_a allows (refcg_bin_mul_row_neon), the rest tabulated. */
static void refcg_bin_neon(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_bin_job* j = (const refcg_bin_job*)ctx;
  const refcg_requant* rq = &j->p->rq_a;
  if (j->p->op == REFCG_BIN_MUL && refcg_fpm_neon_mode(rq) == 1 && !rq->per_channel && rq->shift[0] >= -31 &&
      rq->shift[0] <= 31 && abs(j->p->a_zp) <= 255 && abs(j->p->b_zp) <= 255)
    refcg_bin_rows(j, NULL, t0, t1, refcg_bin_mul_row_neon);
  else
    refcg_bin_tabled(ctx, t0, t1);
}

/* qnn.quantize chunks (refcg_quant_job), 8 floats per step: refcg_quantize_one in lanes: the scale's
 * division or multiply, frinta (roundf: half away from zero), the zero point added, the clamp (fmax /
 * fmin keep a NaN, as the scalar comparisons do, and fcvtzs makes it 0 as the scalar cast does here). */
static void refcg_quant_neon(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_quant_job* j = (const refcg_quant_job*)ctx;
  const refcg_quantize_params* p = j->p;
  const int u8 = p->quant_dtype == REFCG_U8;
  const float32x4_t lo = vdupq_n_f32(u8 ? 0.0f : -128.0f), hi = vdupq_n_f32(u8 ? 255.0f : 127.0f);
  for (int64_t t = t0; t < t1; ++t) {
    int64_t i0, i1;
    const int64_t c = refcg_quant_chunk(j, t, &i0, &i1);
    const float32x4_t scale = vdupq_n_f32(p->scale[c]), zp = vdupq_n_f32((float)p->zero_point[c]);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
      int32x4_t q[2];
      for (int k = 0; k < 2; ++k) {
        const float32x4_t x = vld1q_f32(j->in + i + 4 * k);
        const float32x4_t y = vrndaq_f32(p->multiply ? vmulq_f32(x, scale) : vdivq_f32(x, scale));
        q[k] = vcvtq_s32_f32(vminq_f32(vmaxq_f32(vaddq_f32(y, zp), lo), hi));
      }
      vst1_s8((int8_t*)j->out + i, vmovn_s16(vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]))));
    }
    for (; i < i1; ++i)
      j->out[i] = (uint8_t)refcg_quantize_one(j->in[i], p->scale[c], p->multiply, p->zero_point[c], p->quant_dtype);
  }
}

/* Table lookups (refcg_lut_job), 16 bytes per step: tbl on the table's first 64 entries (0 past
 * them), then tbx on each next 64 with the index lowered by 64 (an index past a quarter leaves the
 * byte as it was). The reference's byte loop ran before: EfficientNet's swish, MobileNetV3's hardswish. */
static void refcg_lut_bytes_neon(const uint8_t* table, const uint8_t* in, uint8_t* out, int64_t n) {
  uint8x16x4_t q[4];
  for (int k = 0; k < 4; ++k) q[k] = vld1q_u8_x4(table + 64 * k);
  const uint8x16_t quarter = vdupq_n_u8(64);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint8x16_t x = vld1q_u8(in + i);
    uint8x16_t r = vqtbl4q_u8(q[0], x);
    for (int k = 1; k < 4; ++k) {
      x = vsubq_u8(x, quarter);
      r = vqtbx4q_u8(r, q[k], x);
    }
    vst1q_u8(out + i, r);
  }
  for (; i < n; ++i) out[i] = table[in[i]];
}

static void refcg_lut_neon(const void* ctx, int64_t t0, int64_t t1) {
  refcg_lut_tasks((const refcg_lut_job*)ctx, t0, t1, refcg_lut_bytes_neon);
}

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")

/* MR = 4 rows x 16 channels, one sdot per 4 channels x 4 k. */
REFCG_INLINE void refcg_tile_dotprod(const refcg_gemm_job* j, int32_t i0, int32_t nb,
                                                                      const int MR) {
  const uint8_t* arow[4];
  int64_t out_off[4];
  const int32_t rows = refcg_tile_rows(j, i0, MR, arow, out_off);
  int32x4_t acc[4][4];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < 4; ++g) acc[r][g] = vdupq_n_s32(0);
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      int8x16_t w[4];
      for (int g = 0; g < 4; ++g) w[g] = vld1q_s8(wp + 16 * g);
      for (int r = 0; r < MR; ++r) {
        const int8x16_t a = refcg_dup4_neon(arow[r] + so + k);
        for (int g = 0; g < 4; ++g) acc[r][g] = vdotq_s32(acc[r][g], w[g], a);
      }
    }
  }
  const int32_t c0 = nb * 16, nvalid = j->n - c0 < 16 ? j->n - c0 : 16;
  for (int r = 0; r < rows; ++r) {
    int32_t t[16];
    for (int g = 0; g < 4; ++g) vst1q_s32(t + 4 * g, acc[r][g]);
    refcg_epi_neon(&j->epi, t, c0, nvalid, out_off[r]);
  }
}

REFCG_DEFINE_TILES(refcg_tiles_dotprod, refcg_tile_dotprod, 4)

REFCG_INLINE void refcg_dwp_mac_dotprod(refcg_dwacc_neon* a, int8x16_t x, int8x16_t w) { a->lo = vdotq_s32(a->lo, x, w); }

REFCG_INLINE int32x4_t refcg_dwp_sum_dotprod(const refcg_dwacc_neon* a) { return a->lo; }

REFCG_INLINE void refcg_dwp_strip_dotprod(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                          int32_t oh0, int32_t oh1) {
  refcg_dwp_rows_neon(j, e, words, oc, oh0, oh1, refcg_dwp_mac_dotprod, refcg_dwp_sum_dotprod);
}

static void refcg_dwp_dotprod(const void* ctx, int64_t c0, int64_t c1) {
  refcg_dwp_channels((const refcg_dwp_job*)ctx, c0, c1, 8, refcg_dwp_expand_neon, refcg_dwp_strip_dotprod);
}

#pragma GCC pop_options

REFCG_INLINE int refcg_cpu_neon(void) { return 1; /* Advanced SIMD is mandatory on aarch64 */ }
REFCG_INLINE int refcg_cpu_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

const refcg_isa_config refcg_isa_dotprod = {
    .name = "dotprod",
    .features = "asimddp",
    .supported = refcg_cpu_dotprod,
    .signed_domain = 1,
    .gemm = {.mr = 4, .nv = 1, .tiles = refcg_tiles_dotprod, .planes = NULL, .flips = NULL, .wino = NULL,
             .reads_a16 = NULL},
    .dw = {.rows = refcg_dw_neon, .planes = refcg_dwp_dotprod, .pairs = 0, .quads = 0, .qmax = 4, .flips = 0},
    .binary_rows = refcg_bin_neon,
    .pool = refcg_pool_neon,
    .quantize = refcg_quant_neon,
    .requantize = NULL,
    .lut = refcg_lut_neon,
    .reduce = refcg_reduce_neon,
    .gather = refcg_gather_neon,
    .gather_by16 = refcg_cpu_neon,
};

const refcg_isa_config refcg_isa_neon = {
    .name = "neon",
    .features = "asimd",
    .supported = refcg_cpu_neon,
    .signed_domain = 1,
    .gemm = {.mr = 2, .nv = 1, .tiles = refcg_tiles_neon, .planes = NULL, .flips = NULL, .wino = NULL,
             .reads_a16 = NULL},
    .dw = {.rows = refcg_dw_neon, .planes = refcg_dwp_neon, .pairs = 0, .quads = 0, .qmax = 4, .flips = 0},
    .binary_rows = refcg_bin_neon,
    .pool = refcg_pool_neon,
    .quantize = refcg_quant_neon,
    .requantize = NULL,
    .lut = refcg_lut_neon,
    .reduce = refcg_reduce_neon,
    .gather = refcg_gather_neon,
    .gather_by16 = refcg_cpu_neon,
};

#endif /* REFCG_HAVE_ARM */
