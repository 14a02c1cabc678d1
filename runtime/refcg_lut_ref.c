/*
 * Table-driven unary ops: qnn.sigmoid/tanh/hardswish/leaky_relu and dequantize -> op -> quantize.
 * The 256-entry table is computed at codegen time by TVM itself (refcodegen/lut.py), indexed
 * by the input's bit pattern, so int8 and uint8 inputs and outputs share one kernel.
 */
#include "refcg_internal.h"

REFCG_API int refcg_lut_ref(const refcg_lut_params* p, const uint8_t* table, const void* input, void* output) {
  int64_t row_len, stride;
  if (!refcg_lut_rows(p, &row_len, &stride)) return -1;
  const uint8_t* in = (const uint8_t*)input;
  uint8_t* out = (uint8_t*)output;
  for (int64_t i = 0; i < p->size; ++i) out[i / row_len * stride + i % row_len] = table[in[i]] ^ p->out_xor;
  return 0;
}

REFCG_API int refcg_lut_binary_ref(const refcg_lut_binary_params* p, const uint8_t* table, const void* input,
                                   void* output) {
  return refcg_lut_binary_with(p, table, input, output, refcg_binary_ref, refcg_lut_ref);
}
