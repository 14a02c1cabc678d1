/*
 * refcg int8 core: public types and entry points.
 *
 * The core is plain C (compiled as C or C++). Generated modules bundle it with
 * REFCG_API defined as `static` so several partitions can link into one .so;
 * the cffi test build leaves REFCG_API empty and calls the functions directly.
 */
#ifndef REFCG_H_
#define REFCG_H_

#include <stdint.h>
#include <stddef.h>

#ifndef REFCG_API
#define REFCG_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of quantized tensors (values of refcg_dtype). */
enum { REFCG_S8 = 0, REFCG_U8 = 1, REFCG_S32 = 2 };

/*
 * Requantize modes: TVM 0.19 lowers qnn.requantize differently by rounding and
 * compute dtype (src/relay/qnn/op/requantize.cc); refcg reproduces each one.
 */
enum {
  REFCG_RQ_INT64_UPWARD = 0,    /* fixed_point_multiply: (x*M + 2^(t-1)) >> t */
  REFCG_RQ_INT64_TONEAREST = 1, /* same, rounding half away from zero */
  REFCG_RQ_FLOAT32_UPWARD = 2,  /* floor(x*s + zp + 0.5) in float32 */
  REFCG_RQ_FLOAT32_TONEAREST = 3,
  REFCG_RQ_FLOAT64_UPWARD = 4,
  REFCG_RQ_FLOAT64_TONEAREST = 5
};

/* One requantize step: int32 accumulator -> output value (before the store). */
typedef struct {
  int32_t mode;         /* REFCG_RQ_* */
  int32_t per_channel;  /* 1: multiplier arrays are indexed by channel */
  int32_t identity;     /* 1: per-tensor scales equal, TVM skips the multiply */
  int32_t input_zp;
  int32_t output_zp;
  int32_t out_min;      /* clamp range: output dtype range intersected with clip */
  int32_t out_max;
  const int32_t* multiplier; /* Q31 significand (int64 modes) */
  const int32_t* shift;      /* exponent: >0 left shift, <0 right shift */
  const float* scale_f32;    /* float32 modes */
  const double* scale_f64;   /* float64 modes */
} refcg_requant;

/* 2-D convolution over one batch of a 4-D tensor addressed by element strides,
 * so NCHW and NHWC share one kernel. */
typedef struct {
  int32_t batch, in_h, in_w, in_c;
  int32_t out_h, out_w, out_c;
  int32_t kernel_h, kernel_w;
  int32_t stride_h, stride_w, dilation_h, dilation_w;
  int32_t pad_top, pad_left;
  int32_t groups;
  int32_t in_dtype, w_dtype, out_dtype; /* REFCG_S8 / REFCG_U8 / REFCG_S32 */
  int32_t input_zp, kernel_zp;
  /* element strides of input and output: batch, height, width, channel */
  int64_t in_stride[4];
  int64_t out_stride[4];
} refcg_conv2d_params;

/* Compile-time data of one conv: weights packed [out_c][kh][kw][in_c/groups],
 * int32 bias per output channel (NULL when absent), and the requantize step. */
typedef struct {
  const void* weight;
  const int32_t* bias;
  refcg_requant requant;
} refcg_conv2d_consts;

/* Returns 0 on success, a negative value on invalid parameters. */
REFCG_API int refcg_conv2d_ref(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                               const void* input, void* output);

REFCG_API int32_t refcg_requantize_one(const refcg_requant* rq, int32_t acc, int32_t channel);

#ifdef __cplusplus
}
#endif

#endif /* REFCG_H_ */
