/*
 * Portable scalar references for elementwise QNN ops: qnn.add/subtract/mul with
 * broadcasting, and tensor requantize (qnn.requantize, qnn.concatenate inputs).
 * Each follows TVM 0.19's canonical form (src/relay/qnn/op/{add,subtract,mul}.cc):
 * int32 arithmetic written through unsigned types so it wraps like TVM's.
 */
#include "refcg_internal.h"

REFCG_API int refcg_binary_ref(const refcg_binary_params* p, const void* a, const void* b, void* out) {
  if (p->ndim < 1 || p->ndim > REFCG_MAX_DIMS) return -1;
  int64_t index[REFCG_MAX_DIMS] = {0};
  int64_t total = 1;
  for (int32_t d = 0; d < p->ndim; ++d) total *= p->shape[d];
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < total; ++i) {
    refcg_store(out, i, p->out_dtype,
                refcg_binary_one(p, refcg_load(a, ia, p->a_dtype), refcg_load(b, ib, p->b_dtype)));
    /* odometer over the output index; broadcast dimensions have stride 0 */
    for (int32_t d = p->ndim - 1; d >= 0; --d) {
      ia += p->a_stride[d];
      ib += p->b_stride[d];
      if (++index[d] < p->shape[d]) break;
      ia -= p->a_stride[d] * p->shape[d];
      ib -= p->b_stride[d] * p->shape[d];
      index[d] = 0;
    }
  }
  return 0;
}

REFCG_API int refcg_requantize_ref(const refcg_requantize_params* p, const void* input, void* output) {
  if (p->outer < 0 || p->channels < 0 || p->inner < 0) return -1;
  int64_t src = 0;
  for (int64_t o = 0; o < p->outer; ++o) {
    const int64_t dst = o * p->out_outer_stride + p->out_offset;
    for (int64_t c = 0; c < p->channels; ++c) {
      for (int64_t i = 0; i < p->inner; ++i, ++src) {
        const int32_t v = refcg_requantize_one(&p->rq, refcg_load(input, src, p->in_dtype), (int32_t)c);
        refcg_store(output, dst + c * p->inner + i, p->out_dtype, v);
      }
    }
  }
  return 0;
}

REFCG_API int refcg_quantize_ref(const refcg_quantize_params* p, const float* input, void* output) {
  if (p->outer < 0 || p->channels < 0 || p->inner < 0) return -1;
  int64_t i = 0;
  for (int64_t o = 0; o < p->outer; ++o) {
    for (int64_t c = 0; c < p->channels; ++c) {
      for (int64_t end = i + p->inner; i < end; ++i)
        refcg_store(output, i, p->quant_dtype,
                    refcg_quantize_one(input[i], p->scale[c], p->multiply, p->zero_point[c], p->quant_dtype));
    }
  }
  return 0;
}

REFCG_API int refcg_dequantize_ref(const refcg_quantize_params* p, const void* input, float* output) {
  if (p->outer < 0 || p->channels < 0 || p->inner < 0) return -1;
  int64_t i = 0;
  for (int64_t o = 0; o < p->outer; ++o) {
    for (int64_t c = 0; c < p->channels; ++c) {
      const float scale = p->scale[c];
      const uint32_t zp = (uint32_t)p->zero_point[c];
      const int64_t end = i + p->inner;
      /* the 8-bit dtypes as loops of their own: vectorized, not a load by dtype per value */
      if (p->quant_dtype == REFCG_U8) {
        for (const uint8_t* x = (const uint8_t*)input; i < end; ++i) output[i] = (float)(int32_t)(x[i] - zp) * scale;
      } else if (p->quant_dtype == REFCG_S8) {
        for (const int8_t* x = (const int8_t*)input; i < end; ++i)
          output[i] = (float)(int32_t)((uint32_t)x[i] - zp) * scale;
      } else {
        for (; i < end; ++i) output[i] = (float)(int32_t)((uint32_t)refcg_load(input, i, p->quant_dtype) - zp) * scale;
      }
    }
  }
  return 0;
}
