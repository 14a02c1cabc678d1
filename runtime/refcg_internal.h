/*
 * refcg core internals shared by the runtime's translation units (not part of the API).
 */
#ifndef REFCG_INTERNAL_H_
#define REFCG_INTERNAL_H_

#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include "refcg.h"

/* Symbols shared between the core's files, never exported from a library that holds it. */
#if defined(__GNUC__) || defined(__clang__)
#define REFCG_INTERNAL __attribute__((visibility("hidden")))
#else
#define REFCG_INTERNAL
#endif

/* Element access by refcg dtype, shared by every scalar reference kernel. */
static inline int32_t refcg_load(const void* base, int64_t i, int32_t dtype) {
  switch (dtype) {
    case REFCG_S8: return ((const int8_t*)base)[i];
    case REFCG_U8: return ((const uint8_t*)base)[i];
    case REFCG_S16: return ((const int16_t*)base)[i];
    default: return ((const int32_t*)base)[i];
  }
}

static inline void refcg_store(void* base, int64_t i, int32_t dtype, int32_t v) {
  switch (dtype) {
    case REFCG_S8: ((int8_t*)base)[i] = (int8_t)v; break;
    case REFCG_U8: ((uint8_t*)base)[i] = (uint8_t)v; break;
    case REFCG_S16: ((int16_t*)base)[i] = (int16_t)v; break; /* wraps, as TVM's int16 accumulators */
    default: ((int32_t*)base)[i] = v; break;
  }
}

static inline int refcg_is_8bit(int32_t dtype) { return dtype == REFCG_S8 || dtype == REFCG_U8; }

/* Bytes per element when a copy stores values unchanged (same dtype, a clamp that cannot bind), else 0. */
static inline int64_t refcg_copy_unchanged(const refcg_copy_params* p) {
  static const int32_t lo[] = {-128, 0, INT32_MIN, -32768}, hi[] = {127, 255, INT32_MAX, 32767};
  static const int64_t bytes[] = {1, 1, 4, 2};
  const int32_t t = p->in_dtype;
  if (t != p->out_dtype || t < 0 || t > 3) return 0;
  return p->lo <= lo[t] && p->hi >= hi[t] ? bytes[t] : 0;
}

static inline int32_t refcg_clamp(int32_t v, int32_t lo, int32_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

/* One element of qnn.add/subtract/mul in TVM 0.19's canonical form (src/relay/qnn/op/{add,subtract,mul}.cc):
 * int32 arithmetic written through unsigned types so it wraps like TVM's (the reference, and the rows of
 * variants without vector binary kernels). */
static inline int32_t refcg_binary_one(const refcg_binary_params* p, int32_t x, int32_t y) {
  if (p->op == REFCG_BIN_MUL) {
    const uint32_t prod = (uint32_t)(x - p->a_zp) * (uint32_t)(y - p->b_zp);
    return refcg_requantize_one(&p->rq_a, (int32_t)prod, 0);
  }
  const uint32_t qa = (uint32_t)refcg_requantize_one(&p->rq_a, x, 0);
  const uint32_t qb = (uint32_t)refcg_requantize_one(&p->rq_b, y, 0);
  /* add: Q_a' + Q_b' - zp_out; subtract: Q_a' - Q_b' + zp_out */
  const uint32_t v = p->op == REFCG_BIN_ADD ? qa + qb - (uint32_t)p->out_zp : qa - qb + (uint32_t)p->out_zp;
  return refcg_clamp((int32_t)v, p->out_min, p->out_max);
}

/* One qnn.quantize value as TVM 0.19 computes it: clip(round(x / scale) + zp) in float32, then the
 * cast. ``multiply``: ``scale`` holds float32(1.0 / scale) and x is multiplied by it, as TVM's TIR
 * simplifier rewrites x / c for an immediate c (refcg_quantize_params). roundf: half away from zero,
 * like llvm.round. */
static inline int32_t refcg_quantize_one(float x, float scale, int32_t multiply, int32_t zp, int32_t dtype) {
  const float lo = dtype == REFCG_U8 ? 0.0f : -128.0f, hi = dtype == REFCG_U8 ? 255.0f : 127.0f;
  float v = roundf(multiply ? x * scale : x / scale) + (float)zp;
  v = v < lo ? lo : (v > hi ? hi : v);
  return (int32_t)v;
}

typedef int (*refcg_binary_fn)(const refcg_binary_params* p, const void* a, const void* b, void* out);
/* The output rows of lut p (refcg.h): row_len elements each, stride apart; 0 where p is invalid. */
static inline int refcg_lut_rows(const refcg_lut_params* p, int64_t* row_len, int64_t* stride) {
  if (p->size < 0 || p->row_len < 0 || p->out_row_stride < 0) return 0;
  if (p->out_row_stride == 0) { /* contiguous: one row */
    *row_len = *stride = p->size > 0 ? p->size : 1;
    return 1;
  }
  *row_len = p->row_len;
  *stride = p->out_row_stride;
  return p->row_len > 0 && p->size % p->row_len == 0 && p->out_row_stride >= p->row_len;
}

typedef int (*refcg_lut_fn)(const refcg_lut_params* p, const uint8_t* table, const void* input, void* output);

/* refcg_lut_binary(_ref): the binary op on every byte value and its table entry, through ``binary``
 * (the same kernel the unfused op runs), then one pass of ``lut`` over the tensor. */
static inline int refcg_lut_binary_with(const refcg_lut_binary_params* p, const uint8_t* table, const void* input,
                                        void* output, refcg_binary_fn binary, refcg_lut_fn lut) {
  const refcg_binary_params* b = p->binary;
  const int bytes_only = refcg_is_8bit(b->a_dtype) && refcg_is_8bit(b->b_dtype) && refcg_is_8bit(b->out_dtype);
  if (!bytes_only || b->ndim != 1 || b->shape[0] != 256 || b->a_stride[0] != 1 || b->b_stride[0] != 1) return -1;
  uint8_t values[256], composed[256];
  for (int i = 0; i < 256; ++i) values[i] = (uint8_t)i;
  const int status = p->table_first ? binary(b, table, values, composed) : binary(b, values, table, composed);
  return status ? status : lut(&p->lut, composed, input, output);
}

#endif /* REFCG_INTERNAL_H_ */
