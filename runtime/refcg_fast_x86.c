/*
 * x86 variants: AVX-512 VNNI (vpdpbusd zmm), AVX-VNNI (vpdpbusd ymm), AVX2 (vpmaddwd).
 *
 * Each section is compiled for its ISA with a target pragma, so no user flag is needed
 * and one library holds all of them; the dispatcher (refcg_fast.c) calls a section only
 * on a CPU that supports it. Inputs are in the uint8 domain. vpmaddubsw is not used: it
 * saturates int16 on full-range data. AVX2 zero-extends the inputs and sign-extends the
 * weights to int16 and uses vpmaddwd, whose pair sums are exact in int32.
 * The micro-kernels keep MR rows x several 16-channel blocks in independent accumulators.
 */
#if defined(__x86_64__) || defined(__i386__)
/* GCC 12's AVX-512 headers self-initialise "undefined" vectors (GCC PR 105593): silence
 * that false positive for the header only, so -Wall -Wextra -Werror builds stay clean. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#define REFCG_HAVE_X86 1

REFCG_INLINE int32_t refcg_load_i32(const uint8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* ================= AVX2 (also used by the AVX-VNNI section for its epilogue) ================= */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

/* Arithmetic 64-bit right shift by per-lane counts (AVX2 has only the logical one). */
REFCG_INLINE __m256i refcg_srav64_avx2(__m256i v, __m256i t) {
  const __m256i b = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)0x8000000000000000ULL), t);
  return _mm256_sub_epi64(_mm256_xor_si256(_mm256_srlv_epi64(v, t), b), b);
}

/* int64 UPWARD fixed-point multiply of 8 lanes, shifts in [-31, 0] (refcg_fpm_upward). */
REFCG_INLINE __m256i refcg_fpm_avx2(__m256i x, __m256i m, __m256i s) {
  const __m256i t = _mm256_sub_epi32(_mm256_set1_epi32(31), s);
  const __m256i lo = _mm256_set1_epi64x(0xffffffffLL), one = _mm256_set1_epi64x(1);
  const __m256i te = _mm256_and_si256(t, lo), to = _mm256_srli_epi64(t, 32);
  __m256i pe = _mm256_mul_epi32(x, m);
  __m256i po = _mm256_mul_epi32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(m, 32));
  pe = _mm256_add_epi64(pe, _mm256_sllv_epi64(one, _mm256_sub_epi64(te, one)));
  po = _mm256_add_epi64(po, _mm256_sllv_epi64(one, _mm256_sub_epi64(to, one)));
  pe = refcg_srav64_avx2(pe, te);
  po = refcg_srav64_avx2(po, to);
  return _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* Requantize 8 channels starting at c (n channels valid) into clamped int32. */
REFCG_INLINE __m256i refcg_rq_avx2(const refcg_requant* rq, __m256i acc, int32_t c, int32_t n) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i v;
  if (rq->mode == REFCG_RQ_INT64_UPWARD) {
    v = _mm256_sub_epi32(acc, _mm256_set1_epi32(rq->input_zp));
    if (!rq->identity) {
      const __m256i m = rq->per_channel ? _mm256_maskload_epi32(rq->multiplier + c, mask)
                                        : _mm256_set1_epi32(rq->multiplier[0]);
      const __m256i s = rq->per_channel ? _mm256_maskload_epi32(rq->shift + c, mask) : _mm256_set1_epi32(rq->shift[0]);
      v = refcg_fpm_avx2(v, m, s);
    }
    v = _mm256_add_epi32(v, _mm256_set1_epi32(rq->output_zp));
  } else {
    /* separate multiply and add (no FMA), as TVM computes it */
    __m256 f = _mm256_sub_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps((float)rq->input_zp));
    if (!rq->identity) {
      const __m256 s = rq->per_channel ? _mm256_castsi256_ps(_mm256_maskload_epi32((const int*)rq->scale_f32 + c, mask))
                                       : _mm256_set1_ps(rq->scale_f32[0]);
      f = _mm256_mul_ps(f, s);
    }
    f = _mm256_add_ps(f, _mm256_set1_ps((float)rq->output_zp));
    if (rq->mode == REFCG_RQ_FLOAT32_UPWARD) {
      f = _mm256_floor_ps(_mm256_add_ps(f, _mm256_set1_ps(0.5f)));
    } else { /* roundf: half away from zero; f - trunc(f) is exact */
      const __m256 t = _mm256_round_ps(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 sign = _mm256_and_ps(f, _mm256_set1_ps(-0.0f));
      const __m256 half = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(f, t)),
                                        _mm256_set1_ps(0.5f), _CMP_GE_OQ);
      f = _mm256_add_ps(t, _mm256_and_ps(half, _mm256_or_ps(_mm256_set1_ps(1.0f), sign)));
    }
    v = _mm256_cvttps_epi32(f); /* out of range -> INT32_MIN, like cvttss2si */
  }
  return _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(rq->out_max)), _mm256_set1_epi32(rq->out_min));
}

REFCG_INLINE void refcg_epi_avx2(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid, int64_t off) {
  if (!e->rq_vector) {
    refcg_epi_scalar(e, acc, c0, nvalid, off);
    return;
  }
  int32_t v[16];
  for (int32_t h = 0; h < nvalid; h += 8) {
    __m256i a = _mm256_add_epi32(_mm256_loadu_si256((const __m256i*)(acc + h)),
                                 _mm256_loadu_si256((const __m256i*)(e->corr + c0 + h)));
    _mm256_storeu_si256((__m256i*)(v + h), refcg_rq_avx2(e->rq, a, c0 + h, nvalid - h));
  }
  refcg_epi_store(e, v, c0, nvalid, off);
}

/* Sum of the two pair-sum lanes per channel: groups g0 (ch 0-3) and g1 (ch 4-7) -> ch 0-7. */
REFCG_INLINE __m256i refcg_hsum_pairs_avx2(__m256i g0, __m256i g1) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(g0, g1), 0xD8);
}

/* MR rows x 16 channels (block nb). Weights: 16 bytes = 4 channels x 4 k, sign-extended to
 * int16; input: 4 bytes zero-extended and broadcast, so vpmaddwd gives per channel two
 * exact pair sums. */
REFCG_INLINE void refcg_tile_avx2(const refcg_gemm_job* j, int32_t i0, int32_t nb,
                                                                   const int MR) {
  const uint8_t* arow[2];
  const int32_t rows = refcg_tile_rows(j, i0, MR, arow);
  __m256i acc[2][4];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < 4; ++g) acc[r][g] = _mm256_setzero_si256();
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      __m256i w[4];
      for (int g = 0; g < 4; ++g) w[g] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wp + 16 * g)));
      for (int r = 0; r < MR; ++r) {
        const __m256i a = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(refcg_load_i32(arow[r] + so + k))));
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm256_add_epi32(acc[r][g], _mm256_madd_epi16(a, w[g]));
      }
    }
  }
  const int32_t c0 = nb * 16, nvalid = j->n - c0 < 16 ? j->n - c0 : 16;
  for (int r = 0; r < rows; ++r) {
    int32_t t[16];
    _mm256_storeu_si256((__m256i*)t, refcg_hsum_pairs_avx2(acc[r][0], acc[r][1]));
    _mm256_storeu_si256((__m256i*)(t + 8), refcg_hsum_pairs_avx2(acc[r][2], acc[r][3]));
    refcg_epi_avx2(&j->epi, t, c0, nvalid, refcg_job_out(j, i0 + r));
  }
}

REFCG_DEFINE_TILES(refcg_tiles_avx2, refcg_tile_avx2, 2)

/* uint8 inputs zero-extended to int32 lanes, w' sign-extended: vpmaddwd of a lane is x * w'. */
REFCG_INLINE void refcg_dw16_avx2(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int32_t kh = 0; kh < j->kh; ++kh) {
    for (int32_t kw = 0; kw < j->kw; ++kw) {
      const uint8_t* x = base + ((int64_t)kh * j->dh * j->wp + (int64_t)kw * j->dw) * j->cp + c0;
      const int16_t* w = j->w + (int64_t)(kh * j->kw + kw) * j->cp + c0;
      const __m128i xv = _mm_loadu_si128((const __m128i*)x), wv = _mm_loadu_si128((const __m128i*)w);
      const __m128i wv1 = _mm_loadu_si128((const __m128i*)(w + 8));
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepu8_epi32(xv), _mm256_cvtepi16_epi32(wv)));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepu8_epi32(_mm_srli_si128(xv, 8)), _mm256_cvtepi16_epi32(wv1)));
    }
  }
  _mm256_storeu_si256((__m256i*)acc, a0);
  _mm256_storeu_si256((__m256i*)(acc + 8), a1);
}

static void refcg_dw_avx2(const void* ctx, int64_t r0, int64_t r1) {
  refcg_dw_rows((const refcg_dw_job*)ctx, r0, r1, refcg_dw16_avx2, refcg_epi_avx2);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ================= AVX-VNNI: vpdpbusd on ymm, 6 rows x 16 channels ================= */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,avxvnni")
#endif

REFCG_INLINE void refcg_tile_avxvnni(const refcg_gemm_job* j, int32_t i0, int32_t nb,
                                                                      const int MR) {
  const uint8_t* arow[6];
  const int32_t rows = refcg_tile_rows(j, i0, MR, arow);
  __m256i acc[6][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)wp), w1 = _mm256_loadu_si256((const __m256i*)(wp + 32));
      for (int r = 0; r < MR; ++r) {
        const __m256i a = _mm256_set1_epi32(refcg_load_i32(arow[r] + so + k));
        acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], a, w0);
        acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], a, w1);
      }
    }
  }
  const int32_t c0 = nb * 16, nvalid = j->n - c0 < 16 ? j->n - c0 : 16;
  for (int r = 0; r < rows; ++r) {
    int32_t t[16];
    _mm256_storeu_si256((__m256i*)t, acc[r][0]);
    _mm256_storeu_si256((__m256i*)(t + 8), acc[r][1]);
    refcg_epi_avx2(&j->epi, t, c0, nvalid, refcg_job_out(j, i0 + r));
  }
}

REFCG_DEFINE_TILES(refcg_tiles_avxvnni, refcg_tile_avxvnni, 6)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ================= AVX-512 VNNI: vpdpbusd on zmm, MR rows x NV*16 channels ================= */
#ifndef REFCG_X512_MR
#define REFCG_X512_MR 6 /* MR * NV accumulators + NV weights + 1 broadcast <= 32 zmm */
#define REFCG_X512_NV 4
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

REFCG_INLINE __m512i refcg_fpm_avx512(__m512i x, __m512i m, __m512i s) {
  const __m512i t = _mm512_sub_epi32(_mm512_set1_epi32(31), s);
  const __m512i lo = _mm512_set1_epi64(0xffffffffLL), one = _mm512_set1_epi64(1);
  const __m512i te = _mm512_and_si512(t, lo), to = _mm512_srli_epi64(t, 32);
  __m512i pe = _mm512_mul_epi32(x, m);
  __m512i po = _mm512_mul_epi32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(m, 32));
  pe = _mm512_srav_epi64(_mm512_add_epi64(pe, _mm512_sllv_epi64(one, _mm512_sub_epi64(te, one))), te);
  po = _mm512_srav_epi64(_mm512_add_epi64(po, _mm512_sllv_epi64(one, _mm512_sub_epi64(to, one))), to);
  return _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

REFCG_INLINE __m512i refcg_rq_avx512(const refcg_requant* rq, __m512i acc, int32_t c, __mmask16 mask) {
  __m512i v;
  if (rq->mode == REFCG_RQ_INT64_UPWARD) {
    v = _mm512_sub_epi32(acc, _mm512_set1_epi32(rq->input_zp));
    if (!rq->identity) {
      const __m512i m = rq->per_channel ? _mm512_maskz_loadu_epi32(mask, rq->multiplier + c)
                                        : _mm512_set1_epi32(rq->multiplier[0]);
      const __m512i s = rq->per_channel ? _mm512_maskz_loadu_epi32(mask, rq->shift + c) : _mm512_set1_epi32(rq->shift[0]);
      v = refcg_fpm_avx512(v, m, s);
    }
    v = _mm512_add_epi32(v, _mm512_set1_epi32(rq->output_zp));
  } else {
    /* explicit-rounding forms: never contracted into an FMA */
    __m512 f = _mm512_sub_round_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps((float)rq->input_zp), _MM_FROUND_CUR_DIRECTION);
    if (!rq->identity) {
      const __m512 s = rq->per_channel ? _mm512_maskz_loadu_ps(mask, rq->scale_f32 + c) : _mm512_set1_ps(rq->scale_f32[0]);
      f = _mm512_mul_round_ps(f, s, _MM_FROUND_CUR_DIRECTION);
    }
    f = _mm512_add_round_ps(f, _mm512_set1_ps((float)rq->output_zp), _MM_FROUND_CUR_DIRECTION);
    if (rq->mode == REFCG_RQ_FLOAT32_UPWARD) {
      f = _mm512_roundscale_ps(_mm512_add_round_ps(f, _mm512_set1_ps(0.5f), _MM_FROUND_CUR_DIRECTION), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    } else {
      const __m512 t = _mm512_roundscale_ps(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask16 half = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_round_ps(f, t, _MM_FROUND_CUR_DIRECTION)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
      const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)),
          _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32((int)0x80000000u))));
      f = _mm512_mask_add_round_ps(t, half, t, step, _MM_FROUND_CUR_DIRECTION);
    }
    v = _mm512_cvttps_epi32(f);
  }
  return _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(rq->out_max)), _mm512_set1_epi32(rq->out_min));
}

REFCG_INLINE void refcg_epi_avx512(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid, int64_t off) {
  if (!e->rq_vector) {
    refcg_epi_scalar(e, acc, c0, nvalid, off);
    return;
  }
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  const __m512i a = _mm512_add_epi32(_mm512_loadu_si512(acc), _mm512_maskz_loadu_epi32(mask, e->corr + c0));
  const __m512i v = refcg_rq_avx512(e->rq, a, c0, mask);
  if (e->o_c == 1 && e->out_dtype != REFCG_S32) {
    _mm512_mask_cvtepi32_storeu_epi8((uint8_t*)e->out + off + c0, mask, v); /* values are in range */
  } else if (e->o_c == 1) {
    _mm512_mask_storeu_epi32((int32_t*)e->out + off + c0, mask, v);
  } else {
    int32_t t[16];
    _mm512_storeu_si512(t, v);
    refcg_epi_store(e, t, c0, nvalid, off);
  }
}

/* MR rows x NV blocks of 16 channels starting at block nb. */
REFCG_INLINE void refcg_tile_avx512(const refcg_gemm_job* j, int32_t i0, int32_t nb,
                                                                     const int MR, const int NV) {
  const uint8_t* arow[REFCG_X512_MR];
  const int32_t rows = refcg_tile_rows(j, i0, MR, arow);
  __m512i acc[REFCG_X512_MR][REFCG_X512_NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
  const int64_t bstride = (int64_t)j->kp * 16;
  const int8_t* wp = j->w + nb * bstride;
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      __m512i w[4];
      for (int v = 0; v < NV; ++v) w[v] = _mm512_loadu_si512(wp + v * bstride);
      for (int r = 0; r < MR; ++r) {
        const __m512i a = _mm512_set1_epi32(refcg_load_i32(arow[r] + so + k));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], a, w[v]);
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int32_t c0 = (nb + v) * 16, nvalid = j->n - c0 < 16 ? j->n - c0 : 16;
    for (int r = 0; r < rows; ++r) {
      int32_t t[16];
      _mm512_storeu_si512(t, acc[r][v]);
      refcg_epi_avx512(&j->epi, t, c0, nvalid, refcg_job_out(j, i0 + r));
    }
  }
}

/* Tiles: (row block of 6) x (group of up to 4 channel blocks), channel groups fastest. */
static void refcg_tiles_avx512vnni(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;
  const int32_t nblocks = (j->n + 15) / 16, ngroups = (nblocks + REFCG_X512_NV - 1) / REFCG_X512_NV;
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t i0 = (int32_t)(t / ngroups) * REFCG_X512_MR, nb = (int32_t)(t % ngroups) * REFCG_X512_NV;
    const int32_t nv = nblocks - nb < REFCG_X512_NV ? nblocks - nb : REFCG_X512_NV;
    if (j->m - i0 == 1) {
      for (int32_t b = nb; b < nb + nv; ++b) refcg_tile_avx512(j, i0, b, 1, 1);
    } else if (nv == REFCG_X512_NV) {
      refcg_tile_avx512(j, i0, nb, REFCG_X512_MR, REFCG_X512_NV);
    } else {
      for (int32_t b = nb; b < nb + nv; ++b) refcg_tile_avx512(j, i0, b, REFCG_X512_MR, 1);
    }
  }
}

/* vpdpwssd on lanes holding (x, 0) and (w', sign): x * w' per channel, exact. */
REFCG_INLINE void refcg_dw16_avx512(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  __m512i a = _mm512_setzero_si512();
  for (int32_t kh = 0; kh < j->kh; ++kh) {
    for (int32_t kw = 0; kw < j->kw; ++kw) {
      const uint8_t* x = base + ((int64_t)kh * j->dh * j->wp + (int64_t)kw * j->dw) * j->cp + c0;
      const int16_t* w = j->w + (int64_t)(kh * j->kw + kw) * j->cp + c0;
      a = _mm512_dpwssd_epi32(a, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)x)),
                              _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)w)));
    }
  }
  _mm512_storeu_si512(acc, a);
}

/* 16 channels x PX pixels along ow: PX independent vpdpwssd chains, weights widened once. */
REFCG_INLINE void refcg_dw_px_avx512(const refcg_dw_job* j, const uint8_t* base, int64_t pstride, const int32_t* wide,
                                     const int64_t* toff, int32_t taps, int32_t c0, int64_t out_off, const int PX) {
  __m512i acc[4];
  for (int q = 0; q < PX; ++q) acc[q] = _mm512_setzero_si512();
  for (int32_t t = 0; t < taps; ++t) {
    const __m512i w = _mm512_load_si512(wide + 16 * t);
    for (int q = 0; q < PX; ++q)
      acc[q] = _mm512_dpwssd_epi32(acc[q], _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(base + q * pstride + toff[t]))), w);
  }
  const int32_t nvalid = j->c - c0 < 16 ? j->c - c0 : 16;
  for (int q = 0; q < PX; ++q) {
    int32_t t[16];
    _mm512_storeu_si512(t, acc[q]);
    refcg_epi_avx512(&j->epi, t, c0, nvalid, out_off + q * j->o_w);
  }
}

static void refcg_dw_avx512(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_dw_job* j = (const refcg_dw_job*)ctx;
  const int32_t taps = j->kh * j->kw;
  if (taps > 32) {
    refcg_dw_rows(j, r0, r1, refcg_dw16_avx512, refcg_epi_avx512);
    return;
  }
  int64_t toff[32];
  int32_t wide[32 * 16] __attribute__((aligned(64)));
  for (int32_t t = 0; t < taps; ++t) toff[t] = ((int64_t)(t / j->kw) * j->dh * j->wp + (int64_t)(t % j->kw) * j->dw) * j->cp;
  const int64_t pstride = (int64_t)j->sw * j->cp;
  for (int32_t c0 = 0; c0 < j->c; c0 += 16) {
    for (int32_t t = 0; t < taps; ++t)
      _mm512_store_si512(wide + 16 * t, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)(j->w + (int64_t)t * j->cp + c0))));
    for (int64_t oh = r0; oh < r1; ++oh) {
      const uint8_t* row = j->a + (int64_t)oh * j->sh * j->wp * j->cp + c0;
      int32_t ow = 0;
      for (; ow + 4 <= j->out_w; ow += 4)
        refcg_dw_px_avx512(j, row + ow * pstride, pstride, wide, toff, taps, c0, oh * j->o_h + ow * j->o_w, 4);
      for (; ow < j->out_w; ++ow)
        refcg_dw_px_avx512(j, row + ow * pstride, pstride, wide, toff, taps, c0, oh * j->o_h + ow * j->o_w, 1);
    }
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

REFCG_INLINE int refcg_cpu_avx2(void) { return __builtin_cpu_supports("avx2"); }
REFCG_INLINE int refcg_cpu_avxvnni(void) { return refcg_cpu_avx2() && __builtin_cpu_supports("avxvnni"); }
REFCG_INLINE int refcg_cpu_avx512vnni(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

#endif /* x86 */
