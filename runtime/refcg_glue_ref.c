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

/* Whether every index the last axis reads lies inside the input (no padding there). */
static int refcg_copy_last_inside(const refcg_copy_params* p) {
  const int32_t last = p->ndim - 1;
  const int64_t n = p->out_shape[last], pad = p->pad_before[last], size = p->in_shape[last];
  if (!p->take[last]) return pad == 0 && n <= size;
  for (int64_t i = 0; i < n; ++i)
    if (p->take[last][i] - pad < 0 || p->take[last][i] - pad >= size) return 0;
  return 1;
}

/* One output row (the last axis) read from input element `at` on (`inside`: the other axes read inside
 * the input; `last_inside`: so does the last, refcg_copy_last_inside). A compact run stored unchanged is
 * one memcpy (reshape-like ops, slices, NHWC pixels); unchanged 8-bit values read through an index table
 * are a plain gather (a channel shuffle of NHWC pixels, a nearest resize along W); anything else
 * (padding, cast, clamp) goes element by element. */
static void refcg_copy_row(const refcg_copy_params* p, int64_t unchanged, const void* input, int64_t at, int inside,
                           int last_inside, void* output, int64_t out_at) {
  const int32_t last = p->ndim - 1;
  const int64_t n = p->out_shape[last], pad = p->pad_before[last], size = p->in_shape[last];
  const int64_t stride = p->in_stride[last];
  const int32_t* take = p->take[last];
  if (unchanged && inside && last_inside && !take && stride == 1) {
    memcpy((char*)output + out_at * unchanged, (const char*)input + at * unchanged, (size_t)(n * unchanged));
    return;
  }
  if (unchanged == 1 && inside && last_inside && take) {
    const uint8_t* in = (const uint8_t*)input + at - pad * stride;
    uint8_t* out = (uint8_t*)output + out_at;
    for (int64_t i = 0; i < n; ++i) out[i] = in[take[i] * stride];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = (take ? take[i] : i) - pad;
    const int read = inside && j >= 0 && j < size;
    if (read && unchanged == 1) {
      ((uint8_t*)output)[out_at + i] = ((const uint8_t*)input)[at + j * stride];
    } else {
      const int32_t v = read ? refcg_load(input, at + j * stride, p->in_dtype) : p->pad_value;
      refcg_store(output, out_at + i, p->out_dtype, refcg_clamp(v, p->lo, p->hi));
    }
  }
}

REFCG_API int refcg_copy_ref(const refcg_copy_params* p, const void* input, void* output) {
  if (p->ndim < 1 || p->ndim > REFCG_COPY_MAX_DIMS) return -1;
  const int32_t last = p->ndim - 1;
  const int64_t unchanged = refcg_copy_unchanged(p);
  const int last_inside = refcg_copy_last_inside(p);
  int64_t rows = 1;
  for (int32_t k = 0; k < last; ++k) rows *= p->out_shape[k];
  int64_t index[REFCG_COPY_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = p->offset;
    int inside = 1;
    for (int32_t k = 0; k < last; ++k) {
      const int64_t j = (p->take[k] ? p->take[k][index[k]] : index[k]) - p->pad_before[k];
      inside &= j >= 0 && j < p->in_shape[k];
      at += j * p->in_stride[k];
    }
    refcg_copy_row(p, unchanged, input, at, inside, last_inside, output, r * p->out_shape[last]);
    for (int32_t k = last - 1; k >= 0 && ++index[k] == p->out_shape[k]; --k) index[k] = 0;
  }
  return 0;
}

REFCG_API int refcg_fill_halo(const refcg_halo_params* p, void* buf) {
  const int64_t pixel = p->c, row = (int64_t)p->w * pixel;
  for (int64_t n = 0; n < p->batch; ++n) {
    uint8_t* image = (uint8_t*)buf + n * p->h * row;
    for (int32_t y = 0; y < p->h; ++y) {
      uint8_t* r = image + y * row;
      if (y < p->top || y >= p->h - p->bottom) {
        memset(r, p->value, (size_t)row);
        continue;
      }
      memset(r, p->value, (size_t)(p->left * pixel));
      memset(r + (p->w - p->right) * pixel, p->value, (size_t)(p->right * pixel));
    }
  }
  return 0;
}
