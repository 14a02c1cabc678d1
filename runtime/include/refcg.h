/*
 * refcg int8 core: every public type, constant and entry point, declared once.
 *
 * The core is plain C (compiled as C or C++); each runtime/ source file compiles alone
 * (runtime/Makefile builds librefcg_core.a). A generated library holds the core once, as one
 * C file bundled from the same sources with REFCG_API = hidden visibility, and each partition's
 * C starts with this header; the cffi test harness leaves REFCG_API empty and reads its
 * declarations from this file (tests/core_cffi.py).
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
enum { REFCG_S8 = 0, REFCG_U8 = 1, REFCG_S32 = 2, REFCG_S16 = 3 };

/*
 * Requantize modes: TVM 0.19 lowers qnn.requantize differently by rounding and
 * compute dtype (src/relay/qnn/op/requantize.cc); refcg reproduces each one.
 */
enum {
  REFCG_RQ_INT64_UPWARD = 0,    /* fixed_point_multiply: (x*M + 2^(t-1)) >> t */
  REFCG_RQ_INT64_TONEAREST = 1, /* same, rounding half away from zero */
  REFCG_RQ_FLOAT32_UPWARD = 2,  /* floor(x*s + addend + post) in float32 (see refcg_requant) */
  REFCG_RQ_FLOAT32_TONEAREST = 3,
  REFCG_RQ_FLOAT64_UPWARD = 4,
  REFCG_RQ_FLOAT64_TONEAREST = 5,
  REFCG_RQ_INT64_UPWARD_NEON = 6 /* aarch64 int32x4 lowering: sqrdmulh, then srshl (rounds twice) */
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
  /* Float modes, as TVM-only's code for the build target evaluates them (numerics.float_form):
   * f = x*s + addend, rounded once (fused: an FMA target) or twice; f += post; then
   * floor (UPWARD), round half away (TONEAREST) or trunc(f + copysign(0.5, f)) (round_emulated). */
  int32_t fused;
  int32_t round_emulated;
  float addend_f32, post_f32;
  double addend_f64, post_f64;
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

/* Compile-time data of one conv: weights packed [out_c][kh][kw][in_c/groups] (NULL when only
 * the accelerated GEMM data exists: refcg_conv2d then runs it on every variant, and the
 * reference returns -1), int32 bias per output channel (NULL when absent), and the requantize step. */
typedef struct {
  const void* weight;
  const int32_t* bias;
  refcg_requant requant;
} refcg_conv2d_consts;

/* Returns 0 on success, a negative value on invalid parameters. */
REFCG_API int refcg_conv2d_ref(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                               const void* input, void* output);

REFCG_API int32_t refcg_requantize_one(const refcg_requant* rq, int32_t acc, int32_t channel);

/* ---- scalar reference kernels for the other QNN op families ---- */

/* qnn.dense (+bias) (+requantize): out[b][u] = sum_k (x[b][k]-xzp)*(w[u][k]-wzp) + bias[u].
 * Weights [units][in_features]; the requantize channel is the unit. */
typedef struct {
  int32_t batch, in_features, units;
  int32_t in_dtype, w_dtype, out_dtype;
  int32_t input_zp, kernel_zp;
} refcg_dense_params;

REFCG_API int refcg_dense_ref(const refcg_dense_params* p, const refcg_conv2d_consts* k,
                              const void* input, void* output);

#define REFCG_MAX_DIMS 6
enum { REFCG_BIN_ADD = 0, REFCG_BIN_SUB = 1, REFCG_BIN_MUL = 2 };

/* qnn.add / qnn.subtract / qnn.mul with numpy broadcasting. add/subtract requantize each
 * input to the output qparams in int32 (rq_a, rq_b), combine, then clamp; mul requantizes
 * the zero-point-corrected int32 product (rq_a, which also clamps). */
typedef struct {
  int32_t op, ndim;
  int64_t shape[REFCG_MAX_DIMS];    /* output shape */
  int64_t a_stride[REFCG_MAX_DIMS]; /* element strides, 0 along broadcast dimensions */
  int64_t b_stride[REFCG_MAX_DIMS];
  int32_t a_dtype, b_dtype, out_dtype;
  int32_t a_zp, b_zp;               /* mul only */
  int32_t out_zp, out_min, out_max; /* add/subtract only */
  refcg_requant rq_a, rq_b;
} refcg_binary_params;

REFCG_API int refcg_binary_ref(const refcg_binary_params* p, const void* a, const void* b, void* out);

/* Elementwise requantize of a tensor viewed as [outer][channels][inner], written into
 * out[o * out_outer_stride + out_offset + c * inner + i]: plain qnn.requantize, and one
 * input of qnn.concatenate along the channels axis. */
typedef struct {
  int64_t outer, channels, inner;
  int64_t out_outer_stride, out_offset;
  int32_t in_dtype, out_dtype;
  refcg_requant rq;
} refcg_requantize_params;

REFCG_API int refcg_requantize_ref(const refcg_requantize_params* p, const void* input, void* output);
/* The same through the CPU's vector variant: 8-bit input and output, per tensor, buffers apart (else the
 * reference, which also takes a requantize in place). */
REFCG_API int refcg_requantize(const refcg_requantize_params* p, const void* input, void* output);

/* qnn.quantize (float32 -> int8/uint8: clip(round(x / scale) + zp) in float32, then cast) and
 * qnn.dequantize ((x - zp) * scale in float32), as TVM 0.19 canonicalizes them, on a tensor
 * viewed as [outer][channels][inner] around the quantization axis (per tensor: one channel).
 * multiply (quantize): TVM inlines a rank-0 scale as an immediate c and its TIR simplifier
 * rewrites x / c into x * float32(1.0 / c); scale then holds that reciprocal. */
typedef struct {
  int64_t outer, channels, inner;
  int32_t quant_dtype;       /* the integer side: output of quantize, input of dequantize */
  int32_t multiply;          /* quantize: 1 multiplies by scale (a reciprocal), 0 divides by it */
  const float* scale;        /* [channels] */
  const int32_t* zero_point; /* [channels] */
} refcg_quantize_params;

REFCG_API int refcg_quantize_ref(const refcg_quantize_params* p, const float* input, void* output);
/* The same, vectorized where the variant has it (refcg_fast.c). */
REFCG_API int refcg_quantize(const refcg_quantize_params* p, const float* input, void* output);
REFCG_API int refcg_dequantize_ref(const refcg_quantize_params* p, const void* input, float* output);

/* nn.max_pool2d on int8/uint8, and nn.avg_pool2d / nn.global_avg_pool2d computed in int32
 * (the cast-int32 form frontends emit): sum / count with C (truncating) division like topi. */
typedef struct {
  int32_t batch, in_h, in_w, channels, out_h, out_w;
  int32_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w;
  int32_t pad_top, pad_left, pad_bottom, pad_right;
  int32_t is_avg, count_include_pad;
  int32_t in_dtype, out_dtype;
  int64_t in_stride[4]; /* batch, height, width, channel */
  int64_t out_stride[4];
} refcg_pool2d_params;

REFCG_API int refcg_pool2d_ref(const refcg_pool2d_params* p, const void* input, void* output);

/* Sum or mean over the middle axis of a tensor viewed as [outer][reduce][inner], computed in int32 as
 * TVM computes mean / sum / adaptive and global average pooling after a cast to int32: a wrapping
 * int32 sum, then (mean) C truncating division by the count, like topi's div. */
typedef struct {
  int64_t outer, reduce, inner;
  int32_t is_mean;
  int32_t in_dtype, out_dtype; /* the output cast (if any) wraps like TVM's */
} refcg_reduce_params;

REFCG_API int refcg_reduce_ref(const refcg_reduce_params* p, const void* input, void* output);
/* The same, vectorized over the inner axis and split over threads (any dtype; refcg_reduce_ref's results). */
REFCG_API int refcg_reduce(const refcg_reduce_params* p, const void* input, void* output);

/* Data movement and clamping on one tensor (reshape, transpose, strided_slice, nn.pad, clip, nearest
 * resize...): out[i] = clamp(in[offset + sum_k (t_k(i_k) - pad_before_k) * in_stride_k]), or pad_value
 * where some t_k(i_k) - pad_before_k falls outside [0, in_shape_k); t_k is take[k][i_k], or i_k where
 * take[k] is NULL (a gather along that axis). Up to 6 dimensions; a cast stores another dtype
 * (narrowing wraps, as TVM's cast). */
#define REFCG_COPY_MAX_DIMS 6
typedef struct {
  int32_t ndim;
  int64_t out_shape[REFCG_COPY_MAX_DIMS];
  int64_t in_stride[REFCG_COPY_MAX_DIMS];
  int64_t pad_before[REFCG_COPY_MAX_DIMS];
  int64_t in_shape[REFCG_COPY_MAX_DIMS];
  int64_t offset;
  int32_t in_dtype, out_dtype;
  int32_t pad_value, lo, hi;
  const int32_t* take[REFCG_COPY_MAX_DIMS]; /* per axis: the input index of each output index, or NULL */
} refcg_copy_params;

REFCG_API int refcg_copy_ref(const refcg_copy_params* p, const void* input, void* output);
/* refcg_copy_ref's result; unchanged 8-bit values read through an index table on the last axis and
 * plain strides on the others (a channel shuffle of NHWC pixels) are gathered with the variant's byte
 * permutes, rows split over the threads. */
REFCG_API int refcg_copy(const refcg_copy_params* p, const void* input, void* output);

/* The halo of a channels-last 8-bit tensor (batch x h x w x c, h and w with the halo) that its producer
 * writes inside and a depthwise conv reads in place (refcodegen/plan.py): rows [0, top) and
 * [h - bottom, h) whole and the left / right pixels of the others set to value (the conv's input zero
 * point), each run before that conv, since the workspace slot may have held another tensor since. */
typedef struct {
  int32_t batch, h, w, c, top, left, bottom, right;
  int32_t value;
} refcg_halo_params;

REFCG_API int refcg_fill_halo(const refcg_halo_params* p, void* buf);

/* Table-driven unary ops on 8-bit tensors: out[i] = table[bit pattern of in[i]] ^ out_xor
 * (refcodegen/lut.py; out_xor 0x80: an int8 result stored flipped, in the x86 variants' uint8 domain).
 * The input is contiguous; the output too, or (out_row_stride > 0) in rows of row_len elements
 * out_row_stride apart (a tensor inside a halo: size a multiple of row_len, out_row_stride >= row_len). */
typedef struct {
  int64_t size;
  int64_t row_len, out_row_stride;
  uint8_t out_xor;
} refcg_lut_params;

REFCG_API int refcg_lut_ref(const refcg_lut_params* p, const uint8_t* table, const void* input, void* output);

/* qnn.add / subtract / mul of an 8-bit tensor x and a table op of x (swish: x * sigmoid(x)): a function
 * of each byte of x too. binary is that op on the 256 byte values (ndim 1, shape {256}, strides {1});
 * each call computes it into a second table, then out[i] = table2[bit pattern of in[i]]: one pass over
 * the tensor, and bit-exact with the lookup followed by the binary kernel by construction. */
typedef struct {
  refcg_lut_params lut;
  const refcg_binary_params* binary;
  int32_t table_first; /* the table op's result is the binary op's lhs */
} refcg_lut_binary_params;

REFCG_API int refcg_lut_binary_ref(const refcg_lut_binary_params* p, const uint8_t* table, const void* input,
                                   void* output);
/* The same through the CPU's vector variant (x86 with AVX512-VBMI: 64 bytes per step). */
REFCG_API int refcg_lut(const refcg_lut_params* p, const uint8_t* table, const void* input, void* output);
REFCG_API int refcg_lut_binary(const refcg_lut_binary_params* p, const uint8_t* table, const void* input,
                               void* output);

/* qnn.softmax (int8 in and out) over the middle axis of a tensor viewed as [outer][axis][inner];
 * x0 = round(1 / input_scale) as TVM computes it, rq requantizes from scale 1/128. */
typedef struct {
  int64_t outer, axis, inner;
  int32_t input_zp, x0;
  refcg_requant rq;
} refcg_softmax_params;

REFCG_API int refcg_softmax_ref(const refcg_softmax_params* p, const void* input, void* output);

/* qnn.dequantize -> nn.softmax over the last axis -> qnn.quantize, 8-bit in and out, in float32. */
typedef struct {
  int64_t rows, axis;
  int32_t in_dtype, out_dtype;
  int32_t input_zp, output_zp;
  float input_scale, output_scale;
  int32_t output_multiply; /* output_scale is a reciprocal to multiply by, as refcg_quantize_params */
} refcg_float_softmax_params;

REFCG_API int refcg_float_softmax_ref(const refcg_float_softmax_params* p, const void* input, void* output);

/* ---- accelerated kernels (refcg_fast*.c) ----
 *
 * Every accelerated kernel computes sum((x - izp) * w') exactly in wrapping int32, like
 * refcg_conv2d_ref. The input is copied once into a "domain" the ISA multiplies natively
 * (uint8 on x86: vpdpbusd/vpmaddubsw/vpmaddwd; int8 on aarch64: sdot/smull), i.e. x + s with
 * s in {-128, 0, 128}, padded with izp + s; the packer (refcodegen/packing.py) emits
 * per channel corr = bias - (s + izp) * sum(w') for both domains, so
 *   acc = sum((x + s) * w') + corr = sum((x - izp) * w') + bias   (mod 2^32).
 * w' = w - kernel_zp must fit int8; otherwise the packer emits no fast data and the
 * dispatcher runs the scalar reference.
 */

/* Weights of a GEMM-shaped kernel (conv with groups == 1, dense): out channels padded to
 * np (multiple of 16), reduction padded to kp (multiple of 4), bytes laid out
 * [np/16][kp/4][16][4] so one 64-byte row feeds 16 channels x 4 reduction steps. */
typedef struct {
  int32_t kp, np;
  const int8_t* w;
  const int32_t* corr_u8; /* np entries: correction for a uint8-domain input (x86) */
  const int32_t* corr_s8; /* np entries: correction for an int8-domain input (aarch64) */
  const uint8_t* pair_safe; /* np/16 entries, 1: no vpmaddubsw of the block can saturate, so AVX2 runs
                               it on the uint8 x int8 path (packing.pairs_fit_int16); NULL: none */
} refcg_gemm_weights;

/* Weights of a conv in the Winograd F(2x2, 3x3) domain (refcg_wino_weights), built from the packed
 * GEMM weights at the first call that runs the Winograd kernels and kept until the library unloads:
 * 16/9 x 2 bytes per weight are too much constant data to emit (ResNet-18: +34 MB). The library
 * defines one zero-initialized cache per eligible conv and a destructor that releases it. */
typedef struct {
  void* w; /* NULL until built; set once (atomically) */
} refcg_wino_cache;

/* Frees c's weights (a no-op when they were never built); no call may run the conv meanwhile. */
REFCG_API void refcg_wino_release(refcg_wino_cache* c);

/* Extra compile-time data of one conv for the accelerated kernels. */
enum { REFCG_FAST_NONE = 0, REFCG_FAST_GEMM = 1, REFCG_FAST_DEPTHWISE = 2 };
typedef struct {
  int32_t kind;          /* REFCG_FAST_* */
  int32_t cp;            /* channels per pixel in the padded input copy (GEMM: in_c rounded to 4) */
  refcg_gemm_weights gemm;
  const int16_t* dw_w;   /* depthwise: [kh*kw][cp] w' as int16 */
  const int32_t* dw_corr_u8;
  const int32_t* dw_corr_s8;
  /* Depthwise w' in the layouts the x86 channel kernels read (refcg_fast_internal.h), packed ahead of
   * time by refcodegen.packing; NULL: refcg_conv2d builds them from dw_w on every call. */
  const int16_t* dw_pairs; /* tap pairs (refcg_dw_pair_weights): AVX2, AVX-VNNI */
  const int8_t* dw_quads;  /* row quads of a 3x3 or 5x5 kernel (refcg_dw_quad_weights): AVX-512 */
  /* GEMM 3x3 stride-1 convs whose Winograd sums provably fit int32 (refcodegen.packing.winograd_ok):
   * the variants with Winograd kernels (AVX2) run them there; NULL: never */
  refcg_wino_cache* wino;
} refcg_conv2d_fast;

/* Conv through the best kernel for this CPU; the reference when f is NULL, f->kind is
 * NONE, or the variant is "scalar" with the reference weights present (without them the scalar
 * variant runs the packed GEMM). Same contract as refcg_conv2d_ref. */
REFCG_API int refcg_conv2d(const refcg_conv2d_params* p, const refcg_conv2d_consts* k,
                           const refcg_conv2d_fast* f, const void* input, void* output);

/* Dense / GEMM (refcg_dense_params above): out[b][u] = requant(sum_k (x[b][k] - input_zp)
 * * w'[u][k] + bias[u]) with weights packed by refcodegen.packing.pack_gemm_weights, which
 * folds kernel_zp into w' and the bias into the corrections (p->kernel_zp and w_dtype are
 * not read). Per-tensor or per-channel requantize, channel = unit. */
REFCG_API int refcg_dense(const refcg_dense_params* p, const refcg_gemm_weights* g,
                          const refcg_requant* rq, const void* input, void* output);

/* qnn.add / subtract / mul (refcg_binary_params above) through the best variant: 8-bit
 * operands, vector requantize modes, innermost strides 0 or 1; otherwise refcg_binary_ref. */
REFCG_API int refcg_binary(const refcg_binary_params* p, const void* a, const void* b, void* out);

/* nn.max_pool2d / avg pools (refcg_pool2d_params above) through the best variant on 8-bit inputs as
 * planes (NCHW) or with channels contiguous (NHWC); otherwise refcg_pool2d_ref. */
REFCG_API int refcg_pool2d(const refcg_pool2d_params* p, const void* input, void* output);

/* ---- variant selection ----
 * The dispatcher picks one variant at its first call: REFCG_ISA (read once, from the
 * environment) when it names a supported variant, else the best the CPU supports. */

/* Name of the variant the dispatcher uses ("avx512vnni", "avxvnni", "avx2", "dotprod",
 * "neon", "scalar"). */
REFCG_API const char* refcg_isa_name(void);

/* 1 if the named variant is compiled in for this architecture and the CPU runs it. */
REFCG_API int refcg_isa_supported(const char* name);

/* For tests and tools: the i-th variant compiled in for this architecture, best first, the last
 * being "scalar"; NULL past the end. *features (when features is not NULL) names the CPU
 * features the variant needs. */
REFCG_API const char* refcg_isa_variant(int32_t i, const char** features);

/* For tests and tools: switch every later call to the named variant, as REFCG_ISA would at
 * start-up. NULL or "" selects the best the CPU supports; an unsupported name does too, and
 * returns -1 (0 otherwise). Not for use while other threads run the core. */
REFCG_API int refcg_set_isa(const char* name);

/* ---- qnn.batch_matmul with run-time operands (refcg_batch_matmul.c) ----
 * out[b][m][n] = requant(sum_k (x[b'][m][k] - x_zp) * (y[b''][n][k] - y_zp) + bias[n], n), x [x_batch][m][k],
 * y [y_batch][n][k] (TVM's only form, transpose_b); an operand of batch 1 is broadcast over the batch.
 * The sum wraps in int32 like TVM's; the partition check keeps it from wrapping. */
typedef struct {
  int32_t batch, m, n, k;
  int32_t x_batch, y_batch; /* batch or 1 */
  int32_t x_dtype, y_dtype, out_dtype;
  int32_t x_zp, y_zp;
  const int32_t* bias; /* [n], NULL when absent */
  refcg_requant rq;    /* channel = n */
} refcg_batch_matmul_params;

/* Returns 0, -1 on invalid parameters, -2 when the workspace cannot be allocated. */
REFCG_API int refcg_batch_matmul(const refcg_batch_matmul_params* p, const void* x, const void* y, void* out);

#ifdef __cplusplus
}
#endif

#endif /* REFCG_H_ */
