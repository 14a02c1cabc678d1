/*
 * Portable scalar kernels for the glue between quantized layers: int32 reductions (mean, sum,
 * adaptive/global average pooling in the cast-int32 form) and data movement with an optional
 * clamp or cast (reshape-like ops, transpose, layout_transform, strided_slice, nn.pad, clip, maximum,
 * minimum, and nearest resize as a gather through index tables the compiler computed). They move or
 * sum integers: nothing to round, so TVM's results are reproduced exactly.
 */
#include <string.h>

#include "refcg_internal.h"

REFCG_API int refcg_reduce_ref(const refcg_reduce_params* p, const void* input, void* output) {
  if (p->reduce <= 0) return -1;
  for (int64_t o = 0; o < p->outer; ++o) {
    for (int64_t i = 0; i < p->inner; ++i) {
      uint32_t sum = 0; /* wraps like TVM's int32 sum (the check rejects reductions that could) */
      const int64_t base = o * p->reduce * p->inner + i;
      for (int64_t r = 0; r < p->reduce; ++r) sum += (uint32_t)refcg_load(input, base + r * p->inner, p->in_dtype);
      int32_t v = (int32_t)sum;
      if (p->is_mean) v /= (int32_t)p->reduce;
      refcg_store(output, o * p->inner + i, p->out_dtype, v);
    }
  }
  return 0;
}

/* Bytes per element when the copy is a plain memcpy (one compact run read inside the input: no padding
 * before or after it; same dtype, no clamp), else 0. */
static int64_t refcg_copy_plain(const refcg_copy_params* p) {
  static const int32_t lo[] = {-128, 0, INT32_MIN, -32768}, hi[] = {127, 255, INT32_MAX, 32767};
  static const int64_t bytes[] = {1, 1, 4, 2};
  const int32_t t = p->in_dtype;
  if (p->ndim != 1 || p->in_stride[0] != 1 || p->pad_before[0] != 0 || p->take[0]) return 0;
  if (p->out_shape[0] > p->in_shape[0] || t != p->out_dtype || t < 0 || t > 3) return 0;
  return p->lo <= lo[t] && p->hi >= hi[t] ? bytes[t] : 0;
}

REFCG_API int refcg_copy_ref(const refcg_copy_params* p, const void* input, void* output) {
  if (p->ndim < 1 || p->ndim > REFCG_COPY_MAX_DIMS) return -1;
  int64_t total = 1;
  for (int32_t k = 0; k < p->ndim; ++k) total *= p->out_shape[k];
  const int64_t plain = refcg_copy_plain(p);
  if (plain) { /* reshape-like ops */
    memcpy(output, (const char*)input + p->offset * plain, (size_t)(total * plain));
    return 0;
  }
  int64_t index[REFCG_COPY_MAX_DIMS] = {0};
  for (int64_t i = 0; i < total; ++i) {
    int64_t at = p->offset;
    int inside = 1;
    for (int32_t k = 0; k < p->ndim; ++k) {
      const int64_t j = (p->take[k] ? p->take[k][index[k]] : index[k]) - p->pad_before[k];
      inside &= j >= 0 && j < p->in_shape[k];
      at += j * p->in_stride[k];
    }
    const int32_t v = inside ? refcg_load(input, at, p->in_dtype) : p->pad_value;
    refcg_store(output, i, p->out_dtype, refcg_clamp(v, p->lo, p->hi));
    for (int32_t k = p->ndim - 1; k >= 0 && ++index[k] == p->out_shape[k]; --k) index[k] = 0;
  }
  return 0;
}
