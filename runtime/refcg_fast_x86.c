/*
 * x86 variants: AVX-512 VNNI (vpdpbusd zmm), AVX-VNNI (vpdpbusd ymm), AVX2 (vpmaddwd).
 *
 * Each section is compiled for its ISA with a target pragma, so no user flag is needed
 * and one library holds all of them; the dispatcher (refcg_fast.c) calls a section only
 * on a CPU that supports it. Inputs are in the uint8 domain. AVX2 runs vpmaddubsw (u8 x s8
 * pairs summed in int16, saturating) only on the 16-channel blocks the packer proved cannot
 * saturate (refcg_gemm_weights.pair_safe); other blocks zero-extend the inputs and sign-extend
 * the weights to int16 and use vpmaddwd, whose pair sums are exact in int32.
 * The micro-kernels keep MR rows x several 16-channel blocks in independent accumulators.
 * Each variant is one config (refcg_isa_config, at the end of this file).
 */
#include "refcg_fast_internal.h"

#if defined(REFCG_HAVE_X86)
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

REFCG_INLINE int32_t refcg_load_i32(const uint8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* The 4 bytes at p as a float: _mm_set1_ps of it is one broadcast load (vbroadcastss). */
REFCG_INLINE float refcg_load_f32(const uint8_t* p) {
  float v;
  memcpy(&v, p, 4);
  return v;
}

/* int32 lanes as GCC vectors, for the width-independent arithmetic of REFCG_FPM_PLAN. */
typedef int32_t refcg_v8si __attribute__((vector_size(32)));
typedef int32_t refcg_v16si __attribute__((vector_size(64)));

/* ================= AVX2 (also used by the AVX-VNNI section for its epilogue) ================= */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

/* Requantize constants of 8 lanes: channels c + l, l < n (lanes = 1) or channel c in every lane
 * (lanes = 0); nothing for identity. The mode's constants share storage (the union): int64 modes,
 * the multiplier (even lanes, odd lanes moved down) and REFCG_FPM_PLAN (rounding 2^kx as the even
 * and odd int64 halves, r; l1 and l2 only read when general); float modes, the scale. */
typedef struct {
  int32_t general; /* int64: TONEAREST, or some lane shifts left first (l1 nonzero) */
  union {
    struct {
      __m256i m_e, m_o, k_e, k_o, r, l1, l2;
    } q;
    __m256 f;
    __m256d d[2]; /* float64: lanes 0-3, 4-7 */
  } c;
} refcg_rqv_avx2;

/* Even and odd 32-bit lanes of v zero-extended to int64 (per-lane shift counts). */
REFCG_INLINE __m256i refcg_even64_avx2(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi64x(0xffffffffLL)); }
REFCG_INLINE __m256i refcg_odd64_avx2(__m256i v) { return _mm256_srli_epi64(v, 32); }


/* All-ones in lanes [0, n) of 8 (maskload / maskstore masks). */
REFCG_INLINE __m256i refcg_lanes_avx2(int32_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* refcg_fpm_fold_k on the even or odd int64 halves: k, r's and m's lanes in the even slots. */
REFCG_INLINE __m256i refcg_fold_k_avx2(__m256i k, __m256i r64, __m256i m, int32_t izp, int32_t ozp) {
  const __m256i o = _mm256_sllv_epi64(_mm256_set1_epi64x(ozp), _mm256_add_epi64(r64, _mm256_set1_epi64x(32)));
  return _mm256_sub_epi64(_mm256_add_epi64(k, o), _mm256_mul_epi32(_mm256_set1_epi32(izp), m));
}

/* Folds izp and ozp into the right-shift plan's rounding constants (refcg_fpm_fold_ok): 0 where it
 * cannot, and r is left as it was. */
REFCG_INLINE int refcg_rq_fold_avx2(refcg_rqv_avx2* r, int32_t izp, int32_t ozp) {
  int32_t rs[8], rmax = 0;
  _mm256_storeu_si256((__m256i*)rs, r->c.q.r);
  for (int l = 0; l < 8; ++l) rmax = rs[l] > rmax ? rs[l] : rmax;
  if (!refcg_fpm_fold_ok(rmax, izp, ozp)) return 0;
  r->c.q.k_e = refcg_fold_k_avx2(r->c.q.k_e, refcg_even64_avx2(r->c.q.r), r->c.q.m_e, izp, ozp);
  r->c.q.k_o = refcg_fold_k_avx2(r->c.q.k_o, refcg_odd64_avx2(r->c.q.r), r->c.q.m_o, izp, ozp);
  return 1;
}

/* narrow: the values requantized are 8-bit (x - izp cannot wrap), so a nonzero input zero point
 * folds too (refcg_fpm_fold_ok). */
REFCG_INLINE refcg_rqv_avx2 refcg_rqv_load8_avx2(const refcg_requant* rq, int32_t c, int32_t n, int lanes, int narrow) {
  refcg_rqv_avx2 r;
  const __m256i zero = _mm256_setzero_si256();
  r.general = 0;
  r.c.q.m_e = r.c.q.m_o = r.c.q.k_e = r.c.q.k_o = r.c.q.r = r.c.q.l1 = r.c.q.l2 = zero; /* registers, not a memset */
  const __m256i mask = refcg_lanes_avx2(n);
  c = rq->per_channel ? c : 0;
  lanes = lanes && rq->per_channel;
  if (rq->identity) return r;
  if (rq->mode == REFCG_RQ_FLOAT32_UPWARD || rq->mode == REFCG_RQ_FLOAT32_TONEAREST) {
    r.c.f = lanes ? _mm256_castsi256_ps(_mm256_maskload_epi32((const int*)rq->scale_f32 + c, mask))
                  : _mm256_set1_ps(rq->scale_f32[c]);
    return r;
  }
  if (rq->mode == REFCG_RQ_FLOAT64_UPWARD || rq->mode == REFCG_RQ_FLOAT64_TONEAREST) {
    const __m256i idx = _mm256_setr_epi64x(0, 1, 2, 3);
    for (int h = 0; h < 2; ++h)
      r.c.d[h] = lanes ? _mm256_maskload_pd(rq->scale_f64 + c + 4 * h,
                                            _mm256_cmpgt_epi64(_mm256_set1_epi64x(n - 4 * h), idx))
                       : _mm256_set1_pd(rq->scale_f64[c]);
    return r;
  }
  const int up = rq->mode == REFCG_RQ_INT64_UPWARD, fold = narrow || rq->input_zp == 0;
  if (!lanes) { /* one channel: the plan in scalars, broadcast */
    const refcg_fpm_one one = refcg_fpm_one_of(rq, c);
    r.general = one.general || !fold || !refcg_fpm_fold_ok(one.r, rq->input_zp, rq->output_zp);
    r.c.q.m_e = r.c.q.m_o = _mm256_set1_epi32(rq->multiplier[c]);
    r.c.q.k_e = r.c.q.k_o = _mm256_set1_epi64x(
        r.general ? one.k : refcg_fpm_fold_k(one.k, one.r, rq->multiplier[c], rq->input_zp, rq->output_zp));
    r.c.q.l1 = _mm256_set1_epi32(one.l1);
    r.c.q.l2 = _mm256_set1_epi32(one.l2);
    r.c.q.r = _mm256_set1_epi32(one.r);
    return r;
  }
  /* lanes past n get shift -1: no left shift */
  const __m256i s = _mm256_blendv_epi8(_mm256_set1_epi32(-1), _mm256_maskload_epi32(rq->shift + c, mask), mask);
  const __m256i m = _mm256_maskload_epi32(rq->multiplier + c, mask), one64 = _mm256_set1_epi64x(1);
  refcg_v8si l1, l2, kx, rs;
  REFCG_FPM_PLAN((refcg_v8si)s, up, l1, l2, kx, rs);
  r.c.q.l1 = (__m256i)l1;
  r.c.q.l2 = (__m256i)l2;
  r.c.q.r = (__m256i)rs;
  r.general = !up || !_mm256_testz_si256(r.c.q.l1, r.c.q.l1);
  r.c.q.m_e = m;
  r.c.q.m_o = _mm256_shuffle_epi32(m, 0xF5); /* odd lanes into the even slots _mm256_mul_epi32 reads */
  r.c.q.k_e = _mm256_sllv_epi64(one64, refcg_even64_avx2((__m256i)kx));
  r.c.q.k_o = _mm256_sllv_epi64(one64, refcg_odd64_avx2((__m256i)kx));
  if (!r.general) r.general = !fold || !refcg_rq_fold_avx2(&r, rq->input_zp, rq->output_zp);
  return r;
}

/* ... of int32 accumulators: a nonzero input zero point leaves the general plan. */
REFCG_INLINE refcg_rqv_avx2 refcg_rqv_load_avx2(const refcg_requant* rq, int32_t c, int32_t n, int lanes) {
  return refcg_rqv_load8_avx2(rq, c, n, lanes, 0);
}

/* One int64 half of REFCG_FPM_PLAN in general: ((p << l1) + k (- 1 if negative: TONEAREST)) << l2. */
REFCG_INLINE __m256i refcg_fpm_half_avx2(__m256i p, __m256i l1, __m256i k, __m256i l2, int tonearest) {
  p = _mm256_sllv_epi64(p, l1);
  if (tonearest) p = _mm256_add_epi64(p, _mm256_cmpgt_epi64(_mm256_setzero_si256(), p));
  return _mm256_sllv_epi64(_mm256_add_epi64(p, k), l2);
}

/* refcg_requantize_one's float expression on the lanes of f (float or double vectors, suffix sfx):
 * input zp, scale, addend and post of the mode's width; the flags of refcg_requant (upward: the
 * mode's UPWARD; has_post: post is not 0, whose addition changes no result). */
#define REFCG_RQ_FLOAT_AVX2(f, izp, scale, addend, post, identity, fused, has_post, upward, round_emulated, sfx) \
  do {                                                                                                 \
    const __typeof__(f) sign_ = _mm256_set1_##sfx(-0.0), one_ = _mm256_set1_##sfx(1.0);                \
    const __typeof__(f) half_ = _mm256_set1_##sfx(0.5), add_ = _mm256_set1_##sfx(addend);             \
    f = _mm256_sub_##sfx(f, _mm256_set1_##sfx(izp));                                                   \
    if (identity)                                                                                      \
      f = _mm256_add_##sfx(f, add_);                                                                   \
    else if (fused)                                                                                    \
      f = _mm256_fmadd_##sfx(f, scale, add_);                                                          \
    else                                                                                               \
      f = _mm256_add_##sfx(_mm256_mul_##sfx(f, scale), add_);                                          \
    if (has_post) f = _mm256_add_##sfx(f, _mm256_set1_##sfx(post));                                    \
    if (upward) {                                                                                      \
      f = _mm256_floor_##sfx(f);                                                                       \
    } else if (round_emulated) { /* f + copysign(0.5, f); the conversion truncates */                 \
      f = _mm256_add_##sfx(f, _mm256_or_##sfx(_mm256_and_##sfx(f, sign_), half_));                    \
    } else { /* half away from zero; f - trunc(f) is exact */                                          \
      const __typeof__(f) t_ = _mm256_round_##sfx(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);          \
      const __typeof__(f) up_ = _mm256_cmp_##sfx(_mm256_andnot_##sfx(sign_, _mm256_sub_##sfx(f, t_)), half_, _CMP_GE_OQ); \
      f = _mm256_add_##sfx(t_, _mm256_and_##sfx(up_, _mm256_or_##sfx(one_, _mm256_and_##sfx(f, sign_)))); \
    }                                                                                                  \
  } while (0)

/* The high halves of the even and odd int64 lanes pe, po, shifted right by r->c.q.r, + the output zp. */
/* The high halves of the even and odd int64 lanes pe, po, shifted right by r->c.q.r. */
REFCG_INLINE __m256i refcg_fpm_merge_avx2(const refcg_rqv_avx2* r, __m256i pe, __m256i po) {
  return _mm256_srav_epi32(_mm256_blend_epi32(_mm256_shuffle_epi32(pe, 0xF5), po, 0xAA), r->c.q.r);
}

REFCG_INLINE __m256i refcg_clamp_avx2(const refcg_requant* rq, __m256i v) {
  return _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(rq->out_max)), _mm256_set1_epi32(rq->out_min));
}

/* The int64 modes' REFCG_FPM_PLAN in UPWARD with right shifts only (not identity, not general):
 * even and odd int64 products plus the rounding 2^kx with both zero points folded in
 * (refcg_fpm_fold_ok); not clamped. */
REFCG_INLINE __m256i refcg_rq_up_avx2(__m256i acc, const refcg_rqv_avx2* r) {
  const __m256i pe = _mm256_add_epi64(_mm256_mul_epi32(acc, r->c.q.m_e), r->c.q.k_e);
  const __m256i po = _mm256_add_epi64(_mm256_mul_epi32(_mm256_shuffle_epi32(acc, 0xF5), r->c.q.m_o), r->c.q.k_o);
  return refcg_fpm_merge_avx2(r, pe, po);
}

/* rq and r take refcg_rq_up_avx2 (constant per block: callers branch on it once, outside their loops) */
REFCG_INLINE int refcg_rq_is_up_avx2(const refcg_requant* rq, const refcg_rqv_avx2* r) {
  return rq->mode == REFCG_RQ_INT64_UPWARD && !rq->identity && !r->general;
}

/* Requantize 8 lanes into int32 before the clamp. */
REFCG_INLINE __m256i refcg_rq_unclamped_avx2(const refcg_requant* rq, __m256i acc, const refcg_rqv_avx2* r) {
  __m256i v;
  if (rq->mode == REFCG_RQ_INT64_UPWARD || rq->mode == REFCG_RQ_INT64_TONEAREST) {
    if (refcg_rq_is_up_avx2(rq, r)) return refcg_rq_up_avx2(acc, r);
    v = _mm256_sub_epi32(acc, _mm256_set1_epi32(rq->input_zp));
    if (!rq->identity) { /* general: REFCG_FPM_PLAN's left shifts or TONEAREST */
      const int tonearest = rq->mode == REFCG_RQ_INT64_TONEAREST;
      const __m256i l1 = r->c.q.l1, l2 = r->c.q.l2;
      __m256i pe = _mm256_mul_epi32(v, r->c.q.m_e), po = _mm256_mul_epi32(_mm256_shuffle_epi32(v, 0xF5), r->c.q.m_o);
      pe = refcg_fpm_half_avx2(pe, refcg_even64_avx2(l1), r->c.q.k_e, refcg_even64_avx2(l2), tonearest);
      po = refcg_fpm_half_avx2(po, refcg_odd64_avx2(l1), r->c.q.k_o, refcg_odd64_avx2(l2), tonearest);
      return _mm256_add_epi32(refcg_fpm_merge_avx2(r, pe, po), _mm256_set1_epi32(rq->output_zp));
    }
    v = _mm256_add_epi32(v, _mm256_set1_epi32(rq->output_zp));
  } else if (rq->mode == REFCG_RQ_FLOAT64_UPWARD || rq->mode == REFCG_RQ_FLOAT64_TONEAREST) {
    __m256d lo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(acc)), hi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(acc, 1));
    const int up = rq->mode == REFCG_RQ_FLOAT64_UPWARD, post = rq->post_f64 != 0.0;
    REFCG_RQ_FLOAT_AVX2(lo, rq->input_zp, r->c.d[0], rq->addend_f64, rq->post_f64, rq->identity, rq->fused, post, up,
                        rq->round_emulated, pd);
    REFCG_RQ_FLOAT_AVX2(hi, rq->input_zp, r->c.d[1], rq->addend_f64, rq->post_f64, rq->identity, rq->fused, post, up,
                        rq->round_emulated, pd);
    /* out of range -> INT32_MIN, like refcg_f64_to_i32 on x86 */
    v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm256_cvttpd_epi32(lo)), _mm256_cvttpd_epi32(hi), 1);
  } else {
    __m256 f = _mm256_cvtepi32_ps(acc);
    REFCG_RQ_FLOAT_AVX2(f, rq->input_zp, r->c.f, rq->addend_f32, rq->post_f32, rq->identity, rq->fused,
                        rq->post_f32 != 0.0f, rq->mode == REFCG_RQ_FLOAT32_UPWARD, rq->round_emulated, ps);
    v = _mm256_cvttps_epi32(f); /* out of range -> INT32_MIN, like cvttss2si */
  }
  return v;
}

/* ... and clamped. */
REFCG_INLINE __m256i refcg_rq_apply_avx2(const refcg_requant* rq, __m256i acc, const refcg_rqv_avx2* r) {
  return refcg_clamp_avx2(rq, refcg_rq_unclamped_avx2(rq, acc, r));
}

/* The plan (REFCG_PLAN_*) of rq and r. */
REFCG_INLINE int refcg_rq_plan_avx2(const refcg_requant* rq, const refcg_rqv_avx2* r) {
  if (refcg_rq_is_up_avx2(rq, r)) return REFCG_PLAN_I64_UP;
  if (rq->mode == REFCG_RQ_FLOAT32_UPWARD && !rq->identity)
    return REFCG_PLAN_F32_UP + (rq->fused != 0) + 2 * (rq->post_f32 != 0.0f);
  return REFCG_PLAN_ANY;
}

/* refcg_rq_unclamped_avx2 under plan (a constant: the branches fold away). */
REFCG_INLINE __m256i refcg_rq_planned_unclamped_avx2(const refcg_requant* rq, __m256i acc, const refcg_rqv_avx2* r,
                                                     const int plan) {
  if (plan == REFCG_PLAN_I64_UP) return refcg_rq_up_avx2(acc, r);
  if (plan < REFCG_PLAN_F32_UP) return refcg_rq_unclamped_avx2(rq, acc, r);
  __m256 f = _mm256_cvtepi32_ps(acc);
  REFCG_RQ_FLOAT_AVX2(f, rq->input_zp, r->c.f, rq->addend_f32, rq->post_f32, 0, REFCG_PLAN_FUSED(plan),
                      REFCG_PLAN_POST(plan), 1, 0, ps);
  return _mm256_cvttps_epi32(f);
}

/* ... and clamped. */
REFCG_INLINE __m256i refcg_rq_planned_avx2(const refcg_requant* rq, __m256i acc, const refcg_rqv_avx2* r, const int plan) {
  return refcg_clamp_avx2(rq, refcg_rq_planned_unclamped_avx2(rq, acc, r, plan));
}

/* Requantize 8 channels starting at c (n channels valid) into clamped int32. */
REFCG_INLINE __m256i refcg_rq_avx2(const refcg_requant* rq, __m256i acc, int32_t c, int32_t n) {
  const refcg_rqv_avx2 r = refcg_rqv_load_avx2(rq, c, n, 1);
  return refcg_rq_apply_avx2(rq, acc, &r);
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

/* The low bytes of lanes [0, n) of v (values in range) to out. */
REFCG_INLINE void refcg_store_bytes_avx2(uint8_t* out, __m256i v, int64_t n) {
  /* bytes 0-3 of each 128-bit half, then both halves */
  const __m256i lo = _mm256_shuffle_epi8(v, _mm256_set1_epi32(0x0C080400));
  const __m128i b = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(lo, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
  if (n >= 8)
    _mm_storel_epi64((__m128i*)out, b);
  else
    memcpy(out, &b, (size_t)n);
}

/* The driver counts AVX2 tiles as REFCG_AVX2_TABLE_MR-row x 16-channel units (the ISA table's mr,
 * nv = 1), row units fastest within a channel block; refcg_tiles_avx2 regroups the rows of each
 * channel block it gets into REFCG_AVX2_MR-row tiles (REFCG_AVX2B_MR on pair-safe blocks). */
#define REFCG_AVX2_TABLE_MR 2
#define REFCG_AVX2_MR 3    /* 3 x 4 accumulators + the broadcast input; weights are memory operands */
#define REFCG_AVX2_WC 192  /* k-steps of widened weights per chunk (24 KB: stays in L1) */
#define REFCG_AVX2_RG 96   /* rows sharing a chunk; their raw accumulators take 12 KB */
#define REFCG_AVX2B_MR 4   /* vpmaddubsw tiles: 4 x 2 accumulators, 2 weights, ones, input, 2 products
                            * (6 rows measured no faster: the epilogue and copies dominate the rest) */
#define REFCG_AVX2_HALF_MR 6 /* a block of 8 or fewer channels: 6 x 2 accumulators (refcg_rows_avx2w) */
#define REFCG_AVX2_MR_MAX REFCG_AVX2_HALF_MR

/* Sum of the two pair-sum lanes per channel: groups g0 (ch 0-3) and g1 (ch 4-7) -> ch 0-7. */
REFCG_INLINE __m256i refcg_hsum_pairs_avx2(__m256i g0, __m256i g1) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(g0, g1), 0xD8);
}

/* The epilogue of 16-channel block nb, prepared once per block and row range (not per tile):
 * requantize constants and corrections of channels 0-7 and 8-15, and a local copy of rq (the byte
 * stores may alias it). vec == 0: the per-row epilogue (a scalar mode, or strided channels). */
typedef struct {
  refcg_requant rq;
  refcg_rqv_avx2 rv[2];
  __m256i corr[2], mask[2], lo8, hi8;
  int32_t c0, nvalid, nh, vec;
} refcg_blk_avx2;
#define REFCG_BLK_AVX2 1 /* tests/epilogue_harness.c: the block form exists */

REFCG_INLINE void refcg_blk_init_avx2(const refcg_gemm_job* j, int32_t nb, refcg_blk_avx2* b) {
  b->c0 = nb * 16;
  b->nvalid = j->n - b->c0 < 16 ? j->n - b->c0 : 16;
  b->nh = b->nvalid > 8 ? 2 : 1;
  b->vec = j->epi.rq_vector && j->epi.o_c == 1;
  b->rq = *j->epi.rq;
  b->lo8 = _mm256_set1_epi8((char)b->rq.out_min);
  b->hi8 = _mm256_set1_epi8((char)b->rq.out_max);
  for (int32_t h = 0; h < 2; ++h) {
    const int32_t n = b->nvalid - 8 * h;
    b->rv[h] = refcg_rqv_load_avx2(&b->rq, b->c0 + 8 * h, n, 1);
    b->mask[h] = refcg_lanes_avx2(n);
    b->corr[h] = _mm256_maskload_epi32(j->epi.corr + b->c0 + 8 * h, b->mask[h]);
  }
}

/* 4 vectors of 8 unclamped values as 32 bytes in order (v[0]'s 8, then v[1]'s ...): the saturating
 * packs clamp to the dtype's range, then [lo8, hi8] on the 32 bytes at once (the range lies inside the
 * dtype's), instead of a clamp and a shuffle per vector. */
REFCG_INLINE __m256i refcg_pack4_avx2(const __m256i* v, __m256i lo8, __m256i hi8, int is_unsigned) {
  const __m256i lo = _mm256_packs_epi32(v[0], v[1]), hi = _mm256_packs_epi32(v[2], v[3]);
  __m256i bytes = is_unsigned ? _mm256_packus_epi16(lo, hi) : _mm256_packs_epi16(lo, hi);
  bytes = is_unsigned ? _mm256_max_epu8(_mm256_min_epu8(bytes, hi8), lo8) : _mm256_max_epi8(_mm256_min_epi8(bytes, hi8), lo8);
  /* dword k of 128-bit lane l holds values 4 l .. 4 l + 3 of v[k] */
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Requantize and store rows x block b (16 channels, 8-bit output) from sum under plan
 * (refcg_rq_planned_avx2): rows in pairs, one pack each. */
REFCG_INLINE void refcg_tile_store_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, const int64_t* out_off,
                                        __m256i (*sum)[2], int32_t rows, const int plan) {
  uint8_t* const o = (uint8_t*)j->epi.out + b->c0;
  for (int32_t r = 0; r < rows; r += 2) {
    const int two = r + 1 < rows;
    __m256i v[4];
    for (int q = 0; q < 4; ++q) {
      if (q < 2 || two)
        v[q] = refcg_rq_planned_unclamped_avx2(&b->rq, _mm256_add_epi32(sum[r + q / 2][q & 1], b->corr[q & 1]),
                                               &b->rv[q & 1], plan);
      else
        v[q] = v[q - 2];
    }
    const __m256i bytes = refcg_pack4_avx2(v, b->lo8, b->hi8, j->epi.out_dtype == REFCG_U8); /* a row per half */
    _mm_storeu_si128((__m128i*)(o + out_off[r]), _mm256_castsi256_si128(bytes));
    if (two) _mm_storeu_si128((__m128i*)(o + out_off[r + 1]), _mm256_extracti128_si256(bytes, 1));
  }
}

/* The tile stores refcg_tile_store_avx2 does not take (channel tails, int32 or channels-apart outputs,
 * REFCG_PLAN_ANY), row by row under any plan, out of line: inlined into every tile and tail size, the
 * generic requantize was a third of the GEMM kernels' code, for blocks networks rarely have. */
static __attribute__((noinline)) void refcg_tile_store_any_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b,
                                                                const int64_t* out_off, __m256i (*sum)[2], int32_t rows) {
  for (int32_t r = 0; r < rows; ++r) {
    if (!b->vec) {
      int32_t t[16];
      _mm256_storeu_si256((__m256i*)t, sum[r][0]);
      _mm256_storeu_si256((__m256i*)(t + 8), sum[r][1]);
      refcg_epi_avx2(&j->epi, t, b->c0, b->nvalid, out_off[r]);
      continue;
    }
    const int64_t off = out_off[r] + b->c0;
    for (int32_t h = 0; h < b->nh; ++h) {
      const __m256i v = refcg_rq_planned_avx2(&b->rq, _mm256_add_epi32(sum[r][h], b->corr[h]), &b->rv[h], REFCG_PLAN_ANY);
      if (j->epi.out_dtype == REFCG_S32)
        _mm256_maskstore_epi32((int*)j->epi.out + off + 8 * h, b->mask[h], v);
      else
        refcg_store_bytes_avx2((uint8_t*)j->epi.out + off + 8 * h, v, b->nvalid - 8 * h); /* values are in range */
    }
  }
}

/* Epilogue of rows (output offsets out_off) x block b from the accumulators of channels 0-7
 * and 8-15 (sum[r][0], sum[r][1]): vector stores of contiguous channels. */
REFCG_INLINE void refcg_tile_sums_epi_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, const int64_t* out_off,
                                           __m256i (*sum)[2], int32_t rows) {
  const int plan = b->vec ? REFCG_PLAN_MEET(refcg_rq_plan_avx2(&b->rq, &b->rv[0]), refcg_rq_plan_avx2(&b->rq, &b->rv[1]))
                          : REFCG_PLAN_ANY;
  if (REFCG_PLAN_INDEX(plan) == REFCG_PLAN_ANY || b->nvalid != 16 ||
      (j->epi.out_dtype != REFCG_S8 && j->epi.out_dtype != REFCG_U8)) {
    __m256i t[REFCG_AVX2_MR_MAX][2]; /* a copy: sum's address taken would keep the tiles' accumulators in memory */
    for (int32_t r = 0; r < rows; ++r) t[r][0] = sum[r][0], t[r][1] = sum[r][1];
    refcg_tile_store_any_avx2(j, b, out_off, t, rows);
    return;
  }
#define REFCG_TILE_STORE_AVX2(p) refcg_tile_store_avx2(j, b, out_off, sum, rows, p)
  REFCG_WITH_COPIED_PLAN(plan, REFCG_TILE_STORE_AVX2);
#undef REFCG_TILE_STORE_AVX2
}

/* The same from vpmaddwd's pair-sum accumulators (4 per row: channels 0-3, 4-7, 8-11, 12-15). */
REFCG_INLINE void refcg_tile_epi_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, const int64_t* out_off,
                                      __m256i (*acc)[4], int32_t rows, const int G) {
  __m256i sum[REFCG_AVX2_MR_MAX][2];
  for (int32_t r = 0; r < rows; ++r)
    for (int h = 0; h < 2; ++h)
      sum[r][h] = 2 * h < G ? refcg_hsum_pairs_avx2(acc[r][2 * h], acc[r][2 * h + 1]) : _mm256_setzero_si256();
  refcg_tile_sums_epi_avx2(j, b, out_off, sum, rows);
}

/* 4 input bytes at p zero-extended to int16 in every 64-bit lane (x0..x3 x0..x3 ...): a
 * broadcast load (vbroadcastss; the integer form compiles to vmovd + vpshufd) and one vpmovzxbw. */
REFCG_INLINE __m256i refcg_bcast4_avx2(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_castps_si128(_mm_set1_ps(refcg_load_f32(p))));
}

/* MR rows x 16 channels (block nb). Weights: 16 bytes = 4 channels x 4 k, sign-extended to
 * int16; input: 4 bytes zero-extended (FLIP: XOR j->flip4's byte) and broadcast, so vpmaddwd gives per
 * channel two exact pair sums. For row ranges too short to repay refcg_tile_avx2w's weight widening. */
REFCG_INLINE void refcg_tile_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t i0, int32_t nb,
                                  const int MR, const int FLIP) {
  const uint8_t* arow[2];
  int64_t out_off[2];
  refcg_job_rows(j, i0, MR, arow, out_off);
  __m256i acc[2][4];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < 4; ++g) acc[r][g] = _mm256_setzero_si256();
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  const __m256i flip = _mm256_set1_epi16((int16_t)(j->flip4 & 0xff)); /* widened: the byte's XOR */
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      __m256i w[4];
      for (int g = 0; g < 4; ++g) w[g] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wp + 16 * g)));
      for (int r = 0; r < MR; ++r) {
        __m256i a = refcg_bcast4_avx2(arow[r] + so + k);
        if (FLIP) a = _mm256_xor_si256(a, flip);
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm256_add_epi32(acc[r][g], _mm256_madd_epi16(a, w[g]));
      }
    }
  }
  refcg_tile_epi_avx2(j, b, out_off, acc, MR, 4);
}

/* acc + per lane the products of 4 input bytes x (unsigned) and 4 weights w (signed), for weight pairs that
 * provably fit int16 (refcg_gemm_weights.pair_safe): vpmaddubsw gives two exact int16 pair sums per lane,
 * vpmaddwd by ones their int32 sum (what vpdpbusd does in one instruction: refcg_dpbusd_avxvnni). */
REFCG_INLINE __m256i refcg_dot_pairsafe_avx2(__m256i acc, __m256i x, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1)));
}

/* MR rows x 16 channels (block nb) of the packed layout as is (per k-step 32 weight bytes: 8 channels x
 * 4 k, twice) against the 4 input bytes of each row broadcast, through dot (acc + 4-byte dot products
 * per lane: refcg_dot_pairsafe_avx2 on pair-safe blocks, vpdpbusd on AVX-VNNI). FLIP: the bytes XOR
 * j->flip4 (an int8 input read in place), a constant: the XOR is not paid where there is none. */
REFCG_INLINE void refcg_tile_dot_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t q, int32_t c, int32_t nb,
                                      const int MR, __m256i (*dot)(__m256i, __m256i, __m256i), const int FLIP) {
  const uint8_t* arow[REFCG_AVX2_MR_MAX];
  int64_t out_off[REFCG_AVX2_MR_MAX];
  refcg_job_rows_at(j, q, c, MR, arow, out_off);
  __m256i acc[REFCG_AVX2_MR_MAX][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int8_t* wp = j->w + (int64_t)nb * j->kp * 16;
  const __m256i flip = _mm256_set1_epi32((int32_t)j->flip4);
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)wp), w1 = _mm256_loadu_si256((const __m256i*)(wp + 32));
      for (int r = 0; r < MR; ++r) {
        __m256i a = _mm256_set1_epi32(refcg_load_i32(arow[r] + so + k));
        if (FLIP) a = _mm256_xor_si256(a, flip);
        acc[r][0] = dot(acc[r][0], a, w0);
        acc[r][1] = dot(acc[r][1], a, w1);
      }
    }
  }
  refcg_tile_sums_epi_avx2(j, b, out_off, acc, MR);
}

/* Rows [r0, r1) of block nb by refcg_tile_dot_avx2, MR at a time; a tail of fewer rows runs a kernel
 * of its size (a dense of batch 1 computes one row, not MR). */
REFCG_INLINE void refcg_rows_dot_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0, int32_t r1,
                                      int32_t nb, const int MR, __m256i (*dot)(__m256i, __m256i, __m256i),
                                      const int FLIP) {
  int32_t i0 = r0, q = r0 / j->cols, c = r0 - q * j->cols;
  for (; i0 + MR <= r1; i0 += MR) {
    refcg_tile_dot_avx2(j, b, q, c, nb, MR, dot, FLIP);
    refcg_rows_advance(j, &q, &c, MR);
  }
  switch (r1 - i0) { /* MR is at most REFCG_AVX2_MR_MAX (6); no copies for tails of MR rows or more */
    case 5: if (MR > 5) refcg_tile_dot_avx2(j, b, q, c, nb, 5, dot, FLIP); break;
    case 4: if (MR > 4) refcg_tile_dot_avx2(j, b, q, c, nb, 4, dot, FLIP); break;
    case 3: refcg_tile_dot_avx2(j, b, q, c, nb, 3, dot, FLIP); break;
    case 2: refcg_tile_dot_avx2(j, b, q, c, nb, 2, dot, FLIP); break;
    case 1: refcg_tile_dot_avx2(j, b, q, c, nb, 1, dot, FLIP); break;
    default: break;
  }
}

static __attribute__((noinline)) void refcg_rows_avx2b(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0,
                                                       int32_t r1, int32_t nb) {
  if (j->flip4)
    refcg_rows_dot_avx2(j, b, r0, r1, nb, REFCG_AVX2B_MR, refcg_dot_pairsafe_avx2, 1);
  else
    refcg_rows_dot_avx2(j, b, r0, r1, nb, REFCG_AVX2B_MR, refcg_dot_pairsafe_avx2, 0);
}

/* Jobs of few k-steps (KS of 4 bytes: 1x1 expands over 16-48 channels, a 3x3 stem over 4 padded
 * channels) on AVX2: the tiles' K loop is then 4-12 vpmaddwd per accumulator and their epilogue
 * (pair sums added across, spills around it) most of the time, and a pass of the tiles over one
 * 16-channel block writes 16 bytes of every output row (96 channels at 112x112: the 1.2 MB output
 * read for ownership six times). Here one row at a time through all of a group's blocks: the
 * weights as k-pairs (refcg_pairs_w_avx2), so that a vpmaddwd of a broadcast input pair gives 8
 * channels' sums directly (two accumulators per block, no horizontal adds), then two blocks' epilogue
 * and one 32-byte store. */
#define REFCG_AVX2_SMALLK_MAX 12 /* k-steps */
#define REFCG_AVX2_SMALLK_NB 16  /* blocks of a group (256 channels: whole output lines per row) */

/* KS k-steps of block w (packed: per k-step 16 channels x 4 bytes) as int16 k-pairs:
 * wp[(2 s + p) * 2 + h] holds channels 8 h .. 8 h + 7, each (w[4 s + 2 p], w[4 s + 2 p + 1]). */
REFCG_INLINE void refcg_pairs_w_avx2(const int8_t* w, int32_t ks, __m256i* wp) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (int32_t s = 0; s < ks; ++s)
    for (int h = 0; h < 2; ++h) {
      /* lane l: channels 8 h + 4 l .. + 3; per lane pair 0 in the low 8 bytes, pair 1 in the high */
      const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(w + 64 * s + 32 * h)), pick);
      const __m256i q = _mm256_permute4x64_epi64(v, 0xD8); /* pair 0 of both lanes, then pair 1 */
      wp[(2 * s) * 2 + h] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
      wp[(2 * s + 1) * 2 + h] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
    }
}

/* n bytes of x (the low 16) at out: a row of a block of n channels */
REFCG_INLINE void refcg_store16_avx2(uint8_t* out, __m128i x, int32_t n) {
  if (n == 16)
    _mm_storeu_si128((__m128i*)out, x);
  else if (n == 8)
    _mm_storel_epi64((__m128i*)out, x);
  else {
    uint8_t t[16];
    _mm_storeu_si128((__m128i*)t, x);
    memcpy(out, t, (size_t)n);
  }
}

/* The two accumulators (channels 0-7, 8-15) of each of NB (1 or 2) blocks of one row (acc[2 b], acc[2 b + 1];
 * block b's weights from wp + 4 KS b): KS k-steps at a + koff[k], the input's pair shuffles shared. */
REFCG_INLINE void refcg_smallk_block_avx2(const uint8_t* a, const int64_t* koff, const __m256i* wp, __m256i* acc,
                                          const int KS, const int NB) {
  /* the 4 input bytes broadcast: pair 0 / pair 1 zero-extended into every dword */
  const __m256i lo = _mm256_setr_epi8(0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1,
                                      0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1);
  const __m256i hi = _mm256_setr_epi8(2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1,
                                      2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1);
  for (int k = 0; k < KS; ++k) {
    const __m256i x = _mm256_set1_epi32(refcg_load_i32(a + koff[k]));
    const __m256i x0 = _mm256_shuffle_epi8(x, lo), x1 = _mm256_shuffle_epi8(x, hi);
    for (int b = 0; b < NB; ++b) {
      const __m256i* w = wp + 4 * KS * b + 4 * k;
      acc[2 * b] = _mm256_add_epi32(acc[2 * b], _mm256_madd_epi16(x0, w[0]));
      acc[2 * b + 1] = _mm256_add_epi32(acc[2 * b + 1], _mm256_madd_epi16(x0, w[1]));
      acc[2 * b] = _mm256_add_epi32(acc[2 * b], _mm256_madd_epi16(x1, w[2]));
      acc[2 * b + 1] = _mm256_add_epi32(acc[2 * b + 1], _mm256_madd_epi16(x1, w[3]));
    }
    /* the sums in order: GCC re-associates them into a tree of all 4 KS products, spilled */
    __asm__("" : "+x"(acc[0]), "+x"(acc[1]));
    if (NB == 2) __asm__("" : "+x"(acc[2]), "+x"(acc[3]));
  }
}

/* The same on the packed weights as they are (2 KS vectors per block: per k-step channels 0-7 and 8-15,
 * 4 bytes each) through dot (vpdpbusd on AVX-VNNI: refcg_tile_dot_avx2), the broadcast shared. */
REFCG_INLINE void refcg_smallk_block_dot_avx2(const uint8_t* a, const int64_t* koff, const __m256i* wp, __m256i* acc,
                                              const int KS, const int NB, __m256i (*dot)(__m256i, __m256i, __m256i)) {
  for (int k = 0; k < KS; ++k) {
    const __m256i x = _mm256_set1_epi32(refcg_load_i32(a + koff[k]));
    for (int b = 0; b < NB; ++b) {
      acc[2 * b] = dot(acc[2 * b], x, wp[2 * KS * b + 2 * k]);
      acc[2 * b + 1] = dot(acc[2 * b + 1], x, wp[2 * KS * b + 2 * k + 1]);
    }
  }
}

/* Blocks v .. v + NB - 1 of a group's weights wp: with dot (NULL: AVX2's k-pairs, 4 KS vectors per block)
 * or without (the packed bytes, 2 KS vectors per block). */
REFCG_INLINE void refcg_smallk_any_avx2(const uint8_t* a, const int64_t* koff, const __m256i* wp, int32_t v, __m256i* acc,
                                        const int KS, const int NB, __m256i (*dot)(__m256i, __m256i, __m256i)) {
  if (dot)
    refcg_smallk_block_dot_avx2(a, koff, wp + 2 * KS * v, acc, KS, NB, dot);
  else
    refcg_smallk_block_avx2(a, koff, wp + 4 * KS * v, acc, KS, NB);
}

/* Rows [i0, i1) x blocks [0, nbk) of a group (constants b, weights wp: refcg_smallk_any_avx2), under
 * plan; blocks two at a time, so that one pack stores both. CONTIG: one segment; else KS steps over the
 * job's segments. */
REFCG_INLINE void refcg_rows_smallk_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, const __m256i* wp,
                                         int32_t nbk, int32_t i0, int32_t i1, const int KS, const int CONTIG,
                                         const int plan, __m256i (*dot)(__m256i, __m256i, __m256i)) {
  int64_t koff[REFCG_AVX2_SMALLK_MAX];
  for (int k = 0; k < KS; ++k) {
    const int32_t steps = j->seg_len / 4; /* a segment's k-steps */
    koff[k] = CONTIG ? 4 * k : j->seg_off[k / steps] - j->seg_off[0] + 4 * (k % steps);
  }
  const int is_unsigned = j->epi.out_dtype == REFCG_U8;
  int32_t q = i0 / j->cols, c = i0 - q * j->cols;
  if (nbk == 1) { /* 16 channels or fewer: rows two at a time, so that one pack stores both */
    for (int32_t i = i0; i < i1; i += 2) {
      const int two = i + 1 < i1;
      __m256i acc[4] = {b->corr[0], b->corr[1], b->corr[0], b->corr[1]};
      uint8_t* o[2];
      for (int r = 0; r <= two; ++r) {
        refcg_smallk_any_avx2(j->a + (int64_t)q * j->a_row_h + (int64_t)c * j->a_row_w + j->seg_off[0], koff, wp, 0,
                              acc + 2 * r, KS, 1, dot);
        o[r] = (uint8_t*)j->epi.out + (int64_t)q * j->o_row_h + (int64_t)c * j->o_row_w + b->c0;
        if (++c == j->cols) {
          c = 0;
          ++q;
        }
      }
      for (int h = 0; h < 4; ++h) acc[h] = refcg_rq_planned_unclamped_avx2(&b->rq, acc[h], &b->rv[h & 1], plan);
      const __m256i bytes = refcg_pack4_avx2(acc, b->lo8, b->hi8, is_unsigned); /* a row per half */
      refcg_store16_avx2(o[0], _mm256_castsi256_si128(bytes), b->nvalid);
      if (two) refcg_store16_avx2(o[1], _mm256_extracti128_si256(bytes, 1), b->nvalid);
    }
    return;
  }
  for (int32_t i = i0; i < i1; ++i) {
    const uint8_t* a = j->a + (int64_t)q * j->a_row_h + (int64_t)c * j->a_row_w + j->seg_off[0];
    uint8_t* o = (uint8_t*)j->epi.out + (int64_t)q * j->o_row_h + (int64_t)c * j->o_row_w + b[0].c0;
    for (int32_t v = 0; v < nbk; v += 2, o += 32) {
      const int two = v + 1 < nbk;
      __m256i acc[4] = {b[v].corr[0], b[v].corr[1], b[v + two].corr[0], b[v + two].corr[1]};
      if (two && KS > 4 && !dot) { /* both blocks in one pass: measured 0.83x at 4 k-steps, 0.87x with dot */
        refcg_smallk_any_avx2(a, koff, wp, v, acc, KS, 2, dot);
      } else {
        refcg_smallk_any_avx2(a, koff, wp, v, acc, KS, 1, dot);
        if (two) refcg_smallk_any_avx2(a, koff, wp, v + 1, acc + 2, KS, 1, dot);
      }
      for (int h = 0; h < 4; ++h) acc[h] = refcg_rq_planned_unclamped_avx2(&b[v].rq, acc[h], &b[v + (h >> 1) * two].rv[h & 1], plan);
      const __m256i bytes = refcg_pack4_avx2(acc, b[v].lo8, b[v].hi8, is_unsigned); /* a block per half */
      const int32_t n = b[v].nvalid + (two ? b[v + 1].nvalid : 0);
      if (n == 32) {
        _mm256_storeu_si256((__m256i*)o, bytes);
      } else { /* an odd block count's last block (MobileNet's 144 channels), channel tails */
        refcg_store16_avx2(o, _mm256_castsi256_si128(bytes), n < 16 ? n : 16);
        if (n > 16) refcg_store16_avx2(o + 16, _mm256_extracti128_si256(bytes, 1), n - 16);
      }
    }
    if (++c == j->cols) {
      c = 0;
      ++q;
    }
  }
}

/* The constants b of blocks [g, g + nbk) and the vector plan they share (REFCG_PLAN_ANY: none). */
static int refcg_smallk_plan_avx2(const refcg_gemm_job* j, int32_t g, int32_t nbk, refcg_blk_avx2* b) {
  int plan = -1;
  for (int32_t v = 0; v < nbk; ++v) {
    refcg_blk_init_avx2(j, g + v, &b[v]);
    const int p = REFCG_PLAN_MEET(refcg_rq_plan_avx2(&b[v].rq, &b[v].rv[0]), refcg_rq_plan_avx2(&b[v].rq, &b[v].rv[1]));
    plan = plan < 0 || plan == p ? p : REFCG_PLAN_ANY;
  }
  return plan;
}

/* Rows [i0, i1) x blocks [nb0, nb1) through refcg_rows_smallk_avx2 with KS, CONTIG and DOT fixed, in
 * groups of REFCG_AVX2_SMALLK_NB blocks, the plan a constant; 0 (nothing done) where the blocks do
 * not share a vector plan. DOT: refcg_smallk_any_avx2's (NULL: AVX2's k-pairs). */
#define REFCG_DEFINE_SMALLK_YMM(NAME, KS, CONTIG, DOT)                                                                 \
  static int NAME(const refcg_gemm_job* j, int32_t nb0, int32_t nb1, int32_t i0, int32_t i1) {                         \
    refcg_blk_avx2 b[REFCG_AVX2_SMALLK_NB];                                                                            \
    __m256i wp[REFCG_AVX2_SMALLK_NB * 4 * KS];                                                                         \
    for (int32_t g = nb0; g < nb1; g += REFCG_AVX2_SMALLK_NB) {                                                        \
      const int32_t nbk = nb1 - g < REFCG_AVX2_SMALLK_NB ? nb1 - g : REFCG_AVX2_SMALLK_NB;                             \
      const int plan = refcg_smallk_plan_avx2(j, g, nbk, b);                                                           \
      __m256i (*const dot)(__m256i, __m256i, __m256i) = DOT;                                                           \
      if (REFCG_PLAN_INDEX(plan) == REFCG_PLAN_ANY) return 0; /* the first group: the job's rows take it */          \
      for (int32_t v = 0; v < nbk; ++v) {                                                                              \
        const int8_t* w = j->w + (int64_t)(g + v) * j->kp * 16;                                                        \
        if (dot)                                                                                                       \
          for (int i = 0; i < 2 * KS; ++i) wp[2 * KS * v + i] = _mm256_loadu_si256((const __m256i*)(w + 32 * i));      \
        else                                                                                                           \
          refcg_pairs_w_avx2(w, KS, wp + 4 * KS * v);                                                                  \
      }                                                                                                                \
      const int ks = KS, contig = CONTIG;                                                                              \
      REFCG_WITH_COPIED_PLAN(plan, REFCG_SMALLK_AVX2_CALL);                                                            \
    }                                                                                                                  \
    return 1;                                                                                                          \
  }
#define REFCG_SMALLK_AVX2_CALL(p) refcg_rows_smallk_avx2(j, b, wp, nbk, i0, i1, ks, contig, p, dot)
typedef int (*refcg_smallk_avx2_fn)(const refcg_gemm_job*, int32_t, int32_t, int32_t, int32_t);
REFCG_DEFINE_SMALLK_YMM(refcg_smallk4_avx2, 4, 1, NULL)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk6_avx2, 6, 1, NULL)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk8_avx2, 8, 1, NULL)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk10_avx2, 10, 1, NULL)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk12_avx2, 12, 1, NULL)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk9_avx2, 9, 0, NULL) /* a 3x3 over 4 padded channels: three segments */
/* by k-steps: 4, 6, 8, 10, 12 in one segment, 9 in three (refcg_smallk_pick) */
static const refcg_smallk_avx2_fn refcg_smallks_avx2[] = {refcg_smallk4_avx2,  refcg_smallk6_avx2,
                                                          refcg_smallk8_avx2,  refcg_smallk10_avx2,
                                                          refcg_smallk12_avx2, refcg_smallk9_avx2};

/* The row kernel of fns (refcg_smallks_avx2's order) for j's k-steps, or NULL: tiles (more steps, other step
 * counts, outputs the byte epilogue does not store, an input flipped in place: refcg_flips_avx2 and refcg_flips_avxvnni give them none). */
static refcg_smallk_avx2_fn refcg_smallk_pick(const refcg_gemm_job* j, const refcg_smallk_avx2_fn* fns) {
  if (!refcg_epi_vector_bytes(&j->epi) || j->seg_len % 4 || j->flip4) return NULL;
  const int32_t steps = j->nseg * j->seg_len / 4;
  if (j->nseg > 1) return steps == 9 ? fns[5] : NULL;
  return steps % 2 == 0 && steps >= 4 && steps <= REFCG_AVX2_SMALLK_MAX ? fns[steps / 2 - 2] : NULL;
}

REFCG_INLINE refcg_smallk_avx2_fn refcg_smallk_of_avx2(const refcg_gemm_job* j) {
  return refcg_smallk_pick(j, refcg_smallks_avx2);
}

/* Tiles [t0, t1) (tile t = row pair t / nblocks, block t % nblocks) through smallk: the rows whose
 * blocks are all in the range row-major, the partial row pairs at either end over their blocks;
 * 0 (nothing done) where smallk declines. */
static int refcg_smallk_tiles_avx2(const refcg_gemm_job* j, refcg_smallk_avx2_fn smallk, int64_t t0, int64_t t1) {
  const int32_t nblocks = (j->n + 15) / 16, mr = REFCG_AVX2_TABLE_MR;
  const int64_t p0 = (t0 + nblocks - 1) / nblocks, p1 = t1 / nblocks; /* whole row pairs [p0, p1) */
#define REFCG_PAIR_ROWS(p) ((int32_t)((p) * mr < j->m ? (p) * mr : j->m))
  if (p0 > p1) /* within one row pair */
    return smallk(j, (int32_t)(t0 % nblocks), (int32_t)(t1 - p1 * nblocks), REFCG_PAIR_ROWS(p1), REFCG_PAIR_ROWS(p1 + 1));
  if (p0 < p1 && !smallk(j, 0, nblocks, REFCG_PAIR_ROWS(p0), REFCG_PAIR_ROWS(p1))) return 0;
  if (t0 < p0 * nblocks && !smallk(j, (int32_t)(t0 % nblocks), nblocks, REFCG_PAIR_ROWS(p0 - 1), REFCG_PAIR_ROWS(p0)))
    return 0;
  if (t1 > p1 * nblocks && !smallk(j, 0, (int32_t)(t1 - p1 * nblocks), REFCG_PAIR_ROWS(p1), REFCG_PAIR_ROWS(p1 + 1)))
    return 0;
#undef REFCG_PAIR_ROWS
  return 1;
}

/* nk k-steps (64 bytes each) of one block's weights sign-extended to int16, same layout. */
REFCG_INLINE void refcg_widen_w_avx2(const int8_t* w, int64_t nk, int16_t* ww) {
  for (const int8_t* end = w + nk * 64; w < end; w += 16, ww += 16)
    _mm256_store_si256((__m256i*)ww, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w)));
}

/* MR rows [i0, i0 + MR) x block b, k-steps [q0, q1) from those weights widened (ww) and the input
 * widened once per call (j->a16): per k-step and row a broadcast load, no widening op (1x1 convs with
 * K >= 64: 1.05-1.14x over a vpmovzxbw per row and k-step), no weight shuffles. One K loop: a second
 * one (bytes, where there is no a16) in this function spilled two accumulators out of both loops under
 * the libraries' #pragma GCC optimize("O3") (MobileNetV2 0.87x). G groups of 4 channels: 4, or 2 for a
 * block of 8 or fewer channels (half the vpmaddwd; N = 24, 40: a third of the block passes).
 * Accumulators start at zero (q0 == 0) or from saved (MR x 32 int32), and are saved (q1 < nk) or go to
 * the epilogue. */
REFCG_INLINE void refcg_tile_avx2w(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t q, int32_t c,
                                   const int16_t* ww, int64_t q0, int64_t q1, int64_t nk, int32_t* saved, const int MR,
                                   const int G) {
  const uint8_t* arow[REFCG_AVX2_MR_MAX];
  int64_t out_off[REFCG_AVX2_MR_MAX];
  refcg_job_rows_at(j, q, c, MR, arow, out_off);
  __m256i acc[REFCG_AVX2_MR_MAX][4];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < G; ++g)
      acc[r][g] = q0 == 0 ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i*)(saved + 32 * r + 8 * g));
  const int16_t* wp = ww;
  const int64_t len = j->seg_len;
  int32_t s = q0 ? (int32_t)(q0 * 4 / len) : 0; /* q0 is 0 but for chunks of a long K: no division per tile */
  for (int64_t k0 = q0 ? q0 * 4 % len : 0, left = (q1 - q0) * 4; left > 0; ++s, k0 = 0) {
    const int64_t k1 = len - k0 < left ? len : k0 + left;
    left -= k1 - k0;
    const uint16_t* x[REFCG_AVX2_MR_MAX]; /* 4 lanes of 16 bits: one 8-byte broadcast */
    for (int r = 0; r < MR; ++r) x[r] = j->a16 + (arow[r] - j->a) + j->seg_off[s];
    for (int64_t k = k0; k < k1; k += 4, wp += 64) {
      for (int r = 0; r < MR; ++r) {
        const __m256i a = _mm256_castpd_si256(_mm256_broadcast_sd((const double*)(x[r] + k)));
        for (int g = 0; g < G; ++g)
          acc[r][g] = _mm256_add_epi32(acc[r][g], _mm256_madd_epi16(a, _mm256_load_si256((const __m256i*)(wp + 16 * g))));
      }
    }
  }
  if (q1 < nk) {
    for (int r = 0; r < MR; ++r)
      for (int g = 0; g < G; ++g) _mm256_storeu_si256((__m256i*)(saved + 32 * r + 8 * g), acc[r][g]);
    return;
  }
  refcg_tile_epi_avx2(j, b, out_off, acc, MR, G);
}

/* Rows [r0, r1) of block nb by refcg_tile_avx2, 2 at a time: too few rows to repay refcg_tile_avx2w's
 * widening (dense 4x1024x1024: 6% slower). The tiles' three paths are functions of their own (not
 * inlined into refcg_tiles_avx2): their plan copies in one function took GCC a minute to compile. */
REFCG_INLINE void refcg_rows_flip_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0, int32_t r1,
                                       int32_t nb, const int FLIP) {
  for (int32_t i0 = r0; i0 < r1; i0 += 2) {
    if (r1 - i0 == 1)
      refcg_tile_avx2(j, b, i0, nb, 1, FLIP);
    else
      refcg_tile_avx2(j, b, i0, nb, 2, FLIP);
  }
}
static __attribute__((noinline)) void refcg_rows_avx2(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0,
                                                      int32_t r1, int32_t nb) {
  if (j->flip4)
    refcg_rows_flip_avx2(j, b, r0, r1, nb, 1);
  else
    refcg_rows_flip_avx2(j, b, r0, r1, nb, 0);
}

/* The last rows (fewer than a tile's) of refcg_rows_avx2w, the first at output row q, column c. */
REFCG_INLINE void refcg_tail_avx2w(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t q, int32_t c,
                                   const int16_t* ww, int64_t q0, int64_t q1, int64_t nk, int32_t* saved, int32_t rows,
                                   const int G) {
  switch (rows) { /* under the tile's rows: REFCG_AVX2_HALF_MR (G = 2) or REFCG_AVX2_MR */
    case 5: if (G == 2) refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved, 5, 2); break;
    case 4: if (G == 2) refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved, 4, 2); break;
    case 3: if (G == 2) refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved, 3, 2); break;
    case 2: refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved, 2, G); break;
    case 1: refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved, 1, G); break;
    default: break;
  }
}

/* Rows [r0, r1) of block nb: its weights are widened to int16 once per chunk of K (nk k-steps in
 * chunks of csz) into a stack buffer and reused by up to REFCG_AVX2_RG rows (a chunk of a long K: the
 * rows keep their accumulators in between). */
static __attribute__((noinline)) void refcg_rows_avx2w(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0,
                                                       int32_t r1, int32_t nb, int64_t nk, int64_t csz) {
  int16_t ww[REFCG_AVX2_WC * 64] __attribute__((aligned(32)));
  int32_t saved[REFCG_AVX2_RG * 32];
  const int8_t* w = j->w + (int64_t)nb * j->kp * 16;
  for (int32_t g0 = r0; g0 < r1; g0 += REFCG_AVX2_RG) {
    const int32_t g1 = r1 - g0 < REFCG_AVX2_RG ? r1 : g0 + REFCG_AVX2_RG;
    for (int64_t q0 = 0; q0 < nk; q0 += csz) {
      const int64_t q1 = nk - q0 < csz ? nk : q0 + csz;
      if (csz < nk || g0 == r0) refcg_widen_w_avx2(w + q0 * 64, q1 - q0, ww);
      int32_t i0 = g0, q = g0 / j->cols, c = g0 - q * j->cols; /* row i0 is output row q, column c */
      if (b->nvalid <= 8) {
        for (; i0 + REFCG_AVX2_HALF_MR <= g1; i0 += REFCG_AVX2_HALF_MR) {
          refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved + 32 * (i0 - g0), REFCG_AVX2_HALF_MR, 2);
          refcg_rows_advance(j, &q, &c, REFCG_AVX2_HALF_MR);
        }
        refcg_tail_avx2w(j, b, q, c, ww, q0, q1, nk, saved + 32 * (i0 - g0), g1 - i0, 2);
        continue;
      }
      for (; i0 + REFCG_AVX2_MR <= g1; i0 += REFCG_AVX2_MR) {
        refcg_tile_avx2w(j, b, q, c, ww, q0, q1, nk, saved + 32 * (i0 - g0), REFCG_AVX2_MR, 4);
        refcg_rows_advance(j, &q, &c, REFCG_AVX2_MR);
      }
      refcg_tail_avx2w(j, b, q, c, ww, q0, q1, nk, saved + 32 * (i0 - g0), g1 - i0, 4);
    }
  }
}

/* Whether refcg_tiles_avx2 may run blocks of j on refcg_rows_avx2w, which reads j->a16: rows beyond
 * one tile, blocks not all pair-safe, and k-steps the row kernels for few k-steps do not take. */
static int refcg_reads_a16_avx2(const refcg_gemm_job* j) {
  if (j->m <= 4 || j->nseg * j->seg_len < 4) return 0;
  if (refcg_smallk_of_avx2(j)) { /* they decline blocks of mixed plans (the job's first group decides) */
    refcg_blk_avx2 b[REFCG_AVX2_SMALLK_NB];
    const int32_t nblocks = (j->n + 15) / 16;
    if (refcg_smallk_plan_avx2(j, 0, nblocks < REFCG_AVX2_SMALLK_NB ? nblocks : REFCG_AVX2_SMALLK_NB, b) !=
        REFCG_PLAN_ANY)
      return 0;
  }
  for (int32_t nb = 0; nb * 16 < j->n; ++nb)
    if (!j->pair_safe || !j->pair_safe[nb]) return 1;
  return 0; /* every block on vpmaddubsw */
}

/* The rows [*r0, *r1) of block nb among tiles [t0, t1) (tile t = row pair t / nblocks, block t % nblocks);
 * 0 where there are none. */
REFCG_INLINE int refcg_block_rows_avx2(const refcg_gemm_job* j, int64_t t0, int64_t t1, int32_t nb, int32_t* r0,
                                       int32_t* r1) {
  int64_t rp0, rp1;
  refcg_rows_of_col(t0, t1, (j->n + 15) / 16, nb, &rp0, &rp1);
  *r0 = (int32_t)rp0 * REFCG_AVX2_TABLE_MR;
  *r1 = rp1 * REFCG_AVX2_TABLE_MR < j->m ? (int32_t)rp1 * REFCG_AVX2_TABLE_MR : j->m;
  return rp0 < rp1;
}

/* Tiles [t0, t1), per channel block: pair-safe blocks on vpmaddubsw (refcg_rows_avx2b), short row
 * ranges on refcg_tile_avx2, the rest on widened weights (refcg_rows_avx2w). */
static void refcg_tiles_avx2(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;
  const refcg_smallk_avx2_fn smallk = refcg_smallk_of_avx2(j);
  if (smallk && refcg_smallk_tiles_avx2(j, smallk, t0, t1)) return;
  const int32_t nblocks = (j->n + 15) / 16;
  const int64_t nk = (int64_t)j->nseg * j->seg_len / 4;
  const int64_t nchunks = nk > REFCG_AVX2_WC ? (nk + REFCG_AVX2_WC - 1) / REFCG_AVX2_WC : 1;
  const int64_t csz = (nk + nchunks - 1) / nchunks; /* chunks of equal size */
  for (int32_t nb = 0; nb < nblocks; ++nb) {
    int32_t r0, r1;
    if (!refcg_block_rows_avx2(j, t0, t1, nb, &r0, &r1)) continue;
    refcg_blk_avx2 b;
    refcg_blk_init_avx2(j, nb, &b);
    if (j->pair_safe && j->pair_safe[nb])
      refcg_rows_avx2b(j, &b, r0, r1, nb);
    else if (r1 - r0 <= 4 || nk == 0 || !j->a16) /* no a16: the workspace was short */
      refcg_rows_avx2(j, &b, r0, r1, nb);
    else
      refcg_rows_avx2w(j, &b, r0, r1, nb, nk, csz);
  }
}

/* refcg_gemm_config.flips: AVX2 XORs an int8 input as it widens it (refcg_widen_chunks: free) or per row
 * and k-step in the tiles that read bytes; the row kernels for few k-steps (K <= 48) take the copy: a
 * vpxor per row and k-step there ran 0.96-0.98x (1x1 16->96@112, 40->240@28). */
static int refcg_flips_avx2(int64_t k, int32_t n) {
  (void)n;
  return k > 4 * REFCG_AVX2_SMALLK_MAX;
}

/* ---- Winograd F(2x2, 3x3) (refcg_wino_job) ---- */
#define REFCG_WINO_MR 6 /* tiles per GEMM step: 6 x 2 accumulators, 2 weight vectors and the broadcast */

/* V = B^T d B of tiles [i0, i0 + nt) into v [16][nt][cp], 16 channels at a time (d widened to int16). */
static void refcg_wino_in_avx2(const refcg_wino_job* j, int64_t i0, int32_t nt, int16_t* v) {
  const int64_t cp = j->cp, plane = (int64_t)nt * cp, wp = j->wp;
  for (int32_t t = 0; t < nt; ++t) {
    const int64_t ty = (i0 + t) / j->tw, tx = (i0 + t) % j->tw;
    const uint8_t* base = j->a + (2 * ty * wp + 2 * tx) * cp;
    for (int64_t c = 0; c < cp; c += 16) {
      __m256i e[4][4]; /* B^T d */
      for (int s = 0; s < 4; ++s) {
        __m256i d[4];
        for (int r = 0; r < 4; ++r)
          d[r] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(base + (r * wp + s) * cp + c)));
        e[0][s] = _mm256_sub_epi16(d[0], d[2]);
        e[1][s] = _mm256_add_epi16(d[1], d[2]);
        e[2][s] = _mm256_sub_epi16(d[2], d[1]);
        e[3][s] = _mm256_sub_epi16(d[1], d[3]);
      }
      for (int r = 0; r < 4; ++r) { /* (B^T d) B: xi = 4 r + q */
        int16_t* o = v + 4 * r * plane + t * cp + c;
        _mm256_storeu_si256((__m256i*)o, _mm256_sub_epi16(e[r][0], e[r][2]));
        _mm256_storeu_si256((__m256i*)(o + plane), _mm256_add_epi16(e[r][1], e[r][2]));
        _mm256_storeu_si256((__m256i*)(o + 2 * plane), _mm256_sub_epi16(e[r][2], e[r][1]));
        _mm256_storeu_si256((__m256i*)(o + 3 * plane), _mm256_sub_epi16(e[r][1], e[r][3]));
      }
    }
  }
}

/* m [MR][16] = MR rows of v (cp int16 each) x one channel block of u ([cp / 2][16][2]): per channel
 * pair one broadcast and two vpmaddwd of 8 channels. */
REFCG_INLINE void refcg_wino_gemm_avx2(const int16_t* v, int64_t cp, const int16_t* u, int32_t* m, const int MR) {
  __m256i acc[REFCG_WINO_MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t c = 0; c < cp; c += 2, u += 32) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)u), w1 = _mm256_loadu_si256((const __m256i*)(u + 16));
    for (int r = 0; r < MR; ++r) {
      const __m256i a = _mm256_set1_epi32(refcg_load_i32((const uint8_t*)(v + r * cp + c)));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(a, w0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(a, w1));
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256((__m256i*)(m + 16 * r), acc[r][0]);
    _mm256_storeu_si256((__m256i*)(m + 16 * r + 8), acc[r][1]);
  }
}
/* refcg_wino_gemm_rows_avx2[MR]: the kernel for MR rows, a function of its own (REFCG_CONST_COPY) */
#define REFCG_WINO_GEMM_COPY_AVX2(MR)                                                                          \
  REFCG_CONST_COPY(refcg_wino_gemm_avx2, refcg_wino_gemm_avx2, (const int16_t* v, int64_t cp, const int16_t* u, \
                                                                int32_t* m), (v, cp, u, m), MR)
REFCG_WINO_GEMM_COPY_AVX2(1)
REFCG_WINO_GEMM_COPY_AVX2(2)
REFCG_WINO_GEMM_COPY_AVX2(3)
REFCG_WINO_GEMM_COPY_AVX2(4)
REFCG_WINO_GEMM_COPY_AVX2(5)
REFCG_WINO_GEMM_COPY_AVX2(6)
#undef REFCG_WINO_GEMM_COPY_AVX2
typedef void (*refcg_wino_gemm_fn)(const int16_t*, int64_t, const int16_t*, int32_t*);
static const refcg_wino_gemm_fn refcg_wino_gemm_rows_avx2[REFCG_WINO_MR + 1] = {
    NULL, refcg_wino_gemm_avx2_p1, refcg_wino_gemm_avx2_p2, refcg_wino_gemm_avx2_p3,
    refcg_wino_gemm_avx2_p4, refcg_wino_gemm_avx2_p5, refcg_wino_gemm_avx2_p6};

/* y = (A^T M A) >> 2 of nt tiles (m [16][nt][16] int32, channel block nbk) through the GEMM's epilogue. */
static void refcg_wino_out_avx2(const refcg_wino_job* j, const int32_t* m, int32_t nt, int64_t i0, int32_t nbk) {
  refcg_blk_avx2 b;
  refcg_blk_init_avx2(j->gemm, nbk, &b);
  for (int32_t t = 0; t < nt; ++t) {
    __m256i y[4][2]; /* pixels (0, 0), (0, 1), (1, 0), (1, 1) x channels 0-7, 8-15 */
    for (int h = 0; h < 2; ++h) {
      __m256i s[2][4]; /* A^T M */
      for (int q = 0; q < 4; ++q) {
        __m256i x[4];
        for (int r = 0; r < 4; ++r)
          x[r] = _mm256_loadu_si256((const __m256i*)(m + ((int64_t)(4 * r + q) * nt + t) * 16 + 8 * h));
        s[0][q] = _mm256_add_epi32(_mm256_add_epi32(x[0], x[1]), x[2]);
        s[1][q] = _mm256_sub_epi32(_mm256_sub_epi32(x[1], x[2]), x[3]);
      }
      for (int i = 0; i < 2; ++i) { /* (A^T M) A: exact multiples of 4 */
        y[2 * i][h] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(s[i][0], s[i][1]), s[i][2]), 2);
        y[2 * i + 1][h] = _mm256_srai_epi32(_mm256_sub_epi32(_mm256_sub_epi32(s[i][1], s[i][2]), s[i][3]), 2);
      }
    }
    const int64_t oy = 2 * ((i0 + t) / j->tw), ox = 2 * ((i0 + t) % j->tw);
    __m256i sum[4][2];
    int64_t out_off[4];
    int32_t rows = 0;
    for (int p = 0; p < 4; ++p) {
      if (oy + p / 2 >= j->out_h || ox + p % 2 >= j->out_w) continue; /* past an odd edge */
      sum[rows][0] = y[p][0];
      sum[rows][1] = y[p][1];
      out_off[rows++] = (oy + p / 2) * j->gemm->o_row_h + (ox + p % 2) * j->gemm->o_row_w;
    }
    refcg_tile_sums_epi_avx2(j->gemm, &b, out_off, sum, rows);
  }
}

/* Tasks [t0, t1): task t is tile block t / ngroups, channel group t % ngroups. A block's input
 * transform is kept for the task's next group. */
static void refcg_wino_avx2(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_wino_job* j = (const refcg_wino_job*)ctx;
  const int64_t tiles = (int64_t)j->th * j->tw, cp = j->cp;
  int16_t* v = (int16_t*)refcg_ws_alloc((size_t)16 * j->tb * (cp * sizeof(int16_t) + 16 * sizeof(int32_t)) + 64);
  if (!v) {
    __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  int32_t* m = (int32_t*)(v + (int64_t)16 * j->tb * cp);
  int64_t have = -1; /* the tile block v holds */
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t blk = t / j->ngroups, i0 = blk * j->tb;
    const int32_t nt = (int32_t)(tiles - i0 < j->tb ? tiles - i0 : j->tb);
    if (blk != have) refcg_wino_in_avx2(j, i0, nt, v);
    have = blk;
    const int32_t b0 = (int32_t)(t % j->ngroups) * j->gb, b1 = b0 + j->gb < j->nb ? b0 + j->gb : j->nb;
    for (int32_t nbk = b0; nbk < b1; ++nbk) {
      for (int xi = 0; xi < 16; ++xi) {
        const int16_t* vx = v + (int64_t)xi * nt * cp;
        const int16_t* ux = j->u + ((int64_t)xi * j->nb + nbk) * cp * 16;
        int32_t* mx = m + (int64_t)xi * nt * 16;
        for (int32_t r = 0; r < nt; r += REFCG_WINO_MR) {
          const int32_t rows = nt - r < REFCG_WINO_MR ? nt - r : REFCG_WINO_MR;
          refcg_wino_gemm_rows_avx2[rows](vx + (int64_t)r * cp, cp, ux, mx + 16 * r);
        }
      }
      refcg_wino_out_avx2(j, m, nt, i0, nbk);
    }
  }
  refcg_ws_free(v);
}

/* Input bytes of a depthwise job XOR j->flip (refcg_dw_config.flips): the ymm depthwise kernels flip what
 * they read through this, once per built column (bytes of rows past the kernel's then read 0x80 against
 * zero weights): one vpxor per load cost uint8 MobileNetV2 2% on AVX2. */
REFCG_INLINE __m128i refcg_dw_flip_avx2(const refcg_dw_job* j, __m128i v) {
  return _mm_xor_si128(v, _mm_set1_epi8((char)j->flip));
}

/* Tap pairs (refcg_dw_pair_weights): per pair, both taps' 16 channels widened to int16 and
 * interleaved, two vpmaddwd of 8 channels x 2 taps each (uint8 x int16 products: exact in int32). */
REFCG_INLINE void refcg_dw16_avx2(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  const int16_t* w = j->w + (int64_t)c0 * 2;
  const int32_t taps = j->kh * j->kw;
  for (int32_t t = 0; t < taps; t += 2, w += 2 * j->cp) {
    const __m256i a = _mm256_cvtepu8_epi16(refcg_dw_flip_avx2(j, _mm_loadu_si128((const __m128i*)(base + j->tap_off[t] + c0))));
    const __m256i b = _mm256_cvtepu8_epi16(refcg_dw_flip_avx2(j, _mm_loadu_si128((const __m128i*)(base + j->tap_off[t + 1] + c0))));
    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), _mm256_loadu_si256((const __m256i*)w)));
    hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), _mm256_loadu_si256((const __m256i*)(w + 16))));
  }
  _mm256_storeu_si256((__m256i*)acc, _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256((__m256i*)(acc + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* Kernel rows paired (kh, kh + 1; an odd last row with zero weights) instead of taps: per row pair
 * and input column, 8 channels of both rows interleaved and widened to int16 once, then shared by
 * the vpmaddwd of every pixel whose taps read that column (pixel q's tap kw is column q * S + kw):
 * PX pixels x 8 channels of one output row, kernel rows K taps wide, undilated along W, stride S.
 * vw: per row pair and kw, 8 channels x (w[kh], w[kh + 1]) as int16. acc starts at the correction. */
REFCG_INLINE void refcg_dw_cols_pair_avx2(const refcg_dw_job* j, const uint8_t* base, int64_t rowb, const int16_t* vw,
                                          __m256i* acc, const int two, const int K, const int PX, const int S) {
  REFCG_UNROLL
  for (int i = 0; i < (PX - 1) * S + K; ++i) {
    const __m128i x0 = _mm_loadl_epi64((const __m128i*)(base + (int64_t)i * j->cp));
    const __m128i x1 = two ? _mm_loadl_epi64((const __m128i*)(base + rowb + (int64_t)i * j->cp)) : _mm_setzero_si128();
    const __m256i col = _mm256_cvtepu8_epi16(refcg_dw_flip_avx2(j, _mm_unpacklo_epi8(x0, x1)));
    REFCG_UNROLL
    for (int q = 0; q < PX; ++q) {
      const int kw = i - q * S;
      if (kw >= 0 && kw < K)
        acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(col, _mm256_load_si256((const __m256i*)(vw + 16 * kw))));
    }
  }
}

/* Row quads (j->wq, refcg_dw_quad_weights) on ymm: kernel rows [4 g, 4 g + n) of one padded column's 8
 * channels (rows rowb bytes apart) as vpdpbusd lanes, channel c's n bytes in lane c (the rest 0, or 0x80
 * flipped: zero weights), XOR j->flip: the rows' bytes interleaved pairwise (rows 0, 1 and 2, 3), then the
 * pairs. */
REFCG_INLINE __m256i refcg_dw_quad_col_avx2(const refcg_dw_job* j, const uint8_t* x, int64_t rowb, const int n) {
  const __m128i r0 = _mm_loadl_epi64((const __m128i*)x);
  if (n == 1) return _mm256_cvtepu8_epi32(refcg_dw_flip_avx2(j, r0));
  const __m128i z = _mm_setzero_si128();
  const __m128i r1 = _mm_loadl_epi64((const __m128i*)(x + rowb));
  const __m128i r2 = n > 2 ? _mm_loadl_epi64((const __m128i*)(x + 2 * rowb)) : z;
  const __m128i r3 = n > 3 ? _mm_loadl_epi64((const __m128i*)(x + 3 * rowb)) : z;
  const __m128i p01 = _mm_unpacklo_epi8(r0, r1), p23 = _mm_unpacklo_epi8(r2, r3);
  const __m256i v = _mm256_set_m128i(_mm_unpackhi_epi16(p01, p23), _mm_unpacklo_epi16(p01, p23));
  return _mm256_xor_si256(v, _mm256_set1_epi8((char)j->flip));
}

/* The column kernel of a K x K kernel on row quads through dot (vpdpbusd): each padded column of the
 * PX pixels built once per group of 4 kernel rows feeds every tap that reads it, one vpdpbusd for up
 * to 4 taps where vpmaddwd did 2 (AVX-512's refcg_dwq_cols_avx512 on 8 channels). wq: the quads of
 * channel c0, [group][kw] cp * 4 bytes apart. */
REFCG_INLINE void refcg_dwq_cols_avx2(const refcg_dw_job* j, const uint8_t* base, int64_t rowb, const int8_t* wq,
                                      __m256i* acc, const int K, const int PX, const int S,
                                      __m256i (*dot)(__m256i, __m256i, __m256i)) {
  REFCG_UNROLL
  for (int g = 0; g < (K + 3) / 4; ++g) {
    const int n = K - 4 * g < 4 ? K - 4 * g : 4;
    REFCG_UNROLL
    for (int i = 0; i < (PX - 1) * S + K; ++i) {
      const __m256i col = refcg_dw_quad_col_avx2(j, base + 4 * g * rowb + (int64_t)i * j->cp, rowb, n);
      REFCG_UNROLL
      for (int kw = 0; kw < K; ++kw)
        if (i >= kw && (i - kw) % S == 0 && (i - kw) / S < PX)
          acc[(i - kw) / S] = dot(acc[(i - kw) / S], col,
                                  _mm256_loadu_si256((const __m256i*)(wq + (int64_t)(g * K + kw) * j->cp * 4)));
    }
  }
}

/* The column kernels' stores but the 4-pixel pack (channel tails, other outputs, REFCG_PLAN_ANY): px pixels
 * one at a time under any plan, out of line: inlined, the generic requantize made each kernel copy twice
 * as large (and the x86 core's compile that much longer) for shapes and plans networks rarely take. */
static __attribute__((noinline)) void refcg_dw_cols_store_px_avx2(const refcg_dw_job* j, const __m256i* acc,
                                                                  const refcg_rqv_avx2* r, int32_t c0, int32_t nvalid,
                                                                  int64_t out_off, int32_t px) {
  const refcg_epi* e = &j->epi;
  for (int32_t q = 0; q < px; ++q) {
    const __m256i v = refcg_rq_planned_avx2(e->rq, acc[q], r, REFCG_PLAN_ANY);
    const int64_t off = out_off + q * j->o_w;
    if (e->o_c == 1 && e->out_dtype != REFCG_S32) {
      refcg_store_bytes_avx2((uint8_t*)e->out + off + c0, v, nvalid); /* values are in range */
    } else {
      int32_t t[8];
      _mm256_storeu_si256((__m256i*)t, v);
      refcg_epi_store(e, t, c0, nvalid, off);
    }
  }
}

/* PX pixels x 8 channels from c0 (nvalid valid) of one output row at out_off: on row quads through dot
 * (wq), else on tap pairs (vw); then the requantize under plan and the stores. */
REFCG_INLINE void refcg_dw_cols_avx2(const refcg_dw_job* j, const uint8_t* base, int64_t rowb, const int16_t* vw,
                                     const int8_t* wq, int32_t c0, const refcg_rqv_avx2* r, __m256i corr, int64_t out_off,
                                     int32_t nvalid, const int K, const int PX, const int S, const int plan,
                                     __m256i (*dot)(__m256i, __m256i, __m256i)) {
  __m256i acc[8];
  for (int q = 0; q < PX; ++q) acc[q] = corr;
  if (dot) {
    refcg_dwq_cols_avx2(j, base, rowb, wq, acc, K, PX, S, dot);
  } else if (K == 3 && j->kh == 3) { /* 3x3: a row pair and a last row known (1.05-1.1x; 5x5 so 0.97x) */
    refcg_dw_cols_pair_avx2(j, base, rowb, vw, acc, 1, K, PX, S);
    refcg_dw_cols_pair_avx2(j, base + 2 * rowb, rowb, vw + 16 * K, acc, 0, K, PX, S);
  } else {
    for (int32_t kh = 0; kh < j->kh; kh += 2, base += 2 * rowb, vw += 16 * K)
      refcg_dw_cols_pair_avx2(j, base, rowb, vw, acc, kh + 1 < j->kh, K, PX, S);
  }
  const refcg_epi* e = &j->epi;
  if (plan != REFCG_PLAN_ANY && PX % 4 == 0 && nvalid == 8 && e->o_c == 1 &&
      (e->out_dtype == REFCG_S8 || e->out_dtype == REFCG_U8)) {
    const __m256i lo8 = _mm256_set1_epi8((char)e->rq->out_min), hi8 = _mm256_set1_epi8((char)e->rq->out_max);
    for (int q = 0; q < PX; q += 4) { /* 4 pixels: one pack, a 64-bit store each */
      __m256i v[4];
      for (int t = 0; t < 4; ++t) v[t] = refcg_rq_planned_unclamped_avx2(e->rq, acc[q + t], r, plan);
      const __m256i bytes = refcg_pack4_avx2(v, lo8, hi8, e->out_dtype == REFCG_U8);
      const __m128i b01 = _mm256_castsi256_si128(bytes), b23 = _mm256_extracti128_si256(bytes, 1);
      uint8_t* o = (uint8_t*)e->out + out_off + q * j->o_w + c0;
      _mm_storel_epi64((__m128i*)o, b01);
      _mm_storeh_pd((double*)(o + j->o_w), _mm_castsi128_pd(b01));
      _mm_storel_epi64((__m128i*)(o + 2 * j->o_w), b23);
      _mm_storeh_pd((double*)(o + 3 * j->o_w), _mm_castsi128_pd(b23));
    }
    return;
  }
  __m256i t[8]; /* a copy: acc's address taken would keep the kernel's accumulators in memory */
  for (int q = 0; q < PX; ++q) t[q] = acc[q];
  refcg_dw_cols_store_px_avx2(j, t, r, c0, nvalid, out_off, PX);
}

/* ROW(K, PX, S, MIN) for the column kernels' shapes (refcg_dw_cols_fit): 3- or 5-wide, stride 1 or 2,
 * 8 then 4 pixels at a time (the last 4 ending at the row's end: refcg_dw_next), then NARROW(K, S)
 * (the pixels left). */
#define REFCG_DW_COLS_SHAPE(ROW, NARROW, MIN, K, S) \
  do {                                              \
    ROW(K, 8, S, 8);                                \
    ROW(K, 4, S, MIN);                              \
    NARROW(K, S);                                   \
  } while (0)
#define REFCG_DW_COLS_SHAPES(ROW, NARROW, MIN)           \
  do {                                                   \
    if (j->kw == 3 && j->sw == 1)                        \
      REFCG_DW_COLS_SHAPE(ROW, NARROW, MIN, 3, 1);       \
    else if (j->kw == 3)                                 \
      REFCG_DW_COLS_SHAPE(ROW, NARROW, MIN, 3, 2);       \
    else if (j->sw == 1)                                 \
      REFCG_DW_COLS_SHAPE(ROW, NARROW, MIN, 5, 1);       \
    else                                                 \
      REFCG_DW_COLS_SHAPE(ROW, NARROW, MIN, 5, 2);       \
  } while (0)
#define REFCG_DW_NO_NARROW(K, S) (void)0 /* the caller's per-pixel kernel takes them */

/* Pixels [ow, out_w) of one output row with refcg_dw_cols_avx2, PX at a time (refcg_dw_next). */
#define REFCG_DW_COLS_AVX2_ROW(K, PX, S, MIN)                                                            \
  for (; ow + (PX) <= j->out_w; ow = refcg_dw_next(ow, j->out_w, PX, MIN))                               \
  refcg_dw_cols_avx2(j, row + ow * pstride, rowb, vw, wq, c0, r, corr, oh * j->o_h + ow * j->o_w, nvalid, K, PX, S, \
                     plan, dot)

/* the pixels a row's 4-pixel steps leave: 2, then 1 at a time */
#define REFCG_DW_COLS_AVX2_LEFT(K, S) \
  do {                                \
    REFCG_DW_COLS_AVX2_ROW(K, 2, S, 2); \
    REFCG_DW_COLS_AVX2_ROW(K, 1, S, 1); \
  } while (0)

/* Output rows [r0, r1) of channels [c0, c0 + nvalid) with refcg_dw_cols_avx2 under plan: on row quads
 * (wq) through dot, or (dot NULL) on tap pairs (vw). */
REFCG_INLINE void refcg_dw_cols_rows_avx2(const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int32_t nvalid,
                                          const int16_t* vw, const int8_t* wq, const refcg_rqv_avx2* r, __m256i corr,
                                          const int plan, __m256i (*dot)(__m256i, __m256i, __m256i)) {
  const int64_t rowb = (int64_t)j->dh * j->wp * j->cp, pstride = (int64_t)j->sw * j->cp;
  for (int64_t oh = r0; oh < r1; ++oh) {
    const uint8_t* row = refcg_dw_row(j, oh * j->sh) + c0;
    int32_t ow = 0;
    REFCG_DW_COLS_SHAPES(REFCG_DW_COLS_AVX2_ROW, REFCG_DW_COLS_AVX2_LEFT, 3);
  }
}

/* NAME[plan] (refcg_dw_ymm's rows): refcg_dw_cols_rows_avx2 copied per plan with dot DOT (NULL: tap pairs) */
typedef void (*refcg_dw_cols_rows_fn)(const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int32_t nvalid,
                                      const int16_t* vw, const int8_t* wq, const refcg_rqv_avx2* r, __m256i corr);
#define REFCG_DEFINE_DW_COLS_ROWS(NAME, DOT)                                                                     \
  REFCG_INLINE void NAME##_dot(const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int32_t nvalid,        \
                               const int16_t* vw, const int8_t* wq, const refcg_rqv_avx2* r, __m256i corr,       \
                               const int plan) {                                                                 \
    refcg_dw_cols_rows_avx2(j, r0, r1, c0, nvalid, vw, wq, r, corr, plan, DOT);                                  \
  }                                                                                                              \
  REFCG_DEFINE_BY_PLAN(NAME, NAME##_dot,                                                                         \
                       (const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int32_t nvalid, const int16_t* vw, \
                        const int8_t* wq, const refcg_rqv_avx2* r, __m256i corr),                                \
                       (j, r0, r1, c0, nvalid, vw, wq, r, corr))
REFCG_DEFINE_DW_COLS_ROWS(refcg_dw_cols_rows_by_plan_avx2, NULL)

#define REFCG_DW_COLS_AVX2_KH 8 /* kernel rows the column kernels take (the weights' stack buffer) */
#define REFCG_DW_BATCH_AVX2 32  /* 8-channel groups whose weights are built at once (20 KB of stack) */
#define REFCG_DW_L2_BYTES (256 << 10) /* a thread's input rows that stay in L2 (refcg_dw_avx2) */
#define REFCG_DW_CHUNK_BYTES (24 << 10) /* input rows of a chunk past L2 (12 KB the same, 48 KB 0.97x) */

/* Rows [r0, r1) of the job with the column kernels, per plan: quad_rows' on row quads where the variant has
 * them (AVX-VNNI; NULL: none) and j->wq is set, else refcg_dw_cols_rows_by_plan_avx2's on tap pairs; shapes
 * they do not take on the per-pixel kernel. */
REFCG_INLINE void refcg_dw_ymm(const refcg_dw_job* j, int64_t r0, int64_t r1, const refcg_dw_cols_rows_fn* quad_rows) {
  const int quads = quad_rows && j->wq;
  const refcg_dw_cols_rows_fn* rows = quads ? quad_rows : refcg_dw_cols_rows_by_plan_avx2;
  /* the column kernels: 3- and 5-wide rows, stride 1 or 2, a vector requantize */
  if (!(refcg_dw_cols_fit(j) && j->kh <= REFCG_DW_COLS_AVX2_KH && j->epi.rq_vector)) {
    refcg_dw_rows(j, r0, r1, refcg_dw16_avx2, refcg_epi_avx2);
    return;
  }
  int16_t vw[REFCG_DW_BATCH_AVX2][(REFCG_DW_COLS_AVX2_KH / 2) * 5 * 16] __attribute__((aligned(32)));
  refcg_rqv_avx2 rv[REFCG_DW_BATCH_AVX2];
  __m256i corr[REFCG_DW_BATCH_AVX2];
  int plan[REFCG_DW_BATCH_AVX2];
  /* an input past L2: rows in chunks whose input stays in L1 while every 8-channel group of a batch
   * passes over it (channel groups outermost streamed 96@112's 1.2 MB input from L3 once per group) */
  const int64_t row_bytes = (int64_t)j->sh * j->wp * j->cp;
  const int64_t chunk = (r1 - r0) * row_bytes <= REFCG_DW_L2_BYTES ? r1 - r0
                        : row_bytes >= REFCG_DW_CHUNK_BYTES ? 1 : REFCG_DW_CHUNK_BYTES / row_bytes;
  const int32_t ngroups = (j->c + 7) / 8;
  for (int32_t g0 = 0; g0 < ngroups; g0 += REFCG_DW_BATCH_AVX2) {
    const int32_t ng = ngroups - g0 < REFCG_DW_BATCH_AVX2 ? ngroups - g0 : REFCG_DW_BATCH_AVX2;
    for (int32_t g = 0; g < ng; ++g) { /* the batch's weights and constants, once per call */
      const int32_t c0 = (g0 + g) * 8, nvalid = j->c - c0 < 8 ? j->c - c0 : 8;
      for (int32_t kh = 0; !quads && kh < j->kh; kh += 2)
        for (int32_t kw = 0; kw < j->kw; ++kw)
          for (int32_t l = 0; l < 8; ++l) {
            int16_t* d = vw[g] + ((kh / 2 * j->kw + kw) * 8 + l) * 2;
            d[0] = j->w_taps[(int64_t)(kh * j->kw + kw) * j->cp + c0 + l];
            d[1] = kh + 1 < j->kh ? j->w_taps[(int64_t)((kh + 1) * j->kw + kw) * j->cp + c0 + l] : 0;
          }
      rv[g] = refcg_rqv_load_avx2(j->epi.rq, c0, nvalid, 1);
      corr[g] = _mm256_maskload_epi32(j->epi.corr + c0, refcg_lanes_avx2(nvalid));
      plan[g] = REFCG_PLAN_INDEX(refcg_rq_plan_avx2(j->epi.rq, &rv[g]));
    }
    for (int64_t q0 = r0; q0 < r1; q0 += chunk) {
      const int64_t q1 = r1 - q0 < chunk ? r1 : q0 + chunk;
      for (int32_t g = 0; g < ng; ++g) {
        const int32_t c0 = (g0 + g) * 8, nvalid = j->c - c0 < 8 ? j->c - c0 : 8;
        rows[plan[g]](j, q0, q1, c0, nvalid, vw[g], quads ? j->wq + (int64_t)c0 * 4 : NULL, &rv[g], corr[g]);
      }
    }
  }
}

static void refcg_dw_avx2(const void* ctx, int64_t r0, int64_t r1) {
  refcg_dw_ymm((const refcg_dw_job*)ctx, r0, r1, NULL);
}

/* Store 8 pixels (raw accumulators + correction) of one output row at off, n valid (o_w == 1). */
REFCG_INLINE void refcg_dwp_store_avx2(const refcg_epi* e, const refcg_rqv_avx2* r, __m256i acc, int32_t oc,
                                       int64_t off, int32_t n) {
  int32_t t[8];
  if (!e->rq_vector) {
    _mm256_storeu_si256((__m256i*)t, acc);
    for (int32_t l = 0; l < n; ++l) refcg_store(e->out, off + l, e->out_dtype, refcg_requantize_one(e->rq, t[l], oc));
    return;
  }
  const __m256i v = refcg_rq_apply_avx2(e->rq, acc, r);
  if (e->out_dtype == REFCG_S32) {
    const __m256i mask = refcg_lanes_avx2(n);
    _mm256_maskstore_epi32((int32_t*)e->out + off, mask, v);
    return;
  }
  refcg_store_bytes_avx2((uint8_t*)e->out + off, v, n);
}

/* Expand a padded row: per group and 8 pixels two 16-byte loads (pixels 0-3, 4-7) and vpshufb
 * put taps q = 0, 1 of each pixel zero-extended into the int16 pair of its lane. */
REFCG_INLINE void refcg_dwp_expand_avx2(const refcg_dwp_job* j, const uint8_t* row, int32_t* e) {
  const __m256i ctl = _mm256_loadu_si256((const __m256i*)j->ctl);
  const int32_t sw = j->p->stride_w, qdw = j->q * j->p->dilation_w, owp = j->owp;
  for (int32_t i = 0; i < j->g; ++i, row += qdw, e += owp)
    for (int32_t ow = 0; ow < owp; ow += 8) {
      const uint8_t* x = row + ow * sw;
      const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)x)),
                                                _mm_loadu_si128((const __m128i*)(x + 4 * sw)), 1);
      _mm256_store_si256((__m256i*)(e + ow), _mm256_shuffle_epi8(v, ctl));
    }
}

typedef struct {
  refcg_rqv_avx2 r;
  __m256i corr;
} refcg_dwpk_avx2;

typedef __m256i (*refcg_dot_avx2_fn)(__m256i acc, __m256i x, __m256i w);

/* vpmaddwd: the int16 pairs of x (taps zero-extended) times the weight pairs, exact in int32. */
REFCG_INLINE __m256i refcg_dot_madd_avx2(__m256i acc, __m256i x, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w));
}

/* NB blocks of 8 pixels: dot per kernel row and group. */
REFCG_INLINE void refcg_dwp_nb_avx2(const refcg_dwp_strip* s, const refcg_dwpk_avx2* k, int64_t lane_off, int64_t off,
                                    int32_t n, refcg_dot_avx2_fn dot, const int NB) {
  __m256i acc[4];
  for (int b = 0; b < NB; ++b) acc[b] = k->corr;
  const int32_t* e = s->e + lane_off;
  for (int32_t r = 0; r < s->kh; ++r, e += s->row_step)
    for (int32_t i = 0; i < s->g; ++i) {
      const __m256i w = _mm256_set1_epi32(s->words[r * s->g + i]);
      for (int b = 0; b < NB; ++b) acc[b] = dot(acc[b], _mm256_load_si256((const __m256i*)(e + i * s->owp + 8 * b)), w);
    }
  for (int b = 0; b < NB; ++b) refcg_dwp_store_avx2(&s->epi, &k->r, acc[b], s->oc, off + 8 * b, n - 8 * b < 8 ? n - 8 * b : 8);
}

REFCG_INLINE void refcg_dwp_blocks_avx2(const refcg_dwp_strip* s, const void* k, int64_t lane_off, int64_t off,
                                        int32_t n, int32_t nb) {
  REFCG_NB_SWITCH(nb, refcg_dwp_nb_avx2, s, (const refcg_dwpk_avx2*)k, lane_off, off, n, refcg_dot_madd_avx2);
}

/* The strip with 8-pixel blocks (AVX2 and AVX-VNNI). */
REFCG_INLINE void refcg_dwp_strip_ymm(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                      int32_t oh0, int32_t oh1, refcg_dwp_blocks_fn blocks) {
  const refcg_dwp_strip s = refcg_dwp_strip_of(j, e, words, oc);
  const refcg_dwpk_avx2 k = {refcg_rqv_load_avx2(s.epi.rq, oc, 8, 0), _mm256_set1_epi32(s.epi.corr[oc])};
  refcg_dwp_walk(j, &s, &k, oh0, oh1, 8, blocks);
}

REFCG_INLINE void refcg_dwp_strip_avx2(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                       int32_t oh0, int32_t oh1) {
  refcg_dwp_strip_ymm(j, e, words, oc, oh0, oh1, refcg_dwp_blocks_avx2);
}

static void refcg_dwp_avx2(const void* ctx, int64_t c0, int64_t c1) {
  refcg_dwp_channels((const refcg_dwp_job*)ctx, c0, c1, 16, refcg_dwp_expand_avx2, refcg_dwp_strip_avx2);
}

/* ---- qnn.add / subtract / mul: 32 elements per step, then 8 (see the AVX-512 version) ---- */
typedef struct {
  refcg_rqv_avx2 ra, rb;
  refcg_requant qa, qb;  /* the operands' requantize, copied: the byte stores could alias p's */
  __m256i pa, pb;        /* refcg_bin_preshift of each operand */
  __m256i azp, bzp, ozp; /* mul: the inputs' zero points; add / subtract: the output's */
  __m256i lo, hi, lo8, hi8; /* the output range (mul: qa's), as int32 and as bytes (refcg_pack4_avx2) */
  int plan, pre;
  int clamp_ab; /* add/subtract: the operands' requantize clamps (not to the whole int32 range) */
  int n32;      /* add/subtract: both operands' requantize in 32 bits (refcg_rq32; m32, c32, s32) */
  __m256i m32[2], c32[2], s32[2];
} refcg_binc_avx2;

/* Up to 8 8-bit elements at x (stride 1) or x[0] in every lane (stride 0) as int32. */
REFCG_INLINE __m256i refcg_bin_load_avx2(const uint8_t* x, int64_t stride, int32_t dtype, int64_t n) {
  if (stride == 0) return _mm256_set1_epi32(refcg_load(x, 0, dtype));
  uint64_t bytes = 0;
  memcpy(&bytes, x, (size_t)(n < 8 ? n : 8));
  const __m128i v = _mm_cvtsi64_si128((long long)bytes);
  return dtype == REFCG_S8 ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

/* Up to 8 elements under plan (a constant), before the output clamp: mul's product requantized once,
 * or add / subtract of both operands requantized (shifted first where pre). */
REFCG_INLINE __m256i refcg_bin_vec_avx2(const refcg_binc_avx2* k, const uint8_t* a, int64_t sa, int32_t adt,
                                        const uint8_t* b, int64_t sb, int32_t bdt, int64_t n, int32_t op,
                                        const int plan, const int pre) {
  __m256i x = refcg_bin_load_avx2(a, sa, adt, n), y = refcg_bin_load_avx2(b, sb, bdt, n);
  if (op == REFCG_BIN_MUL)
    return refcg_rq_planned_unclamped_avx2(
        &k->qa, _mm256_mullo_epi32(_mm256_sub_epi32(x, k->azp), _mm256_sub_epi32(y, k->bzp)), &k->ra, plan);
  __m256i qa, qb;
  if (plan == REFCG_PLAN_N32) {
    qa = _mm256_srav_epi32(_mm256_add_epi32(_mm256_mullo_epi32(x, k->m32[0]), k->c32[0]), k->s32[0]);
    qb = _mm256_srav_epi32(_mm256_add_epi32(_mm256_mullo_epi32(y, k->m32[1]), k->c32[1]), k->s32[1]);
  } else {
    if (pre) {
      x = _mm256_sllv_epi32(x, k->pa);
      y = _mm256_sllv_epi32(y, k->pb);
    }
    qa = refcg_rq_planned_unclamped_avx2(&k->qa, x, &k->ra, plan);
    qb = refcg_rq_planned_unclamped_avx2(&k->qb, y, &k->rb, plan);
  }
  if (k->clamp_ab) {
    qa = refcg_clamp_avx2(&k->qa, qa);
    qb = refcg_clamp_avx2(&k->qb, qb);
  }
  return op == REFCG_BIN_ADD ? _mm256_sub_epi32(_mm256_add_epi32(qa, qb), k->ozp) : _mm256_add_epi32(_mm256_sub_epi32(qa, qb), k->ozp);
}

/* n elements under plan: 32 per step packed and clamped as bytes at once, then 8 per step. */
REFCG_INLINE void refcg_bin_run_avx2(const refcg_bin_job* j, const refcg_binc_avx2* k, int64_t ia, int64_t ib, int64_t io,
                                     int64_t n, const int plan, const int pre) {
  const refcg_binary_params* p = j->p;
  const int64_t sa = j->as[j->ndim - 1], sb = j->bs[j->ndim - 1];
  const int32_t op = p->op, adt = p->a_dtype, bdt = p->b_dtype, u8 = p->out_dtype == REFCG_U8;
  const uint8_t* a = j->a + ia;
  const uint8_t* b = j->b + ib;
  uint8_t* out = j->out + io;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int q = 0; q < 4; ++q)
      v[q] = refcg_bin_vec_avx2(k, a + (i + 8 * q) * sa, sa, adt, b + (i + 8 * q) * sb, sb, bdt, 8, op, plan, pre);
    _mm256_storeu_si256((__m256i*)(out + i), refcg_pack4_avx2(v, k->lo8, k->hi8, u8));
  }
  for (; i < n; i += 8) {
    const __m256i v = refcg_bin_vec_avx2(k, a + i * sa, sa, adt, b + i * sb, sb, bdt, n - i, op, plan, pre);
    refcg_store_bytes_avx2(out + i, _mm256_max_epi32(_mm256_min_epi32(v, k->hi), k->lo), n - i);
  }
}

REFCG_INLINE void refcg_bin_row_avx2(const refcg_bin_job* j, const void* ctx, int64_t ia, int64_t ib, int64_t io,
                                     int64_t n) {
  const refcg_binc_avx2* k = (const refcg_binc_avx2*)ctx;
  if (k->n32) {
    refcg_bin_run_avx2(j, k, ia, ib, io, n, REFCG_PLAN_N32, 0);
    return;
  }
  if (k->pre) {
    refcg_bin_run_avx2(j, k, ia, ib, io, n, REFCG_PLAN_I64_UP, 1);
    return;
  }
#define REFCG_BIN_RUN_AVX2(q) refcg_bin_run_avx2(j, k, ia, ib, io, n, q, 0)
  REFCG_WITH_PLAN(k->plan, REFCG_BIN_RUN_AVX2);
#undef REFCG_BIN_RUN_AVX2
}

/* refcg_quantize_one on 8 lanes: roundf (half away from zero) as trunc plus the sign where the
 * dropped fraction is >= 0.5 (y - trunc(y) is exact); the clamp keeps a NaN for the conversion,
 * as the scalar comparisons do. */
REFCG_INLINE void refcg_quant_run_avx2(const refcg_quantize_params* p, const float* in, uint8_t* out, int64_t c,
                                       int64_t i0, int64_t i1) {
  const float lo_f = p->quant_dtype == REFCG_U8 ? 0.0f : -128.0f, hi_f = p->quant_dtype == REFCG_U8 ? 255.0f : 127.0f;
  const __m256 s = _mm256_set1_ps(p->scale[c]), zp = _mm256_set1_ps((float)p->zero_point[c]);
  const __m256 lo = _mm256_set1_ps(lo_f), hi = _mm256_set1_ps(hi_f), half = _mm256_set1_ps(0.5f);
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256 y = p->multiply ? _mm256_mul_ps(x, s) : _mm256_div_ps(x, s);
    const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(y, t)), half, _CMP_GE_OQ);
    __m256 v = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(y, sign), one)));
    v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_add_ps(v, zp)));
    refcg_store_bytes_avx2(out + i, _mm256_cvttps_epi32(v), 8);
  }
  for (; i < i1; ++i)
    refcg_store(out, i, p->quant_dtype, refcg_quantize_one(in[i], p->scale[c], p->multiply, p->zero_point[c], p->quant_dtype));
}

static void refcg_quant_avx2(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_quant_job* j = (const refcg_quant_job*)ctx;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t i0, i1;
    const int64_t c = refcg_quant_chunk(j, t, &i0, &i1);
    refcg_quant_run_avx2(j->p, j->in, j->out, c, i0, i1);
  }
}

/* 16 channels from c0 of a pixel of refcg_pool_pixel_avx2 (MAX, S8, S32 as there; r: 1 / px->div). */
REFCG_INLINE void refcg_pool16_avx2(const refcg_pool_px* px, int64_t c0, __m256i flip, __m256 r, const int MAX,
                                    const int S8, const int S32) {
  if (MAX) {
    __m128i top = _mm_setzero_si128(); /* the dtype minimum in the unsigned domain */
    for (int32_t t = 0; t < px->ntaps; ++t)
      top = _mm_max_epu8(top, _mm_xor_si128(_mm_loadu_si128((const __m128i*)(px->in + px->taps[t] + c0)),
                                            _mm256_castsi256_si128(flip)));
    _mm_storeu_si128((__m128i*)(px->out + c0), _mm_xor_si128(top, _mm256_castsi256_si128(flip)));
    return;
  }
  const __m256 away = _mm256_set1_ps(REFCG_POOL_AWAY);
  __m256i sum = _mm256_setzero_si256();
  for (int32_t t = 0; t < px->ntaps; ++t) {
    const __m128i b = _mm_loadu_si128((const __m128i*)(px->in + px->taps[t] + c0));
    sum = _mm256_add_epi16(sum, S8 ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b));
  }
  __m256i v[2];
  for (int h = 0; h < 2; ++h) {
    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
                                       h ? _mm256_extracti128_si256(sum, 1) : _mm256_castsi256_si128(sum))), r);
    v[h] = _mm256_cvttps_epi32(_mm256_add_ps(f, _mm256_or_ps(away, _mm256_and_ps(f, _mm256_set1_ps(-0.0f)))));
    if (S32) _mm256_storeu_si256((__m256i*)((int32_t*)px->out + c0 + 8 * h), v[h]);
  }
  if (!S32) { /* averages of bytes fit the dtype: packs keep them */
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
    const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    _mm_storeu_si128((__m128i*)(px->out + c0), S8 ? _mm_packs_epi16(lo, hi) : _mm_packus_epi16(lo, hi));
  }
}

/* refcg_pool_pixel_avx512 on AVX2: max pools 32 channels per step, then 16; averages 16 (one ymm of int16
 * sums); the last channels (fewer than 16) as the 16 that end the pixel, again (the output is not the
 * input: the channels both steps hold get the same values), or on refcg_pool_pixel_from under 16. */
REFCG_INLINE void refcg_pool_pixel_avx2(const refcg_pool_job* j, const refcg_pool_px* px, const int MAX, const int S8,
                                        const int S32) {
  const int64_t channels = j->p->channels, c16 = channels & ~(int64_t)15;
  const __m256i flip = _mm256_set1_epi8((char)j->flip);
  int64_t c0 = 0;
  for (; MAX && c0 + 32 <= channels; c0 += 32) {
    __m256i top = _mm256_setzero_si256(); /* the dtype minimum in the unsigned domain */
    for (int32_t t = 0; t < px->ntaps; ++t)
      top = _mm256_max_epu8(top, _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(px->in + px->taps[t] + c0)), flip));
    _mm256_storeu_si256((__m256i*)(px->out + c0), _mm256_xor_si256(top, flip));
  }
  const __m256 r = _mm256_set1_ps(MAX ? 1.0f : 1.0f / px->div);
  for (; c0 < c16; c0 += 16) refcg_pool16_avx2(px, c0, flip, r, MAX, S8, S32);
  if (c16 < channels && channels >= 16)
    refcg_pool16_avx2(px, channels - 16, flip, r, MAX, S8, S32);
  else if (c16 < channels)
    refcg_pool_pixel_from(j, px, c16);
}

REFCG_DEFINE_POOL_PIXELS(avx2)

/* refcg_reduce_rows8_fn: 32 lanes at a time in four registers of 8 int32 sums, then 8. */
#define REFCG_REDUCE_ROWS_AVX2(G, CVT)                                                            \
  do {                                                                                            \
    __m256i s_[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),      \
                     _mm256_setzero_si256()};                                                     \
    const uint8_t* p_ = x + i;                                                                    \
    for (int64_t r = 0; r < rows; ++r, p_ += stride)                                              \
      for (int g = 0; g < (G); ++g)                                                               \
        s_[g] = _mm256_add_epi32(s_[g], CVT(_mm_loadl_epi64((const __m128i*)(p_ + 8 * g))));       \
    for (int g = 0; g < (G); ++g)                                                                 \
      _mm256_storeu_si256((__m256i*)(acc + i + 8 * g),                                            \
                          _mm256_add_epi32(_mm256_loadu_si256((const __m256i*)(acc + i + 8 * g)), s_[g])); \
  } while (0)

static int64_t refcg_reduce_rows8_avx2(const uint8_t* x, int64_t stride, int64_t rows, int is_signed, uint32_t* acc,
                                       int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (is_signed)
      REFCG_REDUCE_ROWS_AVX2(4, _mm256_cvtepi8_epi32);
    else
      REFCG_REDUCE_ROWS_AVX2(4, _mm256_cvtepu8_epi32);
  }
  for (; i + 8 <= n; i += 8) {
    if (is_signed)
      REFCG_REDUCE_ROWS_AVX2(1, _mm256_cvtepi8_epi32);
    else
      REFCG_REDUCE_ROWS_AVX2(1, _mm256_cvtepu8_epi32);
  }
  return i;
}

static void refcg_reduce_avx2(const void* ctx, int64_t t0, int64_t t1) {
  refcg_reduce_run_chunks((const refcg_reduce_job*)ctx, t0, t1, refcg_reduce_rows8_avx2);
}

/* refcg_bin_preshift on r (see refcg_bin_preshift_avx512); the shift count in every lane. */
REFCG_INLINE __m256i refcg_bin_preshift_avx2(const refcg_requant* rq, refcg_rqv_avx2* r) {
  const int32_t l1 = refcg_bin_preshift(rq);
  const int ok = l1 && refcg_rq_fold_avx2(r, (int32_t)((uint32_t)rq->input_zp << l1), rq->output_zp);
  if (ok) r->general = 0;
  return _mm256_set1_epi32(ok ? l1 : 0);
}

/* ---- table lookups (refcg_lut_job), 32 bytes per step. vpshufb reads 16 entries and yields 0 where
 * the index has bit 7; a saturating add of 16 * (7 - h) sets it exactly in the bytes above row h of
 * their half (x < 128; x ^ 0x80 for the other) and keeps the low nibble in the others. So stage h
 * reaches rows g <= h, and XORing the stages of tables D_h = T_h ^ T_h+1 (D_7 = T_7, per half)
 * telescopes to T_g: 16 vpshufb, 16 vpaddusb and 15 vpxor per step, no compares or blends (a compare
 * and a blend per row ran 0.64 cycles per byte on Zen 4, this 0.53: EfficientNet-B0's swish) ---- */
/* V steps of 32 bytes from in to out: per stage h the two tables loaded once for the V steps (16 ymm
 * registers do not hold the 16 tables: spilled, they were reloaded for every step) */
REFCG_INLINE void refcg_lut_steps_avx2(const __m256i* d, const uint8_t* in, uint8_t* out, const int V) {
  const __m256i top = _mm256_set1_epi8((char)0x80);
  __m256i lo[2], hi[2], acc[2];
  for (int v = 0; v < V; ++v) {
    lo[v] = _mm256_loadu_si256((const __m256i*)(in + 32 * v));
    hi[v] = _mm256_xor_si256(lo[v], top);
    acc[v] = _mm256_xor_si256(_mm256_shuffle_epi8(d[7], lo[v]), _mm256_shuffle_epi8(d[15], hi[v]));
  }
  for (int h = 6; h >= 0; --h) {
    const __m256i c = _mm256_set1_epi8((char)(16 * (7 - h))), dl = d[h], dh = d[8 + h];
    for (int v = 0; v < V; ++v)
      acc[v] = _mm256_xor_si256(acc[v], _mm256_xor_si256(_mm256_shuffle_epi8(dl, _mm256_adds_epu8(lo[v], c)),
                                                         _mm256_shuffle_epi8(dh, _mm256_adds_epu8(hi[v], c))));
  }
  for (int v = 0; v < V; ++v) _mm256_storeu_si256((__m256i*)(out + 32 * v), acc[v]);
}

static void refcg_lut_bytes_avx2(const uint8_t* table, const uint8_t* in, uint8_t* out, int64_t n) {
  __m256i d[16];
  for (int h = 0; h < 16; ++h) {
    const __m128i row = _mm_loadu_si128((const __m128i*)(table + 16 * h));
    d[h] = _mm256_broadcastsi128_si256(h % 8 == 7 ? row : _mm_xor_si128(row, _mm_loadu_si128((const __m128i*)(table + 16 * h + 16))));
  }
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) refcg_lut_steps_avx2(d, in + i, out + i, 2);
  for (; i + 32 <= n; i += 32) refcg_lut_steps_avx2(d, in + i, out + i, 1);
  for (; i < n; ++i) out[i] = table[in[i]];
}

static void refcg_lut_avx2(const void* ctx, int64_t t0, int64_t t1) {
  refcg_lut_tasks((const refcg_lut_job*)ctx, t0, t1, refcg_lut_bytes_avx2);
}

/* refcg_rq32 of one 8-bit operand (see refcg_bin_rq32_avx512), checked against refcg_rq_unclamped_avx2. */
REFCG_INLINE int refcg_bin_rq32_avx2(const refcg_requant* rq, const refcg_rqv_avx2* r, int32_t dtype, __m256i* m,
                                     __m256i* c, __m256i* s) {
  const int32_t lo = dtype == REFCG_S8 ? -128 : 0;
  refcg_rq32 f;
  for (int variant = 0; variant < REFCG_RQ32_VARIANTS; ++variant) {
    if (!refcg_rq32_candidate(rq, lo, variant, &f)) continue;
    *m = _mm256_set1_epi32(f.m);
    *c = _mm256_set1_epi32(f.c);
    *s = _mm256_set1_epi32(f.s);
    __m256i differ = _mm256_setzero_si256();
    for (int32_t x0 = lo; x0 < lo + 256; x0 += 8) {
      const __m256i x = _mm256_add_epi32(_mm256_set1_epi32(x0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256i q = _mm256_srav_epi32(_mm256_add_epi32(_mm256_mullo_epi32(x, *m), *c), *s);
      differ = _mm256_or_si256(differ, _mm256_xor_si256(refcg_rq_unclamped_avx2(rq, x, r), q));
    }
    if (_mm256_testz_si256(differ, differ)) return 1;
  }
  return 0;
}

static void refcg_bin_avx2(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_bin_job* j = (const refcg_bin_job*)ctx;
  const refcg_binary_params* p = j->p;
  refcg_binc_avx2 k;
  k.ra = refcg_rqv_load8_avx2(&p->rq_a, 0, 8, 0, p->op != REFCG_BIN_MUL); /* mul: a product, not 8-bit */
  k.rb = refcg_rqv_load8_avx2(&p->rq_b, 0, 8, 0, 1);
  k.qa = p->rq_a;
  k.qb = p->rq_b;
  int32_t lo, hi;
  refcg_bin_out_range(p, &lo, &hi);
  k.azp = _mm256_set1_epi32(p->a_zp);
  k.bzp = _mm256_set1_epi32(p->b_zp);
  k.ozp = _mm256_set1_epi32(p->out_zp);
  k.lo = _mm256_set1_epi32(lo);
  k.hi = _mm256_set1_epi32(hi);
  k.lo8 = _mm256_set1_epi8((char)lo);
  k.hi8 = _mm256_set1_epi8((char)hi);
  k.clamp_ab = refcg_bin_clamps_operands(p);
  k.n32 = p->op != REFCG_BIN_MUL && refcg_bin_rq32_avx2(&k.qa, &k.ra, p->a_dtype, &k.m32[0], &k.c32[0], &k.s32[0]) &&
          refcg_bin_rq32_avx2(&k.qb, &k.rb, p->b_dtype, &k.m32[1], &k.c32[1], &k.s32[1]);
  k.plan = p->op == REFCG_BIN_MUL ? refcg_rq_plan_avx2(&k.qa, &k.ra)
                                  : REFCG_PLAN_MEET(refcg_rq_plan_avx2(&k.qa, &k.ra), refcg_rq_plan_avx2(&k.qb, &k.rb));
  /* add/subtract: an operand that shifts first, where both then take the int64 right-shift plan */
  refcg_binc_avx2 s = k;
  s.pa = refcg_bin_preshift_avx2(&s.qa, &s.ra);
  s.pb = refcg_bin_preshift_avx2(&s.qb, &s.rb);
  s.pre = p->op != REFCG_BIN_MUL && (s.ra.general != k.ra.general || s.rb.general != k.rb.general) &&
          REFCG_PLAN_MEET(refcg_rq_plan_avx2(&s.qa, &s.ra), refcg_rq_plan_avx2(&s.qb, &s.rb)) == REFCG_PLAN_I64_UP;
  k.pre = 0;
  refcg_bin_rows(j, s.pre ? &s : &k, r0, r1, refcg_bin_row_avx2);
}

/* ---- 8-bit gathers along the last axis (refcg_gather_job): with AVX512-VBMI, each 64-byte output
 * chunk is a two-table byte permute (vpermi2b) of each 128-byte window of the input row it reads, the
 * windows blended by the lanes reading them; without VBMI, 16-byte windows (vpshufb) or bytes ---- */
REFCG_INLINE __mmask64 refcg_mask64(int64_t n) {
  return n >= 64 ? ~(__mmask64)0 : n <= 0 ? (__mmask64)0 : (((__mmask64)1 << n) - 1);
}

__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi"))) static void
refcg_gather_vbmi(const refcg_gather_job* j, int64_t r0, int64_t r1) {
  const int64_t windows = (j->size + 127) / 128, chunks = (j->n + 63) / 64;
  int64_t index[REFCG_COPY_MAX_DIMS];
  int64_t at = refcg_gather_first(j->p, r0, index);
  for (int64_t r = r0; r < r1; ++r, at = refcg_gather_next(j->p, at, index)) {
    __m512i q[REFCG_GATHER_MAX / 64];
    for (int64_t h = 0; h < 2 * windows; ++h) q[h] = _mm512_maskz_loadu_epi8(refcg_mask64(j->size - 64 * h), j->in + at + 64 * h);
    for (int64_t k = 0; k < chunks; ++k) {
      const __m512i idx = _mm512_loadu_si512(j->idx + 64 * k);
      __m512i v = _mm512_permutex2var_epi8(q[0], idx, q[1]);
      for (int64_t w = 1; w < windows; ++w)
        v = _mm512_mask_blend_epi8(j->window[k][w], v, _mm512_permutex2var_epi8(q[2 * w], idx, q[2 * w + 1]));
      _mm512_mask_storeu_epi8(j->out + r * j->n + 64 * k, refcg_mask64(j->n - 64 * k), v);
    }
  }
}

/* refcg_gather_chunk_fn through vpshufb (index bytes 0x80: zero). */
REFCG_INLINE void refcg_gather_chunk_avx2(const refcg_gather_job* j, const uint8_t* in, int64_t k, uint8_t* dst) {
  __m128i v = _mm_setzero_si128();
  for (int32_t w = 0; w < j->nwin16[k]; ++w)
    v = _mm_or_si128(v, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(in + j->win16_at[k][w])),
                                         _mm_loadu_si128((const __m128i*)j->win16_idx[k][w])));
  _mm_storeu_si128((__m128i*)dst, v);
}

static void refcg_gather_avx2(const void* ctx, int64_t t0, int64_t t1) {
  refcg_gather_tasks(ctx, t0, t1, refcg_gather_chunk_avx2);
}

/* ... with VBMI's permutes where the CPU has them (then no windows are built). */
static void refcg_gather_avx512(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gather_job* j = (const refcg_gather_job*)ctx;
  int64_t r0, r1;
  refcg_gather_range(j, t0, t1, &r0, &r1);
  if (__builtin_cpu_supports("avx512vbmi"))
    refcg_gather_vbmi(j, r0, r1);
  else
    refcg_gather_avx2(ctx, t0, t1);
}

/* refcg_isa_config.gather_by16: the AVX-512 variant permutes with VBMI, the windows without it. */
static int refcg_cpu_lacks_vbmi(void) { return !__builtin_cpu_supports("avx512vbmi"); }

/* ---- qnn.requantize of 8-bit or int32 rows (refcg_rq_job): 32 elements per step (one pack), then 8, under the plan ---- */
/* Up to 8 elements of a qnn.requantize input from element i: 8-bit (as a binary operand) or int32. */
REFCG_INLINE __m256i refcg_rq_load_avx2(const uint8_t* in, int64_t i, int32_t dtype, int64_t n) {
  if (dtype == REFCG_S32) return _mm256_maskload_epi32((const int*)in + i, refcg_lanes_avx2(n < 8 ? (int32_t)n : 8));
  return refcg_bin_load_avx2(in + i, 1, dtype, n);
}

/* m (<= 8) elements from element i of a refcg_rq_run_avx2 row, stored clamped. */
REFCG_INLINE void refcg_rq_8_avx2(const refcg_requant* rq, const refcg_rqv_avx2* r, __m256i count, const uint8_t* in,
                                  int32_t dtype, uint8_t* out, int64_t i, int64_t m, const int plan, const int pre) {
  __m256i x = refcg_rq_load_avx2(in, i, dtype, m);
  if (pre) x = _mm256_sllv_epi32(x, count);
  refcg_store_bytes_avx2(out + i, refcg_rq_planned_avx2(rq, x, r, plan), m);
}

/* A row of n elements: 32 per step (one pack), the last 32 again where a tail is left (the output is
 * not the input: elements both steps hold get the same bytes); rows under 32: 8 per step, the last 8
 * again, a row under 8 partial. */
REFCG_INLINE void refcg_rq_run_avx2(const refcg_requant* rq, const refcg_rqv_avx2* r, __m256i count, const uint8_t* in,
                                    int32_t dtype, uint8_t* out, int64_t n, int is_unsigned, const int plan, const int pre) {
  const __m256i lo8 = _mm256_set1_epi8((char)rq->out_min), hi8 = _mm256_set1_epi8((char)rq->out_max);
  if (n < 32) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) refcg_rq_8_avx2(rq, r, count, in, dtype, out, i, 8, plan, pre);
    if (i < n) refcg_rq_8_avx2(rq, r, count, in, dtype, out, n >= 8 ? n - 8 : 0, n >= 8 ? 8 : n, plan, pre);
    return;
  }
  for (int64_t i = 0; i < n; i += 32) {
    i = i + 32 <= n ? i : n - 32;
    __m256i v[4];
    for (int q = 0; q < 4; ++q) {
      __m256i x = refcg_rq_load_avx2(in, i + 8 * q, dtype, 8);
      if (pre) x = _mm256_sllv_epi32(x, count);
      v[q] = refcg_rq_planned_unclamped_avx2(rq, x, r, plan);
    }
    _mm256_storeu_si256((__m256i*)(out + i), refcg_pack4_avx2(v, lo8, hi8, is_unsigned));
  }
}

static void refcg_requantize_avx2(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_rq_job* j = (const refcg_rq_job*)ctx;
  const refcg_requantize_params* p = j->p;
  refcg_requant rq = p->rq;
  const int narrow = p->in_dtype != REFCG_S32;
  refcg_rqv_avx2 r = refcg_rqv_load8_avx2(&rq, 0, 8, 0, narrow);
  const int plan = refcg_rq_plan_avx2(&rq, &r);
  /* 8-bit input: as a binary operand (int32: the right-shift plan without a shift first) */
  const __m256i count = narrow ? refcg_bin_preshift_avx2(&rq, &r) : _mm256_setzero_si256();
  const int pre = plan != refcg_rq_plan_avx2(&rq, &r);
  for (int64_t t = t0; t < t1; ++t) {
    int64_t i0, i1;
    const int64_t row = refcg_rq_chunk(j, t, &i0, &i1);
    const uint8_t* in = j->in + (row * j->n + i0) * (narrow ? 1 : 4);
    uint8_t* out = j->out + row * p->out_outer_stride + p->out_offset + i0;
    const int u8 = p->out_dtype == REFCG_U8;
    if (pre) {
      refcg_rq_run_avx2(&rq, &r, count, in, p->in_dtype, out, i1 - i0, u8, REFCG_PLAN_I64_UP, 1);
      continue;
    }
#define REFCG_RQ_RUN_AVX2(q) refcg_rq_run_avx2(&rq, &r, count, in, p->in_dtype, out, i1 - i0, u8, q, 0)
    REFCG_WITH_PLAN(plan, REFCG_RQ_RUN_AVX2);
#undef REFCG_RQ_RUN_AVX2
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ================= AVX-VNNI: vpdpbusd on ymm, 6 rows x 16 channels ================= */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#endif

/* acc + the dot products of 4 unsigned bytes of x and 4 signed bytes of w per lane: vpdpbusd ymm, VEX-encoded
 * (AVX-VNNI). REFCG_AVXVNNI_AS_EVEX (test builds on hosts with AVX-512 VNNI and no AVX-VNNI, where
 * QEMU cannot stand in either: its TCG lacks AVX-VNNI): the same instruction EVEX-encoded (AVX512VL,
 * the assembler's default for the mnemonic), on the registers 0-15 the VEX form has, so that the
 * variant's code runs unchanged there. */
#if defined(REFCG_AVXVNNI_AS_EVEX)
REFCG_INLINE __m256i refcg_dpbusd_avxvnni(__m256i acc, __m256i x, __m256i w) {
  __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(x), "x"(w));
  return acc;
}
#else
REFCG_INLINE __m256i refcg_dpbusd_avxvnni(__m256i acc, __m256i x, __m256i w) { return _mm256_dpbusd_avx_epi32(acc, x, w); }
#endif

#define REFCG_AVXVNNI_MR 6 /* 6 x 2 accumulators, 2 weights and the broadcast input: 15 of 16 ymm registers */

static __attribute__((noinline)) void refcg_rows_avxvnni(const refcg_gemm_job* j, const refcg_blk_avx2* b, int32_t r0,
                                                         int32_t r1, int32_t nb) {
  if (j->flip4)
    refcg_rows_dot_avx2(j, b, r0, r1, nb, REFCG_AVXVNNI_MR, refcg_dpbusd_avxvnni, 1);
  else
    refcg_rows_dot_avx2(j, b, r0, r1, nb, REFCG_AVXVNNI_MR, refcg_dpbusd_avxvnni, 0);
}

REFCG_DEFINE_SMALLK_YMM(refcg_smallk4_avxvnni, 4, 1, refcg_dpbusd_avxvnni)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk6_avxvnni, 6, 1, refcg_dpbusd_avxvnni)
REFCG_DEFINE_SMALLK_YMM(refcg_smallk8_avxvnni, 8, 1, refcg_dpbusd_avxvnni)
#undef REFCG_SMALLK_AVX2_CALL
#undef REFCG_DEFINE_SMALLK_YMM
/* The row kernels win where the output is wide and K short (16->96 at 112x112 1.29x, 24->144 1.07x,
 * 32->192 1.05x over the tiles); they read a weight per vpdpbusd where the 6-row tiles read one per 6,
 * so 10 k-steps and more, the padded 3x3 stem and 16 channels or fewer ran 0.86-0.98x: tiles. */
static const refcg_smallk_avx2_fn refcg_smallks_avxvnni[] = {refcg_smallk4_avxvnni, refcg_smallk6_avxvnni,
                                                             refcg_smallk8_avxvnni, NULL, NULL, NULL};

/* Tiles [t0, t1) as AVX2 counts them (REFCG_AVX2_TABLE_MR-row units): few k-steps on AVX2's row
 * kernels (refcg_smallk_tiles_avx2), every other block on the AVX2 pair-safe tile, both with
 * vpdpbusd: the same loads, epilogue and stores, one instruction per 4-byte product. */
static void refcg_tiles_avxvnni(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;
  const refcg_smallk_avx2_fn smallk = j->n > 16 ? refcg_smallk_pick(j, refcg_smallks_avxvnni) : NULL;
  if (smallk && refcg_smallk_tiles_avx2(j, smallk, t0, t1)) return;
  for (int32_t nb = 0; nb * 16 < j->n; ++nb) {
    int32_t r0, r1;
    if (!refcg_block_rows_avx2(j, t0, t1, nb, &r0, &r1)) continue;
    refcg_blk_avx2 b;
    refcg_blk_init_avx2(j, nb, &b);
    refcg_rows_avxvnni(j, &b, r0, r1, nb);
  }
}

/* refcg_gemm_config.flips: AVX-VNNI's tiles pay a vpxor per row and k-step on each pass of a 16-channel
 * block, the copy once: in place for up to 4 blocks (1x1 144->24@56 int8 1.11x, 256->64 1.05x; 128->512
 * 0.94x), not where the row kernels for few k-steps (more than 16 channels, K <= 32) take the conv. */
static int refcg_flips_avxvnni(int64_t k, int32_t n) {
  return n <= 64 && (n <= 16 || k > 32);
}

/* Depthwise NHWC: AVX2's column kernels on row quads (refcg_dwq_cols_avx2), one vpdpbusd for up to 4
 * taps where vpmaddwd did 2; without quads (weights past int8, kernels not square 3x3 or 5x5) AVX2's. */
REFCG_DEFINE_DW_COLS_ROWS(refcg_dwq_cols_rows_by_plan_avxvnni, refcg_dpbusd_avxvnni)
#undef REFCG_DEFINE_DW_COLS_ROWS

static void refcg_dw_avxvnni(const void* ctx, int64_t r0, int64_t r1) {
  refcg_dw_ymm((const refcg_dw_job*)ctx, r0, r1, refcg_dwq_cols_rows_by_plan_avxvnni);
}

/* Depthwise planes with 4 byte taps per lane (vpdpbusd ymm) on the AVX2 expand and epilogue. */
REFCG_INLINE void refcg_dwp_blocks_avxvnni(const refcg_dwp_strip* s, const void* k, int64_t lane_off, int64_t off,
                                           int32_t n, int32_t nb) {
  REFCG_NB_SWITCH(nb, refcg_dwp_nb_avx2, s, (const refcg_dwpk_avx2*)k, lane_off, off, n, refcg_dpbusd_avxvnni);
}

REFCG_INLINE void refcg_dwp_strip_avxvnni(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                          int32_t oh0, int32_t oh1) {
  refcg_dwp_strip_ymm(j, e, words, oc, oh0, oh1, refcg_dwp_blocks_avxvnni);
}

static void refcg_dwp_avxvnni(const void* ctx, int64_t c0, int64_t c1) {
  refcg_dwp_channels((const refcg_dwp_job*)ctx, c0, c1, 8, refcg_dwp_expand_avx2, refcg_dwp_strip_avxvnni);
}

/* refcg_gemmp_job tiles (planar 1x1 convs) on ymm: AVX-512's refcg_gemmp_tile_avx512 with 8 pixels per
 * vector, 6 output channels x NV (1 or 2) blocks of 8 pixels (12 accumulators, 2 input vectors and the
 * broadcast weight: 15 of 16 registers). */
REFCG_INLINE void refcg_gemmp_tile_avxvnni(const refcg_gemmp_job* j, int32_t oc0, int64_t p0, const refcg_rqv_avx2* rv,
                                           const __m256i* corr, const int NV, const int plan) {
  const int8_t* wrow[REFCG_GEMMP_MR];
  const int32_t rows = refcg_gemmp_wrows(j, oc0, wrow);
  __m256i sum[REFCG_GEMMP_MR][2], acc[REFCG_GEMMP_MR][2];
  for (int r = 0; r < REFCG_GEMMP_MR; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = _mm256_setzero_si256();
  const uint8_t* x = j->xi + p0 * 4;
  for (int32_t q = 0; q < j->kp / 4; ++q, x += j->hw * 4) {
    __m256i xv[2];
    for (int v = 0; v < NV; ++v) xv[v] = _mm256_loadu_si256((const __m256i*)(x + 32 * v));
    for (int r = 0; r < REFCG_GEMMP_MR; ++r) {
      const __m256i w = _mm256_set1_epi32(refcg_load_i32((const uint8_t*)wrow[r] + (int64_t)q * 64));
      for (int v = 0; v < NV; ++v) sum[r][v] = refcg_dpbusd_avxvnni(sum[r][v], xv[v], w);
    }
  }
  for (int r = 0; r < REFCG_GEMMP_MR; ++r) /* a copy for the epilogue's run-time row index (see AVX-512's) */
    for (int v = 0; v < NV; ++v) acc[r][v] = sum[r][v];
  uint8_t* const out = (uint8_t*)j->epi.out + p0;
  if (plan != REFCG_PLAN_ANY && NV == 2 && p0 + 16 <= j->hw) { /* 8-bit out: two channels' 16 pixels per pack */
    const __m256i lo8 = _mm256_set1_epi8((char)j->epi.rq->out_min), hi8 = _mm256_set1_epi8((char)j->epi.rq->out_max);
    for (int r = 0; r < rows; r += 2) {
      const int two = r + 1 < rows;
      __m256i v[4];
      for (int q = 0; q < 4; ++q) {
        const int rr = r + (two ? q / 2 : 0);
        v[q] = refcg_rq_planned_unclamped_avx2(j->epi.rq, _mm256_add_epi32(acc[rr][q & 1], corr[rr]), &rv[rr], plan);
      }
      const __m256i bytes = refcg_pack4_avx2(v, lo8, hi8, j->epi.out_dtype == REFCG_U8); /* a channel per half */
      _mm_storeu_si128((__m128i*)(out + (int64_t)(oc0 + r) * j->epi.o_c), _mm256_castsi256_si128(bytes));
      if (two) _mm_storeu_si128((__m128i*)(out + (int64_t)(oc0 + r + 1) * j->epi.o_c), _mm256_extracti128_si256(bytes, 1));
    }
    return;
  }
  for (int r = 0; r < rows; ++r) {
    const int32_t oc = oc0 + r;
    for (int v = 0; v < NV; ++v) {
      const int64_t p = p0 + 8 * v;
      if (p >= j->hw) break;
      refcg_dwp_store_avx2(&j->epi, &rv[r], _mm256_add_epi32(acc[r][v], corr[r]), oc, oc * j->epi.o_c + p,
                           j->hw - p < 8 ? (int32_t)(j->hw - p) : 8);
    }
  }
}

/* Tiles as AVX-512's (refcg_gemmp_avx512: 64 pixels x 6 channels, channel blocks fastest), each 64
 * pixels as 16-pixel tiles, the last one 8 wide where 8 pixels or fewer are left. */
static void refcg_gemmp_avxvnni(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemmp_job* j = (const refcg_gemmp_job*)ctx;
  const int64_t ncb = (j->n + REFCG_GEMMP_MR - 1) / REFCG_GEMMP_MR;
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t oc0 = (int32_t)(t % ncb) * REFCG_GEMMP_MR;
    const int64_t g0 = t / ncb * REFCG_GEMMP_PX, g1 = g0 + REFCG_GEMMP_PX < j->hw ? g0 + REFCG_GEMMP_PX : j->hw;
    refcg_rqv_avx2 rv[REFCG_GEMMP_MR]; /* the channels' constants once per task: channel oc in every lane */
    __m256i corr[REFCG_GEMMP_MR];
    int plan = j->epi.rq_vector && (j->epi.out_dtype == REFCG_S8 || j->epi.out_dtype == REFCG_U8)
                   ? -1 : REFCG_PLAN_ANY; /* a copied plan shared by the channels: the packed byte stores */
    for (int32_t r = 0; r < REFCG_GEMMP_MR && oc0 + r < j->n; ++r) {
      rv[r] = refcg_rqv_load_avx2(j->epi.rq, oc0 + r, 8, 0);
      corr[r] = _mm256_set1_epi32(j->epi.corr[oc0 + r]);
      const int p = REFCG_PLAN_INDEX(refcg_rq_plan_avx2(j->epi.rq, &rv[r]));
      plan = plan < 0 || plan == p ? p : REFCG_PLAN_ANY;
    }
    for (int64_t p0 = g0; p0 < g1; p0 += 16) {
      if (g1 - p0 <= 8)
        refcg_gemmp_tile_avxvnni(j, oc0, p0, rv, corr, 1, REFCG_PLAN_ANY);
      else if (plan == REFCG_PLAN_ANY)
        refcg_gemmp_tile_avxvnni(j, oc0, p0, rv, corr, 2, REFCG_PLAN_ANY);
      else
#define REFCG_GEMMP_TILE_AVXVNNI(p) refcg_gemmp_tile_avxvnni(j, oc0, p0, rv, corr, 2, p)
        REFCG_WITH_COPIED_PLAN(plan, REFCG_GEMMP_TILE_AVXVNNI);
#undef REFCG_GEMMP_TILE_AVXVNNI
    }
  }
}

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
#define REFCG_X512_SMALLK_MAX 12 /* k-steps of the row kernels for few k-steps (refcg_rows_smallk_avx512) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

/* Requantize constants as vectors, prepared once per channel block (or per plane): zero points
 * and clamp range, then the mode's constants, which share storage (the union): int64 modes, the
 * multiplier (even lanes, odd lanes moved down) and REFCG_FPM_PLAN (rounding 2^kx as the even and
 * odd int64 halves, r; l1 and l2 only read when general); float modes, the scale (float64: lanes
 * 0-7, 8-15) and the expression's constants. */
typedef struct {
  int32_t mode, identity, fused, round_emulated, has_post;
  int32_t general; /* int64: TONEAREST, or some lane shifts left first (l1 nonzero) */
  __m512i izp, ozp, lo, hi;
  __m512i lo8, hi8; /* the clamp range as bytes (8-bit outputs, clamped after the saturating packs) */
  union {
    struct {
      __m512i m_e, m_o, k_e, k_o, r, l1, l2;
    } q;
    struct {
      __m512 scale, izp, add, post;
    } f;
    struct {
      __m512d scale[2], izp, add, post;
    } d;
  } c;
} refcg_rqv_avx512;

REFCG_INLINE __m512i refcg_even64_avx512(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi64(0xffffffffLL)); }
REFCG_INLINE __m512i refcg_odd64_avx512(__m512i v) { return _mm512_srli_epi64(v, 32); }

/* refcg_fpm_fold_k on the even or odd int64 halves: k, r's and m's lanes in the even slots. */
REFCG_INLINE __m512i refcg_fold_k_avx512(__m512i k, __m512i r64, __m512i m, int32_t izp, int32_t ozp) {
  const __m512i o = _mm512_sllv_epi64(_mm512_set1_epi64(ozp), _mm512_add_epi64(r64, _mm512_set1_epi64(32)));
  return _mm512_sub_epi64(_mm512_add_epi64(k, o), _mm512_mul_epi32(_mm512_set1_epi32(izp), m));
}

/* Folds izp and ozp into the right-shift plan's rounding constants (refcg_fpm_fold_ok): 0 where it
 * cannot, and r is left as it was. */
REFCG_INLINE int refcg_rq_fold_avx512(refcg_rqv_avx512* r, int32_t izp, int32_t ozp) {
  if (!refcg_fpm_fold_ok(_mm512_reduce_max_epi32(r->c.q.r), izp, ozp)) return 0;
  r->c.q.k_e = refcg_fold_k_avx512(r->c.q.k_e, refcg_even64_avx512(r->c.q.r), r->c.q.m_e, izp, ozp);
  r->c.q.k_o = refcg_fold_k_avx512(r->c.q.k_o, refcg_odd64_avx512(r->c.q.r), r->c.q.m_o, izp, ozp);
  return 1;
}

/* Lanes are channels c + l (lanes = 1, masked) or all channel c (lanes = 0). narrow: the values
 * requantized are 8-bit (x - izp cannot wrap), so a nonzero input zero point folds too. */
REFCG_INLINE refcg_rqv_avx512 refcg_rqv_load8_avx512(const refcg_requant* rq, int32_t c, __mmask16 mask, int lanes,
                                                     int narrow) {
  refcg_rqv_avx512 r;
  const __m512i zero = _mm512_setzero_si512();
  r.mode = rq->mode;
  r.identity = rq->identity;
  r.fused = rq->fused;
  r.round_emulated = rq->round_emulated;
  r.general = 0;
  r.izp = _mm512_set1_epi32(rq->input_zp);
  r.ozp = _mm512_set1_epi32(rq->output_zp);
  r.lo = _mm512_set1_epi32(rq->out_min);
  r.hi = _mm512_set1_epi32(rq->out_max);
  r.lo8 = _mm512_set1_epi8((char)rq->out_min);
  r.hi8 = _mm512_set1_epi8((char)rq->out_max);
  r.c.q.m_e = r.c.q.m_o = r.c.q.k_e = r.c.q.k_o = r.c.q.r = r.c.q.l1 = r.c.q.l2 = zero; /* registers, not a memset */
  c = rq->per_channel ? c : 0;
  lanes = lanes && rq->per_channel;
  const int f64 = rq->mode == REFCG_RQ_FLOAT64_UPWARD || rq->mode == REFCG_RQ_FLOAT64_TONEAREST;
  r.has_post = f64 ? rq->post_f64 != 0.0 : rq->post_f32 != 0.0f; /* + 0.0 changes no result: skipped */
  if (f64) {
    r.c.d.izp = _mm512_set1_pd((double)rq->input_zp);
    r.c.d.add = _mm512_set1_pd(rq->addend_f64);
    r.c.d.post = _mm512_set1_pd(rq->post_f64);
    r.c.d.scale[0] = lanes ? _mm512_maskz_loadu_pd((__mmask8)mask, rq->scale_f64 + c) : _mm512_set1_pd(rq->scale_f64[c]);
    r.c.d.scale[1] = lanes ? _mm512_maskz_loadu_pd((__mmask8)(mask >> 8), rq->scale_f64 + c + 8) : r.c.d.scale[0];
    return r; /* identity reads no scale */
  }
  if (rq->mode == REFCG_RQ_FLOAT32_UPWARD || rq->mode == REFCG_RQ_FLOAT32_TONEAREST) {
    r.c.f.izp = _mm512_set1_ps((float)rq->input_zp);
    r.c.f.add = _mm512_set1_ps(rq->addend_f32);
    r.c.f.post = _mm512_set1_ps(rq->post_f32);
    r.c.f.scale = lanes ? _mm512_maskz_loadu_ps(mask, rq->scale_f32 + c) : _mm512_set1_ps(rq->scale_f32[c]);
    return r;
  }
  if (rq->identity) return r;
  const int up = rq->mode == REFCG_RQ_INT64_UPWARD, fold = narrow || rq->input_zp == 0;
  if (!lanes) { /* one channel: the plan in scalars, broadcast */
    const refcg_fpm_one one = refcg_fpm_one_of(rq, c);
    r.general = one.general || !fold || !refcg_fpm_fold_ok(one.r, rq->input_zp, rq->output_zp);
    r.c.q.m_e = r.c.q.m_o = _mm512_set1_epi32(rq->multiplier[c]);
    r.c.q.k_e = r.c.q.k_o = _mm512_set1_epi64(
        r.general ? one.k : refcg_fpm_fold_k(one.k, one.r, rq->multiplier[c], rq->input_zp, rq->output_zp));
    r.c.q.l1 = _mm512_set1_epi32(one.l1);
    r.c.q.l2 = _mm512_set1_epi32(one.l2);
    r.c.q.r = _mm512_set1_epi32(one.r);
    return r;
  }
  /* masked-off lanes get shift -1: no left shift */
  const __m512i s = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), mask, rq->shift + c);
  const __m512i m = _mm512_maskz_loadu_epi32(mask, rq->multiplier + c), one64 = _mm512_set1_epi64(1);
  refcg_v16si l1, l2, kx, rs;
  REFCG_FPM_PLAN((refcg_v16si)s, up, l1, l2, kx, rs);
  r.c.q.l1 = (__m512i)l1;
  r.c.q.l2 = (__m512i)l2;
  r.c.q.r = (__m512i)rs;
  r.general = !up || _mm512_test_epi32_mask(r.c.q.l1, r.c.q.l1) != 0;
  r.c.q.m_e = m;
  r.c.q.m_o = _mm512_shuffle_epi32(m, _MM_PERM_DDBB); /* odd lanes into the even slots vpmuldq reads */
  r.c.q.k_e = _mm512_sllv_epi64(one64, refcg_even64_avx512((__m512i)kx));
  r.c.q.k_o = _mm512_sllv_epi64(one64, refcg_odd64_avx512((__m512i)kx));
  if (!r.general) r.general = !fold || !refcg_rq_fold_avx512(&r, rq->input_zp, rq->output_zp);
  return r;
}

/* ... of int32 accumulators: a nonzero input zero point leaves the general plan. */
REFCG_INLINE refcg_rqv_avx512 refcg_rqv_load_avx512(const refcg_requant* rq, int32_t c, __mmask16 mask, int lanes) {
  return refcg_rqv_load8_avx512(rq, c, mask, lanes, 0);
}

/* One int64 half of REFCG_FPM_PLAN in general: ((p << l1) + k (- 1 if negative: TONEAREST)) << l2. */
REFCG_INLINE __m512i refcg_fpm_half_avx512(__m512i p, __m512i l1, __m512i k, __m512i l2, int tonearest) {
  p = _mm512_sllv_epi64(p, l1);
  if (tonearest) p = _mm512_add_epi64(p, _mm512_srai_epi64(p, 63));
  return _mm512_sllv_epi64(_mm512_add_epi64(p, k), l2);
}

/* refcg_requantize_one's float expression on the lanes of f (float or double vectors); the
 * explicit-rounding forms are never contracted into an FMA. The roundings are the all-ones maskz
 * forms and f - t a plain sub: without -O, GCC 12's roundscale and sub_round macros pass an
 * "undefined" vector that g++ -Wmaybe-uninitialized flags here (GCC PR 105593). */
#define REFCG_RQ_FLOAT_AVX512(f, scale_, izp_, add_, post_, identity, fused, has_post, upward, round_emulated, sfx) \
  do {                                                                                                 \
    const __typeof__(f) sign_ = _mm512_set1_##sfx(-0.0), one_ = _mm512_set1_##sfx(1.0);                \
    const __typeof__(f) half_ = _mm512_set1_##sfx(0.5);                                                \
    f = _mm512_sub_round_##sfx(f, izp_, _MM_FROUND_CUR_DIRECTION);                                     \
    if (identity)                                                                                      \
      f = _mm512_add_round_##sfx(f, add_, _MM_FROUND_CUR_DIRECTION);                                   \
    else if (fused)                                                                                    \
      f = _mm512_fmadd_##sfx(f, scale_, add_);                                                         \
    else                                                                                               \
      f = _mm512_add_round_##sfx(_mm512_mul_round_##sfx(f, scale_, _MM_FROUND_CUR_DIRECTION), add_,    \
                                 _MM_FROUND_CUR_DIRECTION);                                            \
    if (has_post) f = _mm512_add_round_##sfx(f, post_, _MM_FROUND_CUR_DIRECTION);                      \
    if (upward) {                                                                                      \
      f = _mm512_maskz_roundscale_##sfx(~0, f, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);            \
    } else if (round_emulated) { /* f + copysign(0.5, f); the conversion truncates */                 \
      f = _mm512_add_round_##sfx(f, _mm512_or_##sfx(half_, _mm512_and_##sfx(f, sign_)),                \
                                 _MM_FROUND_CUR_DIRECTION);                                            \
    } else { /* half away from zero; f - trunc(f) is exact */                                         \
      const __typeof__(f) t_ = _mm512_maskz_roundscale_##sfx(~0, f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); \
      const __typeof__(f) d_ = _mm512_abs_##sfx(_mm512_sub_##sfx(f, t_)); /* no product: no FMA */      \
      f = _mm512_mask_add_round_##sfx(t_, _mm512_cmp_##sfx##_mask(d_, half_, _CMP_GE_OQ), t_,          \
                                      _mm512_or_##sfx(one_, _mm512_and_##sfx(f, sign_)),              \
                                      _MM_FROUND_CUR_DIRECTION);                                       \
    }                                                                                                  \
  } while (0)

/* The high halves of the even and odd int64 lanes pe, po, shifted right by r->c.q.r. */
REFCG_INLINE __m512i refcg_fpm_merge_avx512(const refcg_rqv_avx512* r, __m512i pe, __m512i po) {
  return _mm512_srav_epi32(_mm512_mask_shuffle_epi32(po, 0x5555, pe, _MM_PERM_DDBB), r->c.q.r);
}

/* The int64 modes' REFCG_FPM_PLAN in UPWARD with right shifts only (r not identity, not general):
 * even and odd int64 products plus the rounding 2^kx with both zero points folded in
 * (refcg_fpm_fold_ok), then their high halves shifted. */
REFCG_INLINE __m512i refcg_rq_up_avx512(const refcg_rqv_avx512* r, __m512i acc) {
  const __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(acc, r->c.q.m_e), r->c.q.k_e);
  const __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_shuffle_epi32(acc, _MM_PERM_DDBB), r->c.q.m_o), r->c.q.k_o);
  return refcg_fpm_merge_avx512(r, pe, po);
}

/* r takes refcg_rq_up_avx512 (constant per block: callers branch on it once, outside their loops) */
REFCG_INLINE int refcg_rq_is_up_avx512(const refcg_rqv_avx512* r) {
  return r->mode == REFCG_RQ_INT64_UPWARD && !r->identity && !r->general;
}

/* Requantize 16 lanes into int32 before the clamp (refcg_requantize_one of the vector modes). */
REFCG_INLINE __m512i refcg_rq_unclamped_avx512(const refcg_rqv_avx512* r, __m512i acc) {
  __m512i v;
  if (r->mode == REFCG_RQ_INT64_UPWARD || r->mode == REFCG_RQ_INT64_TONEAREST) {
    if (refcg_rq_is_up_avx512(r)) return refcg_rq_up_avx512(r, acc);
    v = _mm512_sub_epi32(acc, r->izp);
    if (!r->identity) { /* general: REFCG_FPM_PLAN's left shifts or TONEAREST */
      const int tonearest = r->mode == REFCG_RQ_INT64_TONEAREST;
      const __m512i l1 = r->c.q.l1, l2 = r->c.q.l2;
      __m512i pe = _mm512_mul_epi32(v, r->c.q.m_e);
      __m512i po = _mm512_mul_epi32(_mm512_shuffle_epi32(v, _MM_PERM_DDBB), r->c.q.m_o);
      pe = refcg_fpm_half_avx512(pe, refcg_even64_avx512(l1), r->c.q.k_e, refcg_even64_avx512(l2), tonearest);
      po = refcg_fpm_half_avx512(po, refcg_odd64_avx512(l1), r->c.q.k_o, refcg_odd64_avx512(l2), tonearest);
      return _mm512_add_epi32(refcg_fpm_merge_avx512(r, pe, po), r->ozp);
    }
    v = _mm512_add_epi32(v, r->ozp);
  } else if (r->mode == REFCG_RQ_FLOAT64_UPWARD || r->mode == REFCG_RQ_FLOAT64_TONEAREST) {
    __m512d lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc)), hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc, 1));
    const int up = r->mode == REFCG_RQ_FLOAT64_UPWARD;
    REFCG_RQ_FLOAT_AVX512(lo, r->c.d.scale[0], r->c.d.izp, r->c.d.add, r->c.d.post, r->identity, r->fused, r->has_post,
                          up, r->round_emulated, pd);
    REFCG_RQ_FLOAT_AVX512(hi, r->c.d.scale[1], r->c.d.izp, r->c.d.add, r->c.d.post, r->identity, r->fused, r->has_post,
                          up, r->round_emulated, pd);
    /* out of range -> INT32_MIN, like refcg_f64_to_i32 on x86 */
    v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvttpd_epi32(lo)), _mm512_cvttpd_epi32(hi), 1);
  } else {
    __m512 f = _mm512_cvtepi32_ps(acc);
    REFCG_RQ_FLOAT_AVX512(f, r->c.f.scale, r->c.f.izp, r->c.f.add, r->c.f.post, r->identity, r->fused, r->has_post,
                          r->mode == REFCG_RQ_FLOAT32_UPWARD, r->round_emulated, ps);
    v = _mm512_cvttps_epi32(f);
  }
  return v;
}

/* The plan (REFCG_PLAN_*) of r. */
REFCG_INLINE int refcg_rq_plan_avx512(const refcg_rqv_avx512* r) {
  if (refcg_rq_is_up_avx512(r)) return REFCG_PLAN_I64_UP;
  if (r->mode == REFCG_RQ_FLOAT32_UPWARD && !r->identity) return REFCG_PLAN_F32_UP + (r->fused != 0) + 2 * r->has_post;
  return REFCG_PLAN_ANY;
}

/* refcg_rq_unclamped_avx512 under plan (a constant: the branches fold away). */
REFCG_INLINE __m512i refcg_rq_planned_avx512(const refcg_rqv_avx512* r, __m512i acc, const int plan) {
  if (plan == REFCG_PLAN_I64_UP) return refcg_rq_up_avx512(r, acc);
  if (plan < REFCG_PLAN_F32_UP) return refcg_rq_unclamped_avx512(r, acc);
  __m512 f = _mm512_cvtepi32_ps(acc);
  REFCG_RQ_FLOAT_AVX512(f, r->c.f.scale, r->c.f.izp, r->c.f.add, r->c.f.post, 0, REFCG_PLAN_FUSED(plan),
                        REFCG_PLAN_POST(plan), 1, 0, ps);
  return _mm512_cvttps_epi32(f);
}

/* ... and clamped. */
REFCG_INLINE __m512i refcg_rq_apply_avx512(const refcg_rqv_avx512* r, __m512i acc) {
  return _mm512_max_epi32(_mm512_min_epi32(refcg_rq_unclamped_avx512(r, acc), r->hi), r->lo);
}

REFCG_INLINE __m512i refcg_rq_avx512(const refcg_requant* rq, __m512i acc, int32_t c, __mmask16 mask) {
  const refcg_rqv_avx512 r = refcg_rqv_load_avx512(rq, c, mask, 1);
  return refcg_rq_apply_avx512(&r, acc);
}

/* The low bytes of 16 int32 lanes (in range: the truncation is the value), lanes in mask stored:
 * vpmovdb into a register, then a plain store (all 16) or a masked one. vpmovdb with a memory
 * operand is slow on Zen 4 (12% of a 1x1 conv with K = 16 in perf), a masked store is slower than
 * a plain one; the empty asm keeps GCC from folding the two back into vpmovdb to memory. */
REFCG_INLINE void refcg_store16_bytes_avx512(uint8_t* out, __mmask16 mask, __m512i v) {
  __m128i b = _mm512_cvtepi32_epi8(v);
  __asm__("" : "+v"(b));
  if (mask == 0xFFFF)
    _mm_storeu_si128((__m128i*)out, b);
  else
    _mm_mask_storeu_epi8(out, mask, b);
}

/* NV (1 to 4) vectors of 16 unclamped requantized values (refcg_rq_unclamped_avx512) as bytes,
 * n of them stored (64 or more: all): the saturating packs clamp to the dtype's range, then r's
 * range on the 64 bytes at once (the same result, the range lying inside the dtype's), one dword
 * permute and one store, instead of a clamp, a vpmovdb and a store per vector. */
REFCG_INLINE __m512i refcg_pack_bytes_avx512(const __m512i* v, int NV, __m512i lo8, __m512i hi8, int is_unsigned) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i a = _mm512_packs_epi32(v[0], NV > 1 ? v[1] : zero), b = NV > 2 ? _mm512_packs_epi32(v[2], NV > 3 ? v[3] : zero) : zero;
  __m512i bytes = is_unsigned ? _mm512_packus_epi16(a, b) : _mm512_packs_epi16(a, b);
  bytes = is_unsigned ? _mm512_max_epu8(_mm512_min_epu8(bytes, hi8), lo8) : _mm512_max_epi8(_mm512_min_epi8(bytes, hi8), lo8);
  /* 128-bit lane l holds 4 values of each vector k at dword 4 l + k: back to dword 4 k + l */
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, bytes);
}

REFCG_INLINE void refcg_store_bytes_avx512(uint8_t* out, const __m512i* v, int NV, const refcg_rqv_avx512* r,
                                           int is_unsigned, int64_t n) {
  const __m512i bytes = refcg_pack_bytes_avx512(v, NV, r->lo8, r->hi8, is_unsigned);
  if (n >= 16 * NV) { /* plain stores: a masked one is slower on Zen 4 (MobileNetV2's 96-channel 1x1: 2 blocks) */
    if (NV == 4) {
      _mm512_storeu_si512(out, bytes);
    } else {
      if (NV & 2) _mm256_storeu_si256((__m256i*)out, _mm512_castsi512_si256(bytes));
      if (NV & 1) _mm_storeu_si128((__m128i*)(out + 16 * (NV & 2)), _mm512_extracti32x4_epi32(bytes, NV & 2));
    }
    return;
  }
  _mm512_mask_storeu_epi8(out, (__mmask64)((1ULL << n) - 1ULL), bytes);
}

/* The same for 4 vectors that are 16 channels of 4 pixels (lanes in mask) stored step bytes apart:
 * one pack and clamp, then a 16-byte store per pixel. */
REFCG_INLINE void refcg_store_4px_avx512(uint8_t* out, int64_t step, __mmask16 mask, const __m512i* v,
                                         const refcg_rqv_avx512* r, int is_unsigned) {
  const __m512i bytes = refcg_pack_bytes_avx512(v, 4, r->lo8, r->hi8, is_unsigned);
  const __m128i p[4] = {_mm512_castsi512_si128(bytes), _mm512_extracti32x4_epi32(bytes, 1),
                        _mm512_extracti32x4_epi32(bytes, 2), _mm512_extracti32x4_epi32(bytes, 3)};
  for (int q = 0; q < 4; ++q) {
    if (mask == 0xFFFF)
      _mm_storeu_si128((__m128i*)(out + q * step), p[q]);
    else
      _mm_mask_storeu_epi8(out + q * step, mask, p[q]);
  }
}

/* Requantize and store channels [c0, c0 + nvalid) of one pixel; acc includes the correction. */
REFCG_INLINE void refcg_epi_vec_avx512(const refcg_epi* e, const refcg_rqv_avx512* r, __m512i acc, int32_t c0,
                                       int32_t nvalid, int64_t off) {
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  int32_t t[16];
  if (!e->rq_vector) {
    _mm512_storeu_si512(t, acc);
    for (int32_t l = 0; l < nvalid; ++l)
      refcg_store(e->out, off + (c0 + l) * e->o_c, e->out_dtype, refcg_requantize_one(e->rq, t[l], c0 + l));
    return;
  }
  const __m512i v = refcg_rq_apply_avx512(r, acc);
  if (e->o_c == 1 && e->out_dtype != REFCG_S32) {
    refcg_store16_bytes_avx512((uint8_t*)e->out + off + c0, mask, v);
  } else if (e->o_c == 1) {
    _mm512_mask_storeu_epi32((int32_t*)e->out + off + c0, mask, v);
  } else {
    _mm512_storeu_si512(t, v);
    refcg_epi_store(e, t, c0, nvalid, off);
  }
}

REFCG_INLINE void refcg_epi_avx512(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid, int64_t off) {
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  const refcg_rqv_avx512 r = refcg_rqv_load_avx512(e->rq, c0, mask, 1);
  refcg_epi_vec_avx512(e, &r, _mm512_add_epi32(_mm512_loadu_si512(acc), _mm512_maskz_loadu_epi32(mask, e->corr + c0)), c0,
                       nvalid, off);
}

/* The epilogue constants of one block of 16 channels. */
typedef struct {
  refcg_rqv_avx512 r;
  __m512i corr;
  int32_t c0, nvalid;
} refcg_blk_avx512;

REFCG_INLINE refcg_blk_avx512 refcg_blk_load_avx512(const refcg_gemm_job* j, int32_t b) {
  refcg_blk_avx512 k;
  k.c0 = b * 16;
  k.nvalid = j->n - k.c0 < 16 ? j->n - k.c0 : 16;
  const __mmask16 mask = (__mmask16)((1u << k.nvalid) - 1u);
  k.r = refcg_rqv_load_avx512(j->epi.rq, k.c0, mask, 1);
  k.corr = _mm512_maskz_loadu_epi32(mask, j->epi.corr + k.c0);
  return k;
}

/* Rows of a tile's accumulators requantized and stored as bytes, NV blocks per row in one store
 * (refcg_store_bytes_avx512), every block under plan (refcg_rq_planned_avx512). */
REFCG_INLINE void refcg_tile_store_avx512(const refcg_gemm_job* j, const refcg_blk_avx512* blk,
                                          __m512i (*acc)[REFCG_X512_NV], const int64_t* out_off, int rows,
                                          const int MR, const int NV, const int plan) {
  const int64_t n = j->n - blk[0].c0;
  /* unrolled over MR (a constant), rows past `rows` skipped: acc stays in registers (a loop to the
   * runtime row count stored all MR x NV accumulators and read them back, half a K = 16 conv's time) */
  REFCG_UNROLL
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    __m512i v[4];
    for (int b = 0; b < NV; ++b)
      v[b] = refcg_rq_planned_avx512(&blk[b].r, acc[r][b], plan);
    refcg_store_bytes_avx512((uint8_t*)j->epi.out + out_off[r] + blk[0].c0, v, NV, &blk[0].r,
                             j->epi.out_dtype == REFCG_U8, n);
  }
}

/* The tile stores refcg_tile_store_avx512 does not take (other outputs, REFCG_PLAN_ANY), out of line
 * (see refcg_tile_store_any_avx2). */
static __attribute__((noinline)) void refcg_tile_store_any_avx512(const refcg_gemm_job* j, const refcg_blk_avx512* blk,
                                                                  __m512i (*acc)[REFCG_X512_NV], const int64_t* out_off,
                                                                  int rows, int nv) {
  for (int v = 0; v < nv; ++v)
    for (int r = 0; r < rows; ++r)
      refcg_epi_vec_avx512(&j->epi, &blk[v].r, acc[r][v], blk[v].c0, blk[v].nvalid, out_off[r]);
}

/* acc[r][v] += the k-steps of rows arow x NV blocks of weights from wp (block stride bstride); FLIP: each
 * 4 input bytes XOR j->flip4 (an input of the other dtype read in place), a vpxord per row and k-step
 * that a lone block's 6 vpdpbusd do not hide (32->16 uint8: 0.92x), so instantiated only where needed. */
REFCG_INLINE void refcg_tile_k_avx512(const refcg_gemm_job* j, const uint8_t* const* arow, const int8_t* wp,
                                      int64_t bstride, __m512i (*acc)[REFCG_X512_NV], const int MR, const int NV,
                                      const int FLIP) {
  const __m512i flip = _mm512_set1_epi32((int32_t)j->flip4);
  for (int32_t s = 0; s < j->nseg; ++s) {
    const int64_t so = j->seg_off[s];
    for (int32_t k = 0; k < j->seg_len; k += 4, wp += 64) {
      __m512i w[4];
      for (int v = 0; v < NV; ++v) w[v] = _mm512_loadu_si512(wp + v * bstride);
      for (int r = 0; r < MR; ++r) {
        __m512i a = _mm512_set1_epi32(refcg_load_i32(arow[r] + so + k));
        if (FLIP) a = _mm512_xor_si512(a, flip);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], a, w[v]);
      }
    }
  }
}

/* MR rows from row i0 (output row q, column c) x NV blocks of 16 channels starting at block nb,
 * whose epilogue constants are blk. */
REFCG_INLINE void refcg_tile_avx512(const refcg_gemm_job* j, const refcg_blk_avx512* blk, int32_t i0, int32_t q,
                                    int32_t c, int32_t nb, const int MR, const int NV) {
  const uint8_t* arow[REFCG_X512_MR];
  int64_t out_off[REFCG_X512_MR];
  const int32_t rows = refcg_tile_rows_at(j, i0, q, c, MR, arow, out_off);
  __m512i acc[REFCG_X512_MR][REFCG_X512_NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = blk[v].corr; /* the correction added up front */
  const int64_t bstride = (int64_t)j->kp * 16;
  const int8_t* wp = j->w + nb * bstride;
  if (j->flip4)
    refcg_tile_k_avx512(j, arow, wp, bstride, acc, MR, NV, 1);
  else
    refcg_tile_k_avx512(j, arow, wp, bstride, acc, MR, NV, 0);
  int plan = REFCG_PLAN_ANY;
  if (refcg_epi_vector_bytes(&j->epi)) { /* a row's NV blocks: one store */
    plan = refcg_rq_plan_avx512(&blk[0].r);
    for (int b = 1; b < NV; ++b) plan = REFCG_PLAN_MEET(plan, refcg_rq_plan_avx512(&blk[b].r));
  }
  if (REFCG_PLAN_INDEX(plan) == REFCG_PLAN_ANY) {
    __m512i t[REFCG_X512_MR][REFCG_X512_NV]; /* a copy: acc's address taken would keep it in memory */
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) t[r][v] = acc[r][v];
    refcg_tile_store_any_avx512(j, blk, t, out_off, rows, NV);
    return;
  }
  /* a constant plan: unrolled over the blocks without the mode's branches, acc kept in registers */
#define REFCG_TILE_STORE_AVX512(p) refcg_tile_store_avx512(j, blk, acc, out_off, rows, MR, NV, p)
  REFCG_WITH_COPIED_PLAN(plan, REFCG_TILE_STORE_AVX512);
#undef REFCG_TILE_STORE_AVX512
}

/* Jobs of few k-steps (KS of 4 bytes: 1x1 expands over 16-48 channels, a 3x3 stem over 4 padded
 * channels): a 6-row tile's K loop is then 4-12 vpdpbusd per accumulator and its epilogue half the
 * tile, with 24 accumulators spilled around it. Here one row at a time: its NV accumulators, the
 * group's KS x NV weight vectors loaded once, then its epilogue (int64 UPWARD plan), which the
 * out-of-order core overlaps with the next rows' k-steps (int8 input: 1x1 16->96@112 1.30x, 24->144@56
 * 1.24x, 40->240@28 1.11x, the 3x3 stem 1.18x; 16 steps ran 0.87x). CONTIG: one segment; else KS
 * steps over the job's segments. PLAN: the blocks' requantize plan, int64 or float32 fused UPWARD. */
REFCG_INLINE void refcg_rows_smallk_avx512(const refcg_gemm_job* j, const refcg_blk_avx512* blk, int32_t i0,
                                           int32_t i1, int32_t q, int32_t c, int32_t nb, const int NV,
                                           const int KS, const int CONTIG, const int FLIP, const int PLAN) {
  const int64_t bstride = (int64_t)j->kp * 16;
  const int8_t* wp = j->w + nb * bstride;
  __m512i w[REFCG_X512_SMALLK_MAX][REFCG_X512_NV];
  int64_t koff[REFCG_X512_SMALLK_MAX];
  for (int k = 0; k < KS; ++k) {
    for (int v = 0; v < NV; ++v) w[k][v] = _mm512_loadu_si512(wp + v * bstride + 64 * k);
    const int32_t steps = j->seg_len / 4; /* a segment's k-steps */
    koff[k] = CONTIG ? 4 * k : j->seg_off[k / steps] - j->seg_off[0] + 4 * (k % steps);
  }
  const __m512i flip = _mm512_set1_epi32((int32_t)j->flip4);
  const int64_t n = j->n - blk[0].c0;
  const int is_unsigned = j->epi.out_dtype == REFCG_U8;
  const uint8_t* a = j->a + (int64_t)q * j->a_row_h + (int64_t)c * j->a_row_w + j->seg_off[0];
  uint8_t* o = (uint8_t*)j->epi.out + (int64_t)q * j->o_row_h + (int64_t)c * j->o_row_w + blk[0].c0;
  for (int32_t i = i0; i < i1; ++i) {
    __m512i acc[REFCG_X512_NV];
    for (int v = 0; v < NV; ++v) acc[v] = blk[v].corr;
    for (int k = 0; k < KS; ++k) {
      __m512i x = _mm512_set1_epi32(refcg_load_i32(a + koff[k]));
      if (FLIP) x = _mm512_xor_si512(x, flip);
      for (int v = 0; v < NV; ++v) acc[v] = _mm512_dpbusd_epi32(acc[v], x, w[k][v]);
    }
    for (int v = 0; v < NV; ++v) acc[v] = refcg_rq_planned_avx512(&blk[v].r, acc[v], PLAN);
    if (is_unsigned) /* constants: no dtype branch in the pack */
      refcg_store_bytes_avx512(o, acc, NV, &blk[0].r, 1, n);
    else
      refcg_store_bytes_avx512(o, acc, NV, &blk[0].r, 0, n);
    if (++c == j->cols) {
      c = 0;
      ++q;
      a = j->a + (int64_t)q * j->a_row_h + j->seg_off[0];
      o = (uint8_t*)j->epi.out + (int64_t)q * j->o_row_h + blk[0].c0;
    } else {
      a += j->a_row_w;
      o += j->o_row_w;
    }
  }
}

/* Rows [i0, i1) x blocks [nb, nb + nv) through refcg_rows_smallk_avx512 with KS (and CONTIG) fixed,
 * nv, the flip and the plan as constants; 0 (nothing done) where the blocks' requantize is neither the
 * int64 UPWARD plan (target llvm) nor float32 fused (an -mcpu target: the same convs ran 1.3x slower as
 * tiles). Its own block constants: the tiles' stay unaliased (passed here, the tiles ran 4% slower). */
#define REFCG_SMALLK_NV_AVX512(KS, CONTIG, PLAN)                                                                 \
  do {                                                                                                           \
    if (nv == 4) refcg_rows_smallk_avx512(j, blk, i0, i1, q, c, nb, 4, KS, CONTIG, f, PLAN);                     \
    else if (nv == 3) refcg_rows_smallk_avx512(j, blk, i0, i1, q, c, nb, 3, KS, CONTIG, f, PLAN);                \
    else if (nv == 2) refcg_rows_smallk_avx512(j, blk, i0, i1, q, c, nb, 2, KS, CONTIG, f, PLAN);                \
    else refcg_rows_smallk_avx512(j, blk, i0, i1, q, c, nb, 1, KS, CONTIG, f, PLAN);                             \
  } while (0)
#define REFCG_DEFINE_SMALLK(KS, CONTIG)                                                                          \
  static int refcg_smallk##KS##_avx512(const refcg_gemm_job* j, int32_t nb, int32_t nv, int32_t i0, int32_t i1,  \
                                       int32_t q, int32_t c) {                                                   \
    refcg_blk_avx512 blk[REFCG_X512_NV];                                                                         \
    int plan = REFCG_PLAN_I64_UP;                                                                                \
    for (int32_t v = 0; v < nv; ++v) {                                                                           \
      blk[v] = refcg_blk_load_avx512(j, nb + v);                                                                 \
      plan = v ? REFCG_PLAN_MEET(plan, refcg_rq_plan_avx512(&blk[v].r)) : refcg_rq_plan_avx512(&blk[v].r);       \
    }                                                                                                            \
    if (plan != REFCG_PLAN_I64_UP && plan != REFCG_PLAN_F32_FMA) return 0;                                       \
    const int flip = j->flip4 != 0;                                                                              \
    for (int f = 0; f < 2; ++f) { /* f: the flip, as a constant */                                              \
      if (f != flip) continue;                                                                                   \
      if (plan == REFCG_PLAN_I64_UP)                                                                             \
        REFCG_SMALLK_NV_AVX512(KS, CONTIG, REFCG_PLAN_I64_UP);                                                   \
      else                                                                                                       \
        REFCG_SMALLK_NV_AVX512(KS, CONTIG, REFCG_PLAN_F32_FMA);                                                  \
    }                                                                                                            \
    return 1;                                                                                                    \
  }
REFCG_DEFINE_SMALLK(4, 1)
REFCG_DEFINE_SMALLK(6, 1)
REFCG_DEFINE_SMALLK(8, 1)
REFCG_DEFINE_SMALLK(10, 1)
REFCG_DEFINE_SMALLK(12, 1)
REFCG_DEFINE_SMALLK(9, 0) /* a 3x3 over 4 padded channels: three segments */
#undef REFCG_DEFINE_SMALLK
#undef REFCG_SMALLK_NV_AVX512

typedef int (*refcg_smallk_fn)(const refcg_gemm_job*, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t);

/* The row kernel for j's k-steps, or NULL: tiles (more steps, other step counts, outputs the
 * byte epilogue does not store). */
static refcg_smallk_fn refcg_smallk_of_avx512(const refcg_gemm_job* j) {
  if (!refcg_epi_vector_bytes(&j->epi) || j->seg_len % 4) return NULL;
  const int32_t steps = j->nseg * j->seg_len / 4;
  if (j->nseg > 1) return steps == 9 ? refcg_smallk9_avx512 : NULL;
  switch (steps) {
    case 4: return refcg_smallk4_avx512;
    case 6: return refcg_smallk6_avx512;
    case 8: return refcg_smallk8_avx512;
    case 10: return refcg_smallk10_avx512;
    case 12: return refcg_smallk12_avx512;
    default: return NULL;
  }
}

/* Tiles: (row block of 6) x (group of up to 4 channel blocks), row blocks fastest within a
 * thread's rows: a group's weights (K x 64 bytes) stay in L1/L2 while the rows stream by (dense
 * 64x512x512: 1.2x faster than channel groups fastest, which re-read all weights from L2 for
 * every row block). */
/* Row blocks [rb0, rb1) of the group of NV channel blocks at nb (refcg_tiles_avx512vnni), the first at
 * output row q, column c. A tail group of 2-3 channel blocks runs in one tile: 12-18 independent
 * accumulators instead of 6 per block, which vpdpbusd's latency would leave half idle (MobileNet's
 * 24/96/160 channels). One function per NV (REFCG_CONST_COPY), not inlined into the caller: every NV's
 * tiles and plan copies in one function took GCC a minute to compile. */
REFCG_INLINE void refcg_tile_rows_avx512(const refcg_gemm_job* j, const refcg_blk_avx512* blk, int64_t rb0, int64_t rb1,
                                         int32_t q, int32_t c, int32_t nb, const int NV) {
  for (int64_t rb = rb0; rb < rb1; ++rb) {
    const int32_t i0 = (int32_t)rb * REFCG_X512_MR;
    if (j->m - i0 == 1) /* a last row (49 = 8 x 6 + 1: 7x7 maps): its NV blocks' chains in one tile */
      refcg_tile_avx512(j, blk, i0, q, c, nb, 1, NV);
    else
      refcg_tile_avx512(j, blk, i0, q, c, nb, REFCG_X512_MR, NV);
    refcg_rows_advance(j, &q, &c, REFCG_X512_MR);
  }
}
#define REFCG_TILE_ROWS_AVX512(NV)                                                                               \
  REFCG_CONST_COPY(refcg_tile_rows_by_nv_avx512, refcg_tile_rows_avx512,                                         \
                   (const refcg_gemm_job* j, const refcg_blk_avx512* blk, int64_t rb0, int64_t rb1, int32_t q,   \
                    int32_t c, int32_t nb),                                                                      \
                   (j, blk, rb0, rb1, q, c, nb), NV)
REFCG_TILE_ROWS_AVX512(1)
REFCG_TILE_ROWS_AVX512(2)
REFCG_TILE_ROWS_AVX512(3)
REFCG_TILE_ROWS_AVX512(4) /* REFCG_X512_NV */
#undef REFCG_TILE_ROWS_AVX512

static void refcg_tiles_avx512vnni(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;
  const int32_t nblocks = (j->n + 15) / 16;
  const int64_t ng = (nblocks + REFCG_X512_NV - 1) / REFCG_X512_NV;
  const refcg_smallk_fn smallk = refcg_smallk_of_avx512(j);
  /* tile t = rb * ng + g (refcg_rows_of_col): channel groups outermost in a thread's rows, row
   * blocks fastest, so a group's weights stay in L1/L2 while the rows stream by */
  for (int64_t g = 0; g < ng; ++g) {
    int64_t rb0, rb1;
    refcg_rows_of_col(t0, t1, ng, g, &rb0, &rb1);
    if (rb0 >= rb1) continue;
    const int32_t nb = (int32_t)g * REFCG_X512_NV;
    const int32_t nv = nblocks - nb < REFCG_X512_NV ? nblocks - nb : REFCG_X512_NV;
    /* output row q and column c of the tile's first row, stepped instead of divided per tile */
    int32_t q = (int32_t)(rb0 * REFCG_X512_MR / j->cols), c = (int32_t)(rb0 * REFCG_X512_MR - (int64_t)q * j->cols);
    const int64_t i1 = rb1 * REFCG_X512_MR < j->m ? rb1 * REFCG_X512_MR : j->m;
    if (smallk && smallk(j, nb, nv, (int32_t)rb0 * REFCG_X512_MR, (int32_t)i1, q, c)) continue;
    /* the group's requantize constants once per group and thread, not per tile (a 6-row tile of
     * a K = 16 conv spent a fifth of its time on them) */
    refcg_blk_avx512 blk[REFCG_X512_NV];
    for (int32_t v = 0; v < nv; ++v) blk[v] = refcg_blk_load_avx512(j, nb + v);
    switch (nv) {
      case 4: refcg_tile_rows_by_nv_avx512_p4(j, blk, rb0, rb1, q, c, nb); break;
      case 3: refcg_tile_rows_by_nv_avx512_p3(j, blk, rb0, rb1, q, c, nb); break;
      case 2: refcg_tile_rows_by_nv_avx512_p2(j, blk, rb0, rb1, q, c, nb); break;
      default: refcg_tile_rows_by_nv_avx512_p1(j, blk, rb0, rb1, q, c, nb); break;
    }
  }
}

/* refcg_gemm_config.flips: every conv (a vpxord per row and k-step for up to 4 blocks of a tile, and in
 * the row kernels for few k-steps). */
static int refcg_flips_avx512(int64_t k, int32_t n) {
  (void)k;
  (void)n;
  return 1;
}

/* 16 input bytes of a depthwise job at x, XOR j->flip (the depthwise kernels read their input only
 * through this and refcg_dw_quad_col_avx512: refcg_dw_config.flips). */
REFCG_INLINE __m128i refcg_dw_load16_avx512(const refcg_dw_job* j, const uint8_t* x) {
  return _mm_xor_si128(_mm_loadu_si128((const __m128i*)x), _mm_set1_epi8((char)j->flip));
}

/* vpdpwssd on lanes holding (x, 0) and (w', sign): x * w' per channel, exact. */
REFCG_INLINE void refcg_dw16_avx512(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  __m512i a = _mm512_setzero_si512();
  for (int32_t kh = 0; kh < j->kh; ++kh) {
    for (int32_t kw = 0; kw < j->kw; ++kw) {
      const uint8_t* x = base + ((int64_t)kh * j->dh * j->wp + (int64_t)kw * j->dw) * j->cp + c0;
      const int16_t* w = j->w + (int64_t)(kh * j->kw + kw) * j->cp + c0;
      a = _mm512_dpwssd_epi32(a, _mm512_cvtepu8_epi32(refcg_dw_load16_avx512(j, x)),
                              _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)w)));
    }
  }
  _mm512_storeu_si512(acc, a);
}

/* px pixels of 16 channels from c0 through the generic epilogue, out of line: inlined into every depthwise
 * kernel copy, it doubled their code (see refcg_dw_cols_store_px_avx2). */
static __attribute__((noinline)) void refcg_dw_store_px_avx512(const refcg_dw_job* j, const refcg_rqv_avx512* r,
                                                               const __m512i* acc, int32_t c0, int64_t out_off,
                                                               int32_t px) {
  const int32_t nvalid = j->c - c0 < 16 ? j->c - c0 : 16;
  for (int32_t q = 0; q < px; ++q) refcg_epi_vec_avx512(&j->epi, r, acc[q], c0, nvalid, out_off + q * j->o_w);
}

/* 16 channels x PX pixels along ow: PX independent vpdpwssd chains, weights widened and the
 * requantize constants of the 16 channels prepared once (r, corr). */
REFCG_INLINE void refcg_dw_px_avx512(const refcg_dw_job* j, const uint8_t* base, int64_t pstride, const int32_t* wide,
                                     const int64_t* toff, int32_t taps, int32_t c0, const refcg_rqv_avx512* r,
                                     __m512i corr, int64_t out_off, const int PX) {
  __m512i acc[4];
  for (int q = 0; q < PX; ++q) acc[q] = corr;
  for (int32_t t = 0; t < taps; ++t) {
    const __m512i w = _mm512_load_si512(wide + 16 * t);
    for (int q = 0; q < PX; ++q)
      acc[q] = _mm512_dpwssd_epi32(acc[q], _mm512_cvtepu8_epi32(refcg_dw_load16_avx512(j, base + q * pstride + toff[t])), w);
  }
  __m512i t[4]; /* a copy: acc's address taken would keep the accumulators in memory */
  for (int q = 0; q < PX; ++q) t[q] = acc[q];
  refcg_dw_store_px_avx512(j, r, t, c0, out_off, PX);
}

/* The column kernels' epilogue: PX (a multiple of 4) pixels of 16 channels from c0; under a plan
 * (8-bit channels-last output, refcg_dw_plan_avx512) 4 pixels share one pack (refcg_store_4px_avx512). */
REFCG_INLINE void refcg_dw_cols_store_avx512(const refcg_dw_job* j, const refcg_rqv_avx512* r, const __m512i* acc,
                                             int32_t c0, int64_t out_off, const int PX, const int plan) {
  if (plan == REFCG_PLAN_ANY) {
    __m512i t[8]; /* a copy: acc's address taken would keep the kernel's accumulators in memory */
    for (int q = 0; q < PX; ++q) t[q] = acc[q];
    refcg_dw_store_px_avx512(j, r, t, c0, out_off, PX);
    return;
  }
  const int32_t nvalid = j->c - c0 < 16 ? j->c - c0 : 16;
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  uint8_t* out = (uint8_t*)j->epi.out + out_off + c0;
  for (int q = 0; q < PX; q += 4) {
    __m512i v[4];
    for (int i = 0; i < 4; ++i) v[i] = refcg_rq_planned_avx512(r, acc[q + i], plan);
    refcg_store_4px_avx512(out + q * j->o_w, j->o_w, mask, v, r, j->epi.out_dtype == REFCG_U8);
  }
}

/* The same for kernel rows K taps wide, undilated along W, stride S: per kernel row the
 * (PX - 1) * S + K input columns of the PX pixels are widened once and shared by the taps that
 * read them (pixel q's tap kw is column q * S + kw), instead of one widening per pixel and tap. */
REFCG_INLINE void refcg_dw_cols_avx512(const refcg_dw_job* j, const uint8_t* base, int64_t rowb, const int32_t* wide,
                                       int32_t c0, const refcg_rqv_avx512* r, __m512i corr, int64_t out_off,
                                       const int K, const int PX, const int S, const int plan) {
  __m512i acc[8], col[(8 - 1) * 2 + 5]; /* at most 27 of the 32 zmm with the weight */
  for (int q = 0; q < PX; ++q) acc[q] = corr;
  for (int32_t kh = 0; kh < j->kh; ++kh, base += rowb) {
    for (int i = 0; i < (PX - 1) * S + K; ++i)
      col[i] = _mm512_cvtepu8_epi32(refcg_dw_load16_avx512(j, base + (int64_t)i * j->cp));
    for (int kw = 0; kw < K; ++kw) {
      const __m512i w = _mm512_load_si512(wide + 16 * (kh * K + kw));
      for (int q = 0; q < PX; ++q) acc[q] = _mm512_dpwssd_epi32(acc[q], col[q * S + kw], w);
    }
  }
  refcg_dw_cols_store_avx512(j, r, acc, c0, out_off, PX, plan);
}

/* Row quads (j->wq, refcg_dw_quad_weights): kernel rows [4 g, 4 g + n) of one padded column's 16
 * channels (rows rowb bytes apart) as vpdpbusd lanes, channel c's n bytes in lane c (the rest 0):
 * the rows' 16-byte loads in the 128-bit lanes, vpermd brings dword k of every row into lane k,
 * vpshufb interleaves the rows' bytes channel by channel; the n rows' bytes XOR j->flip. */
REFCG_INLINE __m512i refcg_dw_quad_col_avx512(const refcg_dw_job* j, const uint8_t* x, int64_t rowb, const int n) {
  if (n == 1) return _mm512_cvtepu8_epi32(refcg_dw_load16_avx512(j, x));
  __m512i v = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i*)x));
  v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(x + rowb)), 1);
  if (n > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(x + 2 * rowb)), 2);
  if (n > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(x + 3 * rowb)), 3);
  v = _mm512_mask_xor_epi32(v, (__mmask16)((1u << 4 * n) - 1u), v, _mm512_set1_epi8((char)j->flip));
  const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(dwords, v), bytes);
}

/* refcg_dw_cols_avx512 for a K x K kernel on row quads: each padded column of the PX pixels is
 * built once per group of 4 kernel rows and feeds every tap that reads it (pixel q's column kw is
 * q * S + kw), one vpdpbusd for 4 taps where vpdpwssd did one. wq: the block's quad weights,
 * [group][kw]. R2 (3x3 undilated along H, R2 its stride along H: 1 or 2): output rows oh and oh + 1
 * at once from the columns of their 3 + R2 input rows, half (stride 1) or 3/5 (stride 2) of the column
 * builds per output: row oh's weights in bytes 0-2 of the first quad; row oh + 1's in bytes 1-3
 * (stride 1), or in bytes 2-3 and, its third row, byte 0 of a one-row column (stride 2). */
REFCG_INLINE void refcg_dwq_cols_avx512(const refcg_dw_job* j, const uint8_t* base, int64_t rowb, const __m512i* wq,
                                        int32_t c0, const refcg_rqv_avx512* r, __m512i corr, int64_t out_off,
                                        const int K, const int PX, const int S, const int plan, const int R2) {
  __m512i acc[8], acc2[8], wq2[2][5];
  for (int q = 0; q < PX; ++q) acc[q] = acc2[q] = corr;
  for (int kw = 0; R2 && kw < K; ++kw) { /* row oh + 1's weights: [0] on the first quad, [1] the one-row column */
    wq2[0][kw] = _mm512_slli_epi32(wq[kw], 8 * R2);
    wq2[1][kw] = _mm512_srli_epi32(wq[kw], 16);
  }
  const int groups = R2 ? R2 : (K + 3) / 4;
  /* unrolled completely (acc in registers): up to 19 columns x 5 taps, past GCC's default peeling */
  REFCG_UNROLL
  for (int g = 0; g < groups; ++g) {
    const int n = R2 ? (g ? 1 : 4) : K - 4 * g < 4 ? K - 4 * g : 4;
    REFCG_UNROLL
    for (int i = 0; i < (PX - 1) * S + K; ++i) {
      const __m512i col = refcg_dw_quad_col_avx512(j, base + 4 * g * rowb + (int64_t)i * j->cp, rowb, n);
      REFCG_UNROLL
      for (int kw = 0; kw < K; ++kw)
        if (i >= kw && (i - kw) % S == 0 && (i - kw) / S < PX) {
          if (!R2 || !g) acc[(i - kw) / S] = _mm512_dpbusd_epi32(acc[(i - kw) / S], col, wq[g * K + kw]);
          if (R2) acc2[(i - kw) / S] = _mm512_dpbusd_epi32(acc2[(i - kw) / S], col, wq2[g][kw]);
        }
    }
  }
  refcg_dw_cols_store_avx512(j, r, acc, c0, out_off, PX, plan);
  if (R2) refcg_dw_cols_store_avx512(j, r, acc2, c0, out_off + j->o_h, PX, plan);
}

/* The plan of the column kernels' epilogue: REFCG_PLAN_ANY unless the output is 8-bit channels-last. */
REFCG_INLINE int refcg_dw_plan_avx512(const refcg_dw_job* j, const refcg_rqv_avx512* r) {
  return refcg_epi_vector_bytes(&j->epi) ? refcg_rq_plan_avx512(r) : REFCG_PLAN_ANY;
}

/* Pixels [ow, out_w) of one output row with refcg_dw_cols_avx512 (or on row quads,
 * refcg_dwq_cols_avx512), PX at a time (refcg_dw_next). */
#define REFCG_DW_COLS_ROW(K, PX, S, MIN)                                                                     \
  for (; ow + (PX) <= j->out_w; ow = refcg_dw_next(ow, j->out_w, PX, MIN))                                   \
    refcg_dw_cols_avx512(j, row + ow * pstride, rowb, wide, c0, r, corr, oh * j->o_h + ow * j->o_w, K, PX, S, plan)
#define REFCG_DWQ_COLS_ROW(K, PX, S, MIN)                                                                    \
  for (; ow + (PX) <= j->out_w; ow = refcg_dw_next(ow, j->out_w, PX, MIN))                                   \
    refcg_dwq_cols_avx512(j, row + ow * pstride, rowb, wq, c0, r, corr, oh * j->o_h + ow * j->o_w, K, PX, S, plan, 0)
#define REFCG_DWQ2_COLS_ROW(K, PX, S, MIN)                                                                   \
  for (; ow + (PX) <= j->out_w; ow = refcg_dw_next(ow, j->out_w, PX, MIN))                                   \
    refcg_dwq_cols_avx512(j, row + ow * pstride, rowb, wq, c0, r, corr, oh * j->o_h + ow * j->o_w, K, PX, S, plan, S)

/* Output rows [r0, r1) of channels [c0, c0 + 16): the column kernels (cols), epilogue under plan,
 * then 4 and 1 pixels at a time with refcg_dw_px_avx512. */
REFCG_INLINE void refcg_dw_rows_avx512(const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int cols,
                                       const int32_t* wide, const __m512i* wq, const int64_t* toff,
                                       const refcg_rqv_avx512* r, __m512i corr, const int plan) {
  const int64_t rowb = (int64_t)j->dh * j->wp * j->cp, pstride = (int64_t)j->sw * j->cp;
  const int32_t taps = j->kh * j->kw;
  const int pairs = wq && j->kh == 3 && j->kw == 3 && j->sh == j->sw && j->sh <= 2 && j->dh == 1;
  for (int64_t oh = r0; oh < r1; ++oh) {
    const uint8_t* row = refcg_dw_row(j, oh * j->sh) + c0;
    int32_t ow = 0;
    const int two = pairs && oh + 1 < r1; /* rows oh and oh + 1 (refcg_dwq_cols_avx512's R2) */
    if (two && j->sh == 1) {
      REFCG_DW_COLS_SHAPE(REFCG_DWQ2_COLS_ROW, REFCG_DW_NO_NARROW, 1, 3, 1);
    } else if (two) {
      REFCG_DW_COLS_SHAPE(REFCG_DWQ2_COLS_ROW, REFCG_DW_NO_NARROW, 1, 3, 2);
    } else if (wq) { /* row quads: 3x3 and 5x5 (refcg_dw_quad_weights) */
      REFCG_DW_COLS_SHAPES(REFCG_DWQ_COLS_ROW, REFCG_DW_NO_NARROW, 1);
    } else if (cols) {
      REFCG_DW_COLS_SHAPES(REFCG_DW_COLS_ROW, REFCG_DW_NO_NARROW, 1);
    }
    for (int32_t h = 0; h <= two; ++h, row += j->sh * j->wp * j->cp) { /* pixels the column kernels left (or all) */
      const int64_t out_off = (oh + h) * j->o_h;
      int32_t x = ow;
      for (; x + 4 <= j->out_w; x += 4)
        refcg_dw_px_avx512(j, row + x * pstride, pstride, wide, toff, taps, c0, r, corr, out_off + x * j->o_w, 4);
      for (; x < j->out_w; ++x)
        refcg_dw_px_avx512(j, row + x * pstride, pstride, wide, toff, taps, c0, r, corr, out_off + x * j->o_w, 1);
    }
    oh += two;
  }
}

REFCG_DEFINE_BY_PLAN(refcg_dw_rows_by_plan_avx512, refcg_dw_rows_avx512,
                     (const refcg_dw_job* j, int64_t r0, int64_t r1, int32_t c0, int cols, const int32_t* wide,
                      const __m512i* wq, const int64_t* toff, const refcg_rqv_avx512* r, __m512i corr),
                     (j, r0, r1, c0, cols, wide, wq, toff, r, corr))

static void refcg_dw_avx512(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_dw_job* j = (const refcg_dw_job*)ctx;
  const int32_t taps = j->kh * j->kw;
  if (taps > 32) {
    refcg_dw_rows(j, r0, r1, refcg_dw16_avx512, refcg_epi_avx512);
    return;
  }
  /* the column-sharing kernels: 3- and 5-wide rows, stride 1 or 2, 8 then 4 pixels at a time. Blocks
   * outermost, over all rows: chunks of rows that stay in L2 while every block passes them (AVX2's
   * refcg_dw_ymm) measured 0.88-0.91x on 144@56 stride 2, 1.04x on 96@112 stride 2 (Zen 4). */
  const int cols = refcg_dw_cols_fit(j);
  int64_t toff[32];
  int32_t wide[32 * 16] __attribute__((aligned(64)));
  for (int32_t t = 0; t < taps; ++t) toff[t] = ((int64_t)(t / j->kw) * j->dh * j->wp + (int64_t)(t % j->kw) * j->dw) * j->cp;
  for (int32_t c0 = 0; c0 < j->c; c0 += 16) {
    for (int32_t t = 0; t < taps; ++t)
      _mm512_store_si512(wide + 16 * t, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)(j->w + (int64_t)t * j->cp + c0))));
    const __mmask16 mask = (__mmask16)((1u << (j->c - c0 < 16 ? j->c - c0 : 16)) - 1u);
    const refcg_rqv_avx512 r = refcg_rqv_load_avx512(j->epi.rq, c0, mask, 1);
    const __m512i corr = _mm512_maskz_loadu_epi32(mask, j->epi.corr + c0);
    const int plan = cols ? refcg_dw_plan_avx512(j, &r) : REFCG_PLAN_ANY;
    __m512i wq[2 * 5]; /* row quads: the block's [group][kw] weights */
    const int quads = cols && j->wq; /* refcg_conv2d sets wq for square 3x3 and 5x5 only */
    for (int32_t g = 0; quads && g < (j->kh + 3) / 4; ++g)
      for (int32_t kw = 0; kw < j->kw; ++kw)
        wq[g * j->kw + kw] = _mm512_loadu_si512(j->wq + (((int64_t)g * j->kw + kw) * j->cp + c0) * 4);
    refcg_dw_rows_by_plan_avx512[REFCG_PLAN_INDEX(plan)](j, r0, r1, c0, cols, wide, quads ? wq : NULL, toff, &r, corr);
  }
}

/* Store 16 pixels (raw accumulators + correction) of one output row at off, n valid (o_w == 1). */
REFCG_INLINE void refcg_dwp_store_avx512(const refcg_epi* e, const refcg_rqv_avx512* r, __m512i acc, int32_t oc,
                                         int64_t off, int32_t n) {
  if (!e->rq_vector) {
    int32_t t[16];
    _mm512_storeu_si512(t, acc);
    for (int32_t l = 0; l < n; ++l) refcg_store(e->out, off + l, e->out_dtype, refcg_requantize_one(e->rq, t[l], oc));
    return;
  }
  const __mmask16 mask = (__mmask16)((1u << n) - 1u);
  const __m512i v = refcg_rq_apply_avx512(r, acc);
  if (e->out_dtype == REFCG_S32)
    _mm512_mask_storeu_epi32((int32_t*)e->out + off, mask, v);
  else
    refcg_store16_bytes_avx512((uint8_t*)e->out + off, mask, v);
}

/* Expand a padded row: per group and 16 pixels one 64-byte load, vpermd (lane k: bytes from
 * 4 * k * sw) and vpshufb (the Q taps of each pixel into its 32-bit lane). */
REFCG_INLINE void refcg_dwp_expand_avx512(const refcg_dwp_job* j, const uint8_t* row, int32_t* e) {
  const __m512i idx = _mm512_loadu_si512(j->ix), ctl = _mm512_loadu_si512(j->ctl);
  const int32_t sw = j->p->stride_w, qdw = j->q * j->p->dilation_w, owp = j->owp;
  for (int32_t i = 0; i < j->g; ++i, row += qdw, e += owp)
    for (int32_t ow = 0; ow < owp; ow += 16)
      _mm512_store_si512(e + ow, _mm512_shuffle_epi8(_mm512_permutexvar_epi32(idx, _mm512_loadu_si512(row + ow * sw)), ctl));
}

/* The requantize constants and correction of one output channel. */
typedef struct {
  refcg_rqv_avx512 r;
  __m512i corr;
} refcg_dwpk_avx512;

/* NB blocks of 16 pixels: vpdpbusd per kernel row and group; KH, G nonzero: the kernel rows and
 * groups known at compile time (loops unrolled). */
REFCG_INLINE void refcg_dwp_nb_avx512(const refcg_dwp_strip* s, const refcg_dwpk_avx512* k, int64_t lane_off,
                                      int64_t off, int32_t n, const int KH, const int G, const int NB) {
  __m512i acc[4];
  for (int b = 0; b < NB; ++b) acc[b] = k->corr;
  const int32_t kh = KH ? KH : s->kh, g = G ? G : s->g, owp = s->owp;
  const int32_t* e = s->e + lane_off;
  for (int32_t r = 0; r < kh; ++r, e += s->row_step)
    for (int32_t i = 0; i < g; ++i) {
      const __m512i w = _mm512_set1_epi32(s->words[r * g + i]);
      for (int b = 0; b < NB; ++b) acc[b] = _mm512_dpbusd_epi32(acc[b], _mm512_load_si512(e + i * owp + 16 * b), w);
    }
  if (s->epi.rq_vector && s->epi.out_dtype != REFCG_S32) { /* the NB * 16 pixels as one store */
    for (int b = 0; b < NB; ++b) acc[b] = refcg_rq_unclamped_avx512(&k->r, acc[b]);
    refcg_store_bytes_avx512((uint8_t*)s->epi.out + off, acc, NB, &k->r, s->epi.out_dtype == REFCG_U8, n);
    return;
  }
  for (int b = 0; b < NB; ++b) refcg_dwp_store_avx512(&s->epi, &k->r, acc[b], s->oc, off + 16 * b, n - 16 * b < 16 ? n - 16 * b : 16);
}

REFCG_INLINE void refcg_dwp_blocks_avx512(const refcg_dwp_strip* s, const void* k, int64_t lane_off, int64_t off,
                                          int32_t n, int32_t nb) {
  REFCG_NB_SWITCH(nb, refcg_dwp_nb_avx512, s, (const refcg_dwpk_avx512*)k, lane_off, off, n, 0, 0);
}

REFCG_INLINE void refcg_dwp_blocks3x3_avx512(const refcg_dwp_strip* s, const void* k, int64_t lane_off, int64_t off,
                                             int32_t n, int32_t nb) {
  REFCG_NB_SWITCH(nb, refcg_dwp_nb_avx512, s, (const refcg_dwpk_avx512*)k, lane_off, off, n, 3, 1);
}

/* 3x3 kernels (one group per kernel row) get unrolled loops. */
REFCG_INLINE void refcg_dwp_strip_avx512(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                         int32_t oh0, int32_t oh1) {
  const refcg_dwp_strip s = refcg_dwp_strip_of(j, e, words, oc);
  const refcg_dwpk_avx512 k = {refcg_rqv_load_avx512(s.epi.rq, oc, 0, 0), _mm512_set1_epi32(s.epi.corr[oc])};
  if (s.kh == 3 && s.g == 1)
    refcg_dwp_walk(j, &s, &k, oh0, oh1, 16, refcg_dwp_blocks3x3_avx512);
  else
    refcg_dwp_walk(j, &s, &k, oh0, oh1, 16, refcg_dwp_blocks_avx512);
}

static void refcg_dwp_avx512(const void* ctx, int64_t c0, int64_t c1) {
  refcg_dwp_channels((const refcg_dwp_job*)ctx, c0, c1, 8, refcg_dwp_expand_avx512, refcg_dwp_strip_avx512);
}

/* refcg_gemmp_job tiles: 6 output channels x NV blocks of 16 pixels (up to 24 accumulators), like
 * the NHWC tile with the operands' roles swapped. */
REFCG_INLINE void refcg_gemmp_tile_avx512(const refcg_gemmp_job* j, int32_t oc0, int64_t p0, const int NV) {
  const int8_t* wrow[REFCG_GEMMP_MR];
  const int32_t rows = refcg_gemmp_wrows(j, oc0, wrow);
  __m512i sum[REFCG_GEMMP_MR][4], acc[REFCG_GEMMP_MR][4];
  for (int r = 0; r < REFCG_GEMMP_MR; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = _mm512_setzero_si512();
  const uint8_t* x = j->xi + p0 * 4;
  for (int32_t q = 0; q < j->kp / 4; ++q, x += j->hw * 4) {
    __m512i xv[4];
    for (int v = 0; v < NV; ++v) xv[v] = _mm512_loadu_si512(x + 64 * v);
    for (int r = 0; r < REFCG_GEMMP_MR; ++r) {
      const __m512i w = _mm512_set1_epi32(refcg_load_i32((const uint8_t*)wrow[r] + (int64_t)q * 64));
      for (int v = 0; v < NV; ++v) sum[r][v] = _mm512_dpbusd_epi32(sum[r][v], xv[v], w);
    }
  }
  /* sum is indexed by constants only, so it stays in registers; the epilogue's run-time row index
   * reads this copy (indexing sum itself made GCC 12 store all 24 accumulators every k step) */
  for (int r = 0; r < REFCG_GEMMP_MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = sum[r][v];
  const int bytes = j->epi.rq_vector && j->epi.out_dtype != REFCG_S32;
  for (int r = 0; r < rows; ++r) {
    const int32_t oc = oc0 + r;
    const refcg_rqv_avx512 rv = refcg_rqv_load_avx512(j->epi.rq, oc, 0, 0); /* channel oc in every lane */
    const __m512i corr = _mm512_set1_epi32(j->epi.corr[oc]);
    if (bytes) { /* the row's NV * 16 pixels as one store */
      __m512i v[4];
      for (int b = 0; b < NV; ++b) v[b] = refcg_rq_unclamped_avx512(&rv, _mm512_add_epi32(acc[r][b], corr));
      refcg_store_bytes_avx512((uint8_t*)j->epi.out + oc * j->epi.o_c + p0, v, NV, &rv, j->epi.out_dtype == REFCG_U8,
                               j->hw - p0);
      continue;
    }
    for (int v = 0; v < NV; ++v) {
      const int64_t p = p0 + 16 * v;
      if (p >= j->hw) break;
      refcg_dwp_store_avx512(&j->epi, &rv, _mm512_add_epi32(acc[r][v], corr), oc, oc * j->epi.o_c + p,
                             j->hw - p < 16 ? (int32_t)(j->hw - p) : 16);
    }
  }
}

/* Tiles: (group of 64 pixels) x (block of 6 channels), channel blocks fastest: the pixels'
 * 64 x kp bytes stay in L1 while the weights stream. The last group runs only the 16-pixel
 * blocks it has (a 14x14 plane: 13 blocks, not 16). */
static void refcg_gemmp_avx512(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_gemmp_job* j = (const refcg_gemmp_job*)ctx;
  const int64_t ncb = (j->n + REFCG_GEMMP_MR - 1) / REFCG_GEMMP_MR;
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t oc0 = (int32_t)(t % ncb) * REFCG_GEMMP_MR;
    const int64_t p0 = t / ncb * REFCG_GEMMP_PX, blocks = (j->hw - p0 + 15) / 16;
    if (blocks >= 4)
      refcg_gemmp_tile_avx512(j, oc0, p0, 4);
    else if (blocks == 3)
      refcg_gemmp_tile_avx512(j, oc0, p0, 3);
    else if (blocks == 2)
      refcg_gemmp_tile_avx512(j, oc0, p0, 2);
    else
      refcg_gemmp_tile_avx512(j, oc0, p0, 1);
  }
}

/* ---- qnn.add / subtract / mul: 16 elements per step, requantized like refcg_binary_one ---- */
typedef struct {
  refcg_rqv_avx512 ra, rb;
  __m512i azp, bzp, ozp, lo, hi;
  __m512i lo8, hi8; /* the output range as bytes (refcg_pack_bytes_avx512) */
  __m512i pa, pb;   /* refcg_bin_preshift of each operand */
  int plan;         /* both operands' requantize plan, REFCG_PLAN_ANY where they differ */
  int pre;          /* some operand shifts first (plan REFCG_PLAN_I64_UP) */
  int clamp_ab;     /* add/subtract: the operands' requantize clamps (not to the whole int32 range) */
  int n32;          /* add/subtract: both operands' requantize in 32 bits (refcg_rq32; m32, c32, s32) */
  __m512i m32[2], c32[2], s32[2];
} refcg_binc_avx512;

/* Up to 16 8-bit elements at x (stride 1) or x[0] in every lane (stride 0) as int32. */
REFCG_INLINE __m512i refcg_bin_load_avx512(const uint8_t* x, int64_t stride, int32_t dtype, __mmask16 mask) {
  if (stride == 0) return _mm512_set1_epi32(refcg_load(x, 0, dtype));
  const __m128i v = _mm_maskz_loadu_epi8(mask, x);
  return dtype == REFCG_S8 ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}

/* 16 elements (lanes in mask) under plan (a constant), before the output clamp: mul's product
 * requantized once, or add / subtract of both operands requantized (shifted first where pre). */
REFCG_INLINE __m512i refcg_bin_vec_avx512(const refcg_binc_avx512* k, const uint8_t* a, int64_t sa, int32_t adt,
                                          const uint8_t* b, int64_t sb, int32_t bdt, __mmask16 mask, int32_t op,
                                          const int plan, const int pre) {
  __m512i x = refcg_bin_load_avx512(a, sa, adt, mask), y = refcg_bin_load_avx512(b, sb, bdt, mask);
  if (op == REFCG_BIN_MUL) /* (x - a_zp) * (y - b_zp) wraps in int32, then one requantize (ra clamps) */
    return refcg_rq_planned_avx512(&k->ra, _mm512_mullo_epi32(_mm512_sub_epi32(x, k->azp), _mm512_sub_epi32(y, k->bzp)), plan);
  __m512i qa, qb;
  if (plan == REFCG_PLAN_N32) {
    qa = _mm512_srav_epi32(_mm512_add_epi32(_mm512_mullo_epi32(x, k->m32[0]), k->c32[0]), k->s32[0]);
    qb = _mm512_srav_epi32(_mm512_add_epi32(_mm512_mullo_epi32(y, k->m32[1]), k->c32[1]), k->s32[1]);
  } else {
    if (pre) { /* the zero points were shifted with them (refcg_bin_avx512) */
      x = _mm512_sllv_epi32(x, k->pa);
      y = _mm512_sllv_epi32(y, k->pb);
    }
    qa = refcg_rq_planned_avx512(&k->ra, x, plan);
    qb = refcg_rq_planned_avx512(&k->rb, y, plan);
  }
  if (k->clamp_ab) {
    qa = _mm512_max_epi32(_mm512_min_epi32(qa, k->ra.hi), k->ra.lo);
    qb = _mm512_max_epi32(_mm512_min_epi32(qb, k->rb.hi), k->rb.lo);
  }
  return op == REFCG_BIN_SUB ? _mm512_add_epi32(_mm512_sub_epi32(qa, qb), k->ozp) : _mm512_sub_epi32(_mm512_add_epi32(qa, qb), k->ozp);
}

/* n elements under plan: 64 per step packed and clamped as bytes at once (vpmovdb per vector held the
 * loop to ~1.4 cycles per element on Zen 4), then 16 per step. */
REFCG_INLINE void refcg_bin_planned_avx512(const refcg_binc_avx512* k, const uint8_t* a, int64_t sa, int32_t adt,
                                           const uint8_t* b, int64_t sb, int32_t bdt, uint8_t* out, int64_t n, int32_t op,
                                           int is_unsigned, const int plan, const int pre) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i v[4];
    for (int q = 0; q < 4; ++q)
      v[q] = refcg_bin_vec_avx512(k, a + (i + 16 * q) * sa, sa, adt, b + (i + 16 * q) * sb, sb, bdt, 0xFFFF, op, plan, pre);
    _mm512_storeu_si512(out + i, refcg_pack_bytes_avx512(v, 4, k->lo8, k->hi8, is_unsigned));
  }
  for (; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
    const __m512i v = refcg_bin_vec_avx512(k, a + i * sa, sa, adt, b + i * sb, sb, bdt, mask, op, plan, pre);
    refcg_store16_bytes_avx512(out + i, mask, _mm512_max_epi32(_mm512_min_epi32(v, k->hi), k->lo));
  }
}

REFCG_INLINE void refcg_bin_row_avx512(const refcg_bin_job* j, const void* ctx, int64_t ia, int64_t ib, int64_t io,
                                       int64_t n) {
  const refcg_binc_avx512* k = (const refcg_binc_avx512*)ctx;
  const refcg_binary_params* p = j->p;
  const int64_t sa = j->as[j->ndim - 1], sb = j->bs[j->ndim - 1];
  const int32_t op = p->op, adt = p->a_dtype, bdt = p->b_dtype;
  const uint8_t* a = j->a + ia;
  const uint8_t* b = j->b + ib;
  uint8_t* out = j->out + io;
  const int u8 = p->out_dtype == REFCG_U8;
  if (k->n32) {
    refcg_bin_planned_avx512(k, a, sa, adt, b, sb, bdt, out, n, op, u8, REFCG_PLAN_N32, 0);
    return;
  }
  if (k->pre) {
    refcg_bin_planned_avx512(k, a, sa, adt, b, sb, bdt, out, n, op, u8, REFCG_PLAN_I64_UP, 1);
    return;
  }
#define REFCG_BIN_PLANNED_AVX512(q) refcg_bin_planned_avx512(k, a, sa, adt, b, sb, bdt, out, n, op, u8, q, 0)
  REFCG_WITH_PLAN(k->plan, REFCG_BIN_PLANNED_AVX512);
#undef REFCG_BIN_PLANNED_AVX512
}

/* A pixel of refcg_pool_pixels into channels last, 64 channels per masked step over its tap list: the
 * generic loops pay a scalar tail per tap where a pixel has few channels (24 in ShuffleNetV2's stem:
 * 10x slower) and keep their sums in memory (Inception-v3's 3x3 averages: 2x slower). MAX: bytes in
 * the unsigned domain; else an average (S8: of int8) in int16 lanes, stored as bytes or int32 (S32),
 * divided as REFCG_POOL_AWAY says. */
REFCG_INLINE void refcg_pool_pixel_avx512(const refcg_pool_job* j, const refcg_pool_px* px, const int MAX, const int S8,
                                          const int S32) {
  const int64_t channels = j->p->channels;
  const __m512i flip = _mm512_set1_epi8((char)j->flip);
  const __m512 r = _mm512_set1_ps(1.0f / px->div), away = _mm512_set1_ps(REFCG_POOL_AWAY);
  for (int64_t c0 = 0; c0 < channels; c0 += 64) {
    const __mmask64 mask = channels - c0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (channels - c0)) - 1);
    const uint8_t* in = px->in + c0;
    if (MAX) {
      __m512i top = _mm512_setzero_si512(); /* the dtype minimum in the unsigned domain */
      for (int32_t t = 0; t < px->ntaps; ++t)
        top = _mm512_max_epu8(top, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, in + px->taps[t]), flip));
      _mm512_mask_storeu_epi8(px->out + c0, mask, _mm512_xor_si512(top, flip));
      continue;
    }
    __m512i sum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int32_t t = 0; t < px->ntaps; ++t)
      for (int h = 0; h < 2; ++h) {
        const __m256i b = _mm256_maskz_loadu_epi8((__mmask32)(mask >> (32 * h)), in + px->taps[t] + 32 * h);
        sum[h] = _mm512_add_epi16(sum[h], S8 ? _mm512_cvtepi8_epi16(b) : _mm512_cvtepu8_epi16(b));
      }
    __m128i bytes[4];
    for (int q = 0; q < 4; ++q) {
      const __m256i s16 = q & 1 ? _mm512_extracti64x4_epi64(sum[q >> 1], 1) : _mm512_castsi512_si256(sum[q >> 1]);
      const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(s16)), r);
      const __m512i v = _mm512_cvttps_epi32(_mm512_add_ps(f, _mm512_or_ps(away, _mm512_and_ps(f, _mm512_set1_ps(-0.0f)))));
      if (S32)
        _mm512_mask_storeu_epi32((int32_t*)px->out + c0 + 16 * q, (__mmask16)(mask >> (16 * q)), v);
      else /* averages of bytes fit the dtype: the low byte */
        bytes[q] = _mm512_cvtepi32_epi8(v);
    }
    if (!S32) {
      const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(bytes[0]), bytes[1], 1);
      const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(bytes[2]), bytes[3], 1);
      _mm512_mask_storeu_epi8(px->out + c0, mask, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
  }
}

REFCG_DEFINE_POOL_PIXELS(avx512)

/* refcg_reduce_rows8_fn: 64 lanes at a time in four registers of 16 int32 sums, the last block's
 * loads masked (acc has REFCG_REDUCE_CHUNK lanes: a whole block's sums fit, the masked lanes add 0). */
#define REFCG_REDUCE_ROWS_AVX512(CVT)                                                                   \
  do {                                                                                                  \
    __m512i s_[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),            \
                     _mm512_setzero_si512()};                                                           \
    const uint8_t* p_ = x + i;                                                                          \
    for (int64_t r = 0; r < rows; ++r, p_ += stride)                                                    \
      for (int g = 0; g < 4; ++g)                                                                       \
        s_[g] = _mm512_add_epi32(s_[g], CVT(_mm_maskz_loadu_epi8((__mmask16)(mask >> (16 * g)), p_ + 16 * g))); \
    for (int g = 0; g < 4; ++g)                                                                         \
      _mm512_storeu_si512(acc + i + 16 * g, _mm512_add_epi32(_mm512_loadu_si512(acc + i + 16 * g), s_[g])); \
  } while (0)

static int64_t refcg_reduce_rows8_avx512(const uint8_t* x, int64_t stride, int64_t rows, int is_signed, uint32_t* acc,
                                         int64_t n) {
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 mask = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
    if (is_signed)
      REFCG_REDUCE_ROWS_AVX512(_mm512_cvtepi8_epi32);
    else
      REFCG_REDUCE_ROWS_AVX512(_mm512_cvtepu8_epi32);
  }
  return n;
}

static void refcg_reduce_avx512(const void* ctx, int64_t t0, int64_t t1) {
  refcg_reduce_run_chunks((const refcg_reduce_job*)ctx, t0, t1, refcg_reduce_rows8_avx512);
}

/* refcg_bin_preshift on r: the right-shift plan with the zero point shifted as the operand will be;
 * the shift count in every lane. */
REFCG_INLINE __m512i refcg_bin_preshift_avx512(const refcg_requant* rq, refcg_rqv_avx512* r) {
  const int32_t l1 = refcg_bin_preshift(rq);
  const int ok = l1 && refcg_rq_fold_avx512(r, (int32_t)((uint32_t)rq->input_zp << l1), rq->output_zp);
  if (ok) r->general = 0;
  return _mm512_set1_epi32(ok ? l1 : 0);
}

/* refcg_rq32 of one 8-bit operand (dtype; requantize rq, r its vector constants): the candidate
 * taken where it equals refcg_rq_unclamped_avx512 on all 256 values, as m, c, s in every lane. */
REFCG_INLINE int refcg_bin_rq32_avx512(const refcg_requant* rq, const refcg_rqv_avx512* r, int32_t dtype, __m512i* m,
                                       __m512i* c, __m512i* s) {
  const int32_t lo = dtype == REFCG_S8 ? -128 : 0;
  refcg_rq32 f;
  for (int variant = 0; variant < REFCG_RQ32_VARIANTS; ++variant) {
    if (!refcg_rq32_candidate(rq, lo, variant, &f)) continue;
    *m = _mm512_set1_epi32(f.m);
    *c = _mm512_set1_epi32(f.c);
    *s = _mm512_set1_epi32(f.s);
    __mmask16 differ = 0;
    for (int32_t x0 = lo; x0 < lo + 256; x0 += 16) {
      const __m512i x = _mm512_add_epi32(_mm512_set1_epi32(x0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      differ |= _mm512_cmpneq_epi32_mask(refcg_rq_unclamped_avx512(r, x),
                                         _mm512_srav_epi32(_mm512_add_epi32(_mm512_mullo_epi32(x, *m), *c), *s));
    }
    if (!differ) return 1;
  }
  return 0;
}

static void refcg_bin_avx512(const void* ctx, int64_t r0, int64_t r1) {
  const refcg_bin_job* j = (const refcg_bin_job*)ctx;
  const refcg_binary_params* p = j->p;
  refcg_binc_avx512 k;
  k.ra = refcg_rqv_load8_avx512(&p->rq_a, 0, 0, 0, p->op != REFCG_BIN_MUL); /* mul: a product, not 8-bit */
  k.rb = refcg_rqv_load8_avx512(&p->rq_b, 0, 0, 0, 1);
  k.azp = _mm512_set1_epi32(p->a_zp);
  k.bzp = _mm512_set1_epi32(p->b_zp);
  k.ozp = _mm512_set1_epi32(p->out_zp);
  int32_t lo, hi;
  refcg_bin_out_range(p, &lo, &hi);
  k.lo = _mm512_set1_epi32(lo);
  k.hi = _mm512_set1_epi32(hi);
  k.lo8 = _mm512_set1_epi8((char)lo);
  k.hi8 = _mm512_set1_epi8((char)hi);
  k.clamp_ab = refcg_bin_clamps_operands(p);
  k.plan = p->op == REFCG_BIN_MUL ? refcg_rq_plan_avx512(&k.ra)
                                  : REFCG_PLAN_MEET(refcg_rq_plan_avx512(&k.ra), refcg_rq_plan_avx512(&k.rb));
  /* add/subtract: an operand that shifts first, where both then take the int64 right-shift plan */
  refcg_rqv_avx512 ra = k.ra, rb = k.rb;
  k.pa = refcg_bin_preshift_avx512(&p->rq_a, &ra);
  k.pb = refcg_bin_preshift_avx512(&p->rq_b, &rb);
  k.pre = p->op != REFCG_BIN_MUL && (ra.general != k.ra.general || rb.general != k.rb.general) &&
          REFCG_PLAN_MEET(refcg_rq_plan_avx512(&ra), refcg_rq_plan_avx512(&rb)) == REFCG_PLAN_I64_UP;
  k.n32 = p->op != REFCG_BIN_MUL &&
          refcg_bin_rq32_avx512(&p->rq_a, &k.ra, p->a_dtype, &k.m32[0], &k.c32[0], &k.s32[0]) &&
          refcg_bin_rq32_avx512(&p->rq_b, &k.rb, p->b_dtype, &k.m32[1], &k.c32[1], &k.s32[1]);
  if (k.pre) {
    k.ra = ra;
    k.rb = rb;
  }
  refcg_bin_rows(j, &k, r0, r1, refcg_bin_row_avx512);
}

/* ---- table lookups (refcg_lut_job): 64 bytes per step with AVX512-VBMI's two-table byte permute
 * (vpermi2b; Ice Lake and Zen 4 on, not Skylake-X or Cascade Lake): the table's halves indexed by the
 * low 7 bits, chosen by the top one; without VBMI, refcg_lut_avx2 ---- */
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi"))) static void
refcg_lut_bytes_vbmi(const uint8_t* table, const uint8_t* in, uint8_t* out, int64_t n) {
  const __m512i q0 = _mm512_loadu_si512(table), q1 = _mm512_loadu_si512(table + 64);
  const __m512i q2 = _mm512_loadu_si512(table + 128), q3 = _mm512_loadu_si512(table + 192);
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 mask = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
    const __m512i x = _mm512_maskz_loadu_epi8(mask, in + i);
    const __m512i lo = _mm512_permutex2var_epi8(q0, x, q1), hi = _mm512_permutex2var_epi8(q2, x, q3);
    _mm512_mask_storeu_epi8(out + i, mask, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi));
  }
}

static void refcg_lut_avx512(const void* ctx, int64_t t0, int64_t t1) {
  refcg_lut_tasks((const refcg_lut_job*)ctx, t0, t1,
                  __builtin_cpu_supports("avx512vbmi") ? refcg_lut_bytes_vbmi : refcg_lut_bytes_avx2);
}

/* ---- qnn.requantize of 8-bit or int32 rows (refcg_rq_job): 64 elements per step (one pack), then 16, under the plan ---- */
/* 16 elements (lanes in mask) of a qnn.requantize input from element i: 8-bit or int32. */
REFCG_INLINE __m512i refcg_rq_load_avx512(const uint8_t* in, int64_t i, int32_t dtype, __mmask16 mask) {
  if (dtype == REFCG_S32) return _mm512_maskz_loadu_epi32(mask, (const int32_t*)in + i);
  return refcg_bin_load_avx512(in + i, 1, dtype, mask);
}

/* Elements [0, n) (n >= 16 NV) of a row, 16 NV per step (one pack, a plain store), the last 16 NV again
 * where a tail is left: the output is not the input, elements both steps hold get the same bytes
 * (masked stores are slow on Zen 4). */
REFCG_INLINE void refcg_rq_steps_avx512(const refcg_rqv_avx512* r, __m512i count, const uint8_t* in, int32_t dtype,
                                        uint8_t* out, int64_t n, int is_unsigned, const int plan, const int pre,
                                        const int NV) {
  for (int64_t i = 0; i < n; i += 16 * NV) {
    i = i + 16 * NV <= n ? i : n - 16 * NV;
    __m512i v[4];
    for (int q = 0; q < NV; ++q) {
      __m512i x = refcg_rq_load_avx512(in, i + 16 * q, dtype, 0xFFFF);
      if (pre) x = _mm512_sllv_epi32(x, count);
      v[q] = refcg_rq_planned_avx512(r, x, plan);
    }
    refcg_store_bytes_avx512(out + i, v, NV, r, is_unsigned, 16 * NV);
  }
}

/* A row of n elements: 64, 32 or 16 per step (refcg_rq_steps_avx512), a row under 16 in one masked step. */
REFCG_INLINE void refcg_rq_run_avx512(const refcg_rqv_avx512* r, __m512i count, const uint8_t* in, int32_t dtype,
                                      uint8_t* out, int64_t n, int is_unsigned, const int plan, const int pre) {
  if (n >= 64) {
    refcg_rq_steps_avx512(r, count, in, dtype, out, n, is_unsigned, plan, pre, 4);
  } else if (n >= 32) {
    refcg_rq_steps_avx512(r, count, in, dtype, out, n, is_unsigned, plan, pre, 2);
  } else if (n >= 16) {
    refcg_rq_steps_avx512(r, count, in, dtype, out, n, is_unsigned, plan, pre, 1);
  } else {
    const __mmask16 mask = (__mmask16)((1u << n) - 1u);
    __m512i x = refcg_rq_load_avx512(in, 0, dtype, mask);
    if (pre) x = _mm512_sllv_epi32(x, count);
    refcg_store16_bytes_avx512(out, mask, _mm512_max_epi32(_mm512_min_epi32(refcg_rq_planned_avx512(r, x, plan), r->hi), r->lo));
  }
}

static void refcg_requantize_avx512(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_rq_job* j = (const refcg_rq_job*)ctx;
  const refcg_requantize_params* p = j->p;
  const int narrow = p->in_dtype != REFCG_S32;
  refcg_rqv_avx512 r = refcg_rqv_load8_avx512(&p->rq, 0, 0, 0, narrow);
  const int plan = refcg_rq_plan_avx512(&r);
  /* 8-bit input: as a binary operand (int32: the right-shift plan without a shift first) */
  const __m512i count = narrow ? refcg_bin_preshift_avx512(&p->rq, &r) : _mm512_setzero_si512();
  const int pre = plan != refcg_rq_plan_avx512(&r);
  for (int64_t t = t0; t < t1; ++t) {
    int64_t i0, i1;
    const int64_t row = refcg_rq_chunk(j, t, &i0, &i1);
    const uint8_t* in = j->in + (row * j->n + i0) * (narrow ? 1 : 4);
    uint8_t* out = j->out + row * p->out_outer_stride + p->out_offset + i0;
    const int u8 = p->out_dtype == REFCG_U8;
    if (pre) {
      refcg_rq_run_avx512(&r, count, in, p->in_dtype, out, i1 - i0, u8, REFCG_PLAN_I64_UP, 1);
      continue;
    }
#define REFCG_RQ_RUN_AVX512(q) refcg_rq_run_avx512(&r, count, in, p->in_dtype, out, i1 - i0, u8, q, 0)
    REFCG_WITH_PLAN(plan, REFCG_RQ_RUN_AVX512);
#undef REFCG_RQ_RUN_AVX512
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* The AVX2 and AVX-VNNI sections use FMA (the float requantize of FMA targets): every AVX2 CPU has it. */
REFCG_INLINE int refcg_cpu_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#if defined(REFCG_AVXVNNI_AS_EVEX)
#define REFCG_AVXVNNI_FEATURES "avx2 fma avx512vnni avx512vl"
REFCG_INLINE int refcg_cpu_avxvnni(void) {
  return refcg_cpu_avx2() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
#else
#define REFCG_AVXVNNI_FEATURES "avx2 fma avxvnni"
REFCG_INLINE int refcg_cpu_avxvnni(void) { return refcg_cpu_avx2() && __builtin_cpu_supports("avxvnni"); }
#endif
REFCG_INLINE int refcg_cpu_avx512vnni(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

const refcg_isa_config refcg_isa_avx512vnni = {
    .name = "avx512vnni",
    .features = "avx512f avx512bw avx512vl avx512dq avx512vnni",
    .supported = refcg_cpu_avx512vnni,
    .signed_domain = 0,
    .gemm = {.mr = REFCG_X512_MR, .nv = REFCG_X512_NV, .tiles = refcg_tiles_avx512vnni, .planes = refcg_gemmp_avx512,
             .flips = refcg_flips_avx512, .wino = NULL, .reads_a16 = NULL},
    .dw = {.rows = refcg_dw_avx512, .planes = refcg_dwp_avx512, .pairs = 0, .quads = 1, .qmax = 4, .flips = 1},
    .binary_rows = refcg_bin_avx512,
    .pool = refcg_pool_avx512,
    .quantize = refcg_quant_avx2,
    .requantize = refcg_requantize_avx512,
    .lut = refcg_lut_avx512,
    .reduce = refcg_reduce_avx512,
    .gather = refcg_gather_avx512,
    .gather_by16 = refcg_cpu_lacks_vbmi,
};

const refcg_isa_config refcg_isa_avxvnni = {
    .name = "avxvnni",
    .features = REFCG_AVXVNNI_FEATURES,
    .supported = refcg_cpu_avxvnni,
    .signed_domain = 0,
    .gemm = {.mr = REFCG_AVX2_TABLE_MR, .nv = 1, .tiles = refcg_tiles_avxvnni, .planes = refcg_gemmp_avxvnni,
             .flips = refcg_flips_avxvnni, .wino = NULL, .reads_a16 = NULL},
    .dw = {.rows = refcg_dw_avxvnni, .planes = refcg_dwp_avxvnni, .pairs = 1, .quads = 1, .qmax = 4, .flips = 1},
    .binary_rows = refcg_bin_avx2,
    .pool = refcg_pool_avx2,
    .quantize = refcg_quant_avx2,
    .requantize = refcg_requantize_avx2,
    .lut = refcg_lut_avx2,
    .reduce = refcg_reduce_avx2,
    .gather = refcg_gather_avx2,
    .gather_by16 = refcg_cpu_avx2,
};

const refcg_isa_config refcg_isa_avx2 = {
    .name = "avx2",
    .features = "avx2 fma",
    .supported = refcg_cpu_avx2,
    .signed_domain = 0,
    .gemm = {.mr = REFCG_AVX2_TABLE_MR, .nv = 1, .tiles = refcg_tiles_avx2, .planes = NULL, .flips = refcg_flips_avx2,
             .wino = refcg_wino_avx2, .reads_a16 = refcg_reads_a16_avx2},
    .dw = {.rows = refcg_dw_avx2, .planes = refcg_dwp_avx2, .pairs = 1, .quads = 0, .qmax = 2, .flips = 1},
    .binary_rows = refcg_bin_avx2,
    .pool = refcg_pool_avx2,
    .quantize = refcg_quant_avx2,
    .requantize = refcg_requantize_avx2,
    .lut = refcg_lut_avx2,
    .reduce = refcg_reduce_avx2,
    .gather = refcg_gather_avx2,
    .gather_by16 = refcg_cpu_avx2,
};

#endif /* REFCG_HAVE_X86 */
