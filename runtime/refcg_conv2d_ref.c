/*
 * Portable scalar reference for quantized conv2d (+bias, +requantize, +clip).
 * Every optimized variant is tested against this kernel. Padding taps are
 * skipped: qnn.conv2d pads with the input zero point, which contributes 0.
 */
#include "refcg_internal.h"

REFCG_API int refcg_conv2d_ref(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                               const void* input, void* output) {
  if (!k->weight || p->groups <= 0 || p->in_c % p->groups || p->out_c % p->groups) return -1;
  const int32_t cin_g = p->in_c / p->groups, cout_g = p->out_c / p->groups;
  for (int32_t n = 0; n < p->batch; ++n) {
    for (int32_t oc = 0; oc < p->out_c; ++oc) {
      const int32_t g = oc / cout_g;
      const int64_t wbase = (int64_t)oc * p->kernel_h * p->kernel_w * cin_g;
      for (int32_t oh = 0; oh < p->out_h; ++oh) {
        for (int32_t ow = 0; ow < p->out_w; ++ow) {
          /* int32 accumulation wraps exactly like TVM's int32 conv */
          uint32_t acc = 0;
          for (int32_t kh = 0; kh < p->kernel_h; ++kh) {
            const int32_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
            if (ih < 0 || ih >= p->in_h) continue;
            for (int32_t kw = 0; kw < p->kernel_w; ++kw) {
              const int32_t iw = ow * p->stride_w - p->pad_left + kw * p->dilation_w;
              if (iw < 0 || iw >= p->in_w) continue;
              const int64_t xbase = n * p->in_stride[0] + ih * p->in_stride[1] + iw * p->in_stride[2];
              const int64_t wtap = wbase + ((int64_t)kh * p->kernel_w + kw) * cin_g;
              for (int32_t ic = 0; ic < cin_g; ++ic) {
                const int32_t x = refcg_load(input, xbase + (int64_t)(g * cin_g + ic) * p->in_stride[3], p->in_dtype);
                const int32_t w = refcg_load(k->weight, wtap + ic, p->w_dtype);
                acc += (uint32_t)((x - p->input_zp) * (w - p->kernel_zp));
              }
            }
          }
          if (k->bias) acc += (uint32_t)k->bias[oc];
          const int32_t v = refcg_requantize_one(&k->requant, (int32_t)acc, oc);
          refcg_store(output, n * p->out_stride[0] + oh * p->out_stride[1] + ow * p->out_stride[2] + oc * p->out_stride[3],
                      p->out_dtype, v);
        }
      }
    }
  }
  return 0;
}
