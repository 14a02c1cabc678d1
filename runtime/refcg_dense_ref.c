/*
 * Portable scalar reference for qnn.dense (+bias, +requantize, +clip). TVM's
 * canonical form (dense minus zero-point row/column sums) is exact int32
 * arithmetic, so accumulating the zero-point-corrected products wraps the same way.
 */
#include "refcg_internal.h"

REFCG_API int refcg_dense_ref(const refcg_dense_params* p, const refcg_conv2d_consts* k,
                              const void* input, void* output) {
  if (!k->weight || p->batch <= 0 || p->in_features <= 0 || p->units <= 0) return -1;
  for (int32_t b = 0; b < p->batch; ++b) {
    const int64_t xrow = (int64_t)b * p->in_features;
    for (int32_t u = 0; u < p->units; ++u) {
      const int64_t wrow = (int64_t)u * p->in_features;
      uint32_t acc = 0;
      for (int32_t i = 0; i < p->in_features; ++i) {
        const int32_t x = refcg_load(input, xrow + i, p->in_dtype) - p->input_zp;
        const int32_t w = refcg_load(k->weight, wrow + i, p->w_dtype) - p->kernel_zp;
        acc += (uint32_t)x * (uint32_t)w;
      }
      if (k->bias) acc += (uint32_t)k->bias[u];
      refcg_store(output, (int64_t)b * p->units + u, p->out_dtype, refcg_requantize_one(&k->requant, (int32_t)acc, u));
    }
  }
  return 0;
}
