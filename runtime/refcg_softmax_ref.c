/*
 * qnn.softmax as TVM 0.19 canonicalizes it (src/relay/qnn/op/softmax.cc, integer-only
 * Algorithm 1 of arXiv 2207.01405): per element d = (x - zp) - max, an exp approximation
 * x_b << (max_q - q) with q = clip(x_p / -x0, 0, 20), then (2^30 / sum) * e >> 23 and a
 * requantize from scale 1/128. Shifts and sums are done in uint32 where C would be undefined
 * on negative values; the planner's bound check (refcodegen/softmax.py) rules out overflow.
 */
#include <math.h>
#include "refcg_internal.h"

/* q and x_b of one element, d = (x - zp) - max <= 0 */
static inline void refcg_softmax_exp_parts(int32_t d, int32_t x0, int32_t* q, int32_t* xb) {
  const int32_t xp = d + (d >> 1) - (d >> 4);
  const int32_t qq = refcg_clamp(xp / -x0, 0, 20); /* C division truncates, like TVM's int divide */
  *q = qq;
  *xb = ((xp - qq * -x0) >> 1) + x0;
}

static inline int32_t refcg_softmax_load(const refcg_softmax_params* p, const int8_t* row, int64_t k) {
  return (int32_t)row[k * p->inner] - p->input_zp;
}

REFCG_API int refcg_softmax_ref(const refcg_softmax_params* p, const void* input, void* output) {
  if (p->outer < 0 || p->axis < 1 || p->inner < 0 || p->x0 < 1) return -1;
  const int8_t* in = (const int8_t*)input;
  int8_t* out = (int8_t*)output;
  for (int64_t o = 0; o < p->outer; ++o) {
    for (int64_t i = 0; i < p->inner; ++i) {
      const int64_t base = o * p->axis * p->inner + i;
      const int8_t* row = in + base;
      int32_t max = refcg_softmax_load(p, row, 0);
      for (int64_t k = 1; k < p->axis; ++k) {
        const int32_t v = refcg_softmax_load(p, row, k);
        max = v > max ? v : max;
      }
      int32_t q, xb, max_q = 0;
      for (int64_t k = 0; k < p->axis; ++k) {
        refcg_softmax_exp_parts(refcg_softmax_load(p, row, k) - max, p->x0, &q, &xb);
        max_q = q > max_q ? q : max_q;
      }
      uint32_t sum = 0;
      for (int64_t k = 0; k < p->axis; ++k) {
        refcg_softmax_exp_parts(refcg_softmax_load(p, row, k) - max, p->x0, &q, &xb);
        sum += (uint32_t)xb << (max_q - q);
      }
      if ((int32_t)sum <= 0) return -1; /* excluded by the bound check: TVM would divide by it */
      const int32_t scale = (int32_t)(1 << 30) / (int32_t)sum;
      for (int64_t k = 0; k < p->axis; ++k) {
        refcg_softmax_exp_parts(refcg_softmax_load(p, row, k) - max, p->x0, &q, &xb);
        const int32_t e = (int32_t)((uint32_t)xb << (max_q - q));
        const int32_t v = (int32_t)((uint32_t)scale * (uint32_t)e) >> 23;
        out[base + k * p->inner] = (int8_t)refcg_requantize_one(&p->rq, v, 0);
      }
    }
  }
  return 0;
}

/* x dequantized, as refcg_dequantize_ref */
static inline float refcg_float_softmax_load(const refcg_float_softmax_params* p, const void* row, int64_t k) {
  return (float)(int32_t)((uint32_t)refcg_load(row, k, p->in_dtype) - (uint32_t)p->input_zp) * p->input_scale;
}

/* qnn.dequantize -> nn.softmax (last axis) -> qnn.quantize as TVM 0.19 computes it on x86:
 * max, then exps summed in order (no reassociation), each exp divided by the sum, then the
 * quantize of refcg_quantize_ref. expf is libm's, the one TVM's llvm.exp calls; it is evaluated
 * twice per element instead of keeping a float row in scratch. */
REFCG_API int refcg_float_softmax_ref(const refcg_float_softmax_params* p, const void* input, void* output) {
  if (p->rows < 0 || p->axis < 1) return -1;
  for (int64_t r = 0; r < p->rows; ++r) {
    const void* row = (const uint8_t*)input + r * p->axis; /* 8-bit elements */
    float max = refcg_float_softmax_load(p, row, 0);
    for (int64_t k = 1; k < p->axis; ++k) {
      const float v = refcg_float_softmax_load(p, row, k);
      max = v > max ? v : max;
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < p->axis; ++k) sum += expf(refcg_float_softmax_load(p, row, k) - max);
    for (int64_t k = 0; k < p->axis; ++k) {
      const float y = expf(refcg_float_softmax_load(p, row, k) - max) / sum;
      refcg_store(output, r * p->axis + k, p->out_dtype,
                  refcg_quantize_one(y, p->output_scale, p->output_multiply, p->output_zp, p->out_dtype));
    }
  }
  return 0;
}
