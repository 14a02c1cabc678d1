/*
 * Scalar requantize, bit-exact with TVM 0.19's lowering of qnn.requantize.
 * Wrapping int32/int64 arithmetic is written through unsigned types: TVM's
 * generated code wraps, and signed overflow would be undefined in C.
 */
#include <math.h>
#include "refcg_internal.h"

static inline int32_t refcg_wrap_sub32(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a - (uint32_t)b);
}

static inline int32_t refcg_wrap_add32(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a + (uint32_t)b);
}

/* tir.q_multiply_shift as lowered for x86 LLVM (src/target/intrin_rule.cc). */
static inline int32_t refcg_fpm_upward(int32_t x, int32_t m, int32_t s) {
  int32_t ls = s > 0 ? s : 0;
  int32_t t = 31 + (s > 0 ? 0 : -s);
  uint64_t v = (uint64_t)(int64_t)x << ls;
  v = v * (uint64_t)(int64_t)m + ((uint64_t)1 << (t - 1));
  return (int32_t)(uint32_t)((int64_t)v >> t);
}

/* FixedPointMultiplyToNearest (src/relay/qnn/utils.cc): half away from zero. */
static inline int32_t refcg_fpm_tonearest(int32_t x, int32_t m, int32_t s) {
  int32_t ls = s > 0 ? s : 0;
  int32_t t = 31 + (s > 0 ? 0 : -s);
  uint64_t v = ((uint64_t)(int64_t)x << ls) * (uint64_t)(int64_t)m;
  uint64_t round = ((uint64_t)1 << (t - 1)) - ((int64_t)v >= 0 ? 0 : 1);
  return (int32_t)(uint32_t)((int64_t)(v + round) >> t);
}

/* ARM sqrdmulh on one lane: (2ab + 2^31) >> 32, saturating (only MIN*MIN overflows). */
static inline int32_t refcg_sqrdmulh(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
  return (int32_t)((2 * (int64_t)a * b + ((int64_t)1 << 31)) >> 32);
}

/* tir.q_multiply_shift as TVM lowers it for int32x4 on llvm aarch64 targets
 * (topi/arm_cpu/tensor_intrin.py, _q_multiply_shift_arm): a right shift rounds
 * the sqrdmulh result again (srshl), a left shift wraps in int32 before it. */
static inline int32_t refcg_fpm_upward_neon(int32_t x, int32_t m, int32_t s) {
  if (s >= 0) return refcg_sqrdmulh(s < 32 ? (int32_t)((uint32_t)x << s) : 0, m);
  int64_t v = refcg_sqrdmulh(x, m);
  return s < -62 ? 0 : (int32_t)((v + ((int64_t)1 << (-s - 1))) >> -s);
}

/* float -> int32 as the hardware converts it: x86 cvttss2si gives INT32_MIN out of
 * range, aarch64 fcvtzs saturates and maps NaN to 0. The library runs where it was built. */
static inline int32_t refcg_f64_to_i32(double f) {
#if defined(__aarch64__)
  if (f != f) return 0;
  if (f >= 2147483648.0) return INT32_MAX;
  if (f < -2147483648.0) return INT32_MIN;
#else
  if (!(f >= -2147483648.0 && f < 2147483648.0)) return INT32_MIN;
#endif
  return (int32_t)f;
}

/* float converts to double exactly, so the same range checks apply. */
static inline int32_t refcg_f32_to_i32(float f) { return refcg_f64_to_i32(f); }

REFCG_API int32_t refcg_requantize_one(const refcg_requant* rq, int32_t acc, int32_t channel) {
  int32_t c = rq->per_channel ? channel : 0;
  int32_t v;
  switch (rq->mode) {
    case REFCG_RQ_INT64_UPWARD:
    case REFCG_RQ_INT64_TONEAREST:
    case REFCG_RQ_INT64_UPWARD_NEON: {
      int32_t x = refcg_wrap_sub32(acc, rq->input_zp);
      if (rq->identity)
        v = x;
      else if (rq->mode == REFCG_RQ_INT64_UPWARD)
        v = refcg_fpm_upward(x, rq->multiplier[c], rq->shift[c]);
      else if (rq->mode == REFCG_RQ_INT64_UPWARD_NEON)
        v = refcg_fpm_upward_neon(x, rq->multiplier[c], rq->shift[c]);
      else
        v = refcg_fpm_tonearest(x, rq->multiplier[c], rq->shift[c]);
      v = refcg_wrap_add32(v, rq->output_zp);
      break;
    }
    case REFCG_RQ_FLOAT32_UPWARD:
    case REFCG_RQ_FLOAT32_TONEAREST: {
      float f = (float)acc - (float)rq->input_zp;
      if (rq->identity)
        f = f + rq->addend_f32;
      else if (rq->fused)
        f = fmaf(f, rq->scale_f32[c], rq->addend_f32); /* correctly rounded on any host */
      else
        f = f * rq->scale_f32[c] + rq->addend_f32; /* two roundings: fp-contract is off */
      f = f + rq->post_f32;
      if (rq->mode == REFCG_RQ_FLOAT32_UPWARD)
        f = floorf(f);
      else if (rq->round_emulated)
        f = f + copysignf(0.5f, f); /* the conversion truncates */
      else
        f = roundf(f);
      v = refcg_f32_to_i32(f);
      break;
    }
    default: {
      double f = (double)acc - (double)rq->input_zp;
      if (rq->identity)
        f = f + rq->addend_f64;
      else if (rq->fused)
        f = fma(f, rq->scale_f64[c], rq->addend_f64);
      else
        f = f * rq->scale_f64[c] + rq->addend_f64;
      f = f + rq->post_f64;
      if (rq->mode == REFCG_RQ_FLOAT64_UPWARD)
        f = floor(f);
      else if (rq->round_emulated)
        f = f + copysign(0.5, f);
      else
        f = round(f);
      v = refcg_f64_to_i32(f);
      break;
    }
  }
  return refcg_clamp(v, rq->out_min, rq->out_max);
}
