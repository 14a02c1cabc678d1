/*
 * refcg accelerated int8 core: packed weights, dispatching entry points, ISA table.
 *
 * Every accelerated kernel computes sum((x - izp) * w') exactly in wrapping int32, like
 * refcg_conv2d_ref. The input is copied once into a "domain" the ISA multiplies natively
 * (uint8 on x86: vpdpbusd/vpmaddwd; int8 on aarch64: sdot/smull), i.e. x + s with
 * s in {-128, 0, 128}, padded with izp + s; the packer (refcodegen/packing.py) emits
 * per channel corr = bias - (s + izp) * sum(w') for both domains, so
 *   acc = sum((x + s) * w') + corr = sum((x - izp) * w') + bias   (mod 2^32).
 * w' = w - kernel_zp must fit int8; otherwise the packer emits no fast data and the
 * dispatcher runs the scalar reference.
 */
#ifndef REFCG_FAST_H_
#define REFCG_FAST_H_

#include "refcg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Weights of a GEMM-shaped kernel (conv with groups == 1, dense): out channels padded to
 * np (multiple of 16), reduction padded to kp (multiple of 4), bytes laid out
 * [np/16][kp/4][16][4] so one 64-byte row feeds 16 channels x 4 reduction steps. */
typedef struct {
  int32_t kp, np;
  const int8_t* w;
  const int32_t* corr_u8; /* np entries: correction for a uint8-domain input (x86) */
  const int32_t* corr_s8; /* np entries: correction for an int8-domain input (aarch64) */
} refcg_gemm_weights;

/* Extra compile-time data of one conv for the accelerated kernels. */
enum { REFCG_FAST_NONE = 0, REFCG_FAST_GEMM = 1, REFCG_FAST_DEPTHWISE = 2 };
typedef struct {
  int32_t kind;          /* REFCG_FAST_* */
  int32_t cp;            /* channels per pixel in the padded input copy (GEMM: in_c rounded to 4) */
  refcg_gemm_weights gemm;
  const int16_t* dw_w;   /* depthwise: [kh*kw][cp] w' as int16 */
  const int32_t* dw_corr_u8;
  const int32_t* dw_corr_s8;
} refcg_conv2d_fast;

/* Conv through the best kernel for this CPU; the reference when f is NULL, f->kind is
 * NONE, or REFCG_ISA=scalar with the reference weights present (without them the scalar
 * variant runs the packed GEMM). Same contract as refcg_conv2d_ref. */
REFCG_API int refcg_conv2d(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                           const refcg_conv2d_fast* f, const void* input, void* output);

/* Dense / GEMM (refcg_dense_params of refcg.h): out[b][u] = requant(sum_k (x[b][k] - input_zp)
 * * w'[u][k] + bias[u]) with weights packed by refcodegen.packing.pack_gemm_weights, which
 * folds kernel_zp into w' and the bias into the corrections (p->kernel_zp and w_dtype are
 * not read). Per-tensor or per-channel requantize, channel = unit. */
REFCG_API int refcg_dense(const refcg_dense_params* p, const refcg_gemm_weights* g,
                          const refcg_requant* rq, const void* input, void* output);

/* qnn.add / subtract / mul (refcg_binary_params of refcg.h) through the best variant: 8-bit
 * operands, vector requantize modes, innermost strides 0 or 1; otherwise refcg_binary_ref. */
REFCG_API int refcg_binary(const refcg_binary_params* p, const void* a, const void* b, void* out);

/* nn.max_pool2d / avg pools (refcg_pool2d_params of refcg.h) through the best variant on planar
 * (NCHW) 8-bit inputs; otherwise refcg_pool2d_ref. */
REFCG_API int refcg_pool2d(const refcg_pool2d_params* p, const void* input, void* output);

/* Name of the variant the dispatcher uses ("avx512vnni", "avxvnni", "avx2", "dotprod",
 * "neon", "scalar"): the best the CPU supports, or REFCG_ISA when set and supported. */
REFCG_API const char* refcg_isa_name(void);

/* 1 if the named variant is compiled in for this architecture and the CPU runs it. */
REFCG_API int refcg_isa_supported(const char* name);

#ifdef __cplusplus
}
#endif

#endif /* REFCG_FAST_H_ */
