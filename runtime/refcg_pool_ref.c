/*
 * Portable scalar reference for 2-D pooling on quantized tensors, following topi's
 * pool_impl_nd: max pooling pads with the dtype minimum (padded taps never win);
 * average pooling sums in int32 and divides with C truncating division by the
 * number of taps inside the input (count_include_pad=0) or inside the explicitly
 * padded input (count_include_pad=1; the extra ceil_mode rows are never counted).
 */
#include "refcg_internal.h"

REFCG_API int refcg_pool2d_ref(const refcg_pool2d_params* p, const void* input, void* output) {
  if (p->stride_h <= 0 || p->stride_w <= 0 || p->dilation_h <= 0 || p->dilation_w <= 0) return -1;
  for (int32_t n = 0; n < p->batch; ++n) {
    for (int32_t c = 0; c < p->channels; ++c) {
      for (int32_t oh = 0; oh < p->out_h; ++oh) {
        for (int32_t ow = 0; ow < p->out_w; ++ow) {
          uint32_t sum = 0;
          int32_t best = p->in_dtype == REFCG_U8 ? 0 : (p->in_dtype == REFCG_S8 ? -128 : INT32_MIN);
          int32_t valid = 0, padded = 0;
          for (int32_t kh = 0; kh < p->kernel_h; ++kh) {
            const int32_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
            const int in_pad_h = ih < p->in_h + p->pad_bottom;
            for (int32_t kw = 0; kw < p->kernel_w; ++kw) {
              const int32_t iw = ow * p->stride_w - p->pad_left + kw * p->dilation_w;
              padded += in_pad_h && iw < p->in_w + p->pad_right;
              if (ih < 0 || ih >= p->in_h || iw < 0 || iw >= p->in_w) continue;
              const int32_t x = refcg_load(input, n * p->in_stride[0] + ih * p->in_stride[1] +
                                                      iw * p->in_stride[2] + c * p->in_stride[3], p->in_dtype);
              sum += (uint32_t)x;
              best = x > best ? x : best;
              ++valid;
            }
          }
          int32_t v = best;
          if (p->is_avg) {
            int32_t count = p->count_include_pad ? padded : valid;
            v = (int32_t)sum / (count > 0 ? count : 1);
          }
          refcg_store(output, n * p->out_stride[0] + oh * p->out_stride[1] + ow * p->out_stride[2] + c * p->out_stride[3],
                      p->out_dtype, v);
        }
      }
    }
  }
  return 0;
}
