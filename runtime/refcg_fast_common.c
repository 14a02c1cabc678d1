/*
 * Shared pieces of the accelerated kernels: the tile job every ISA variant executes,
 * the scalar epilogue, threads and workspace.
 *
 * Threads and workspace come from the TVM runtime when the generated module includes
 * tvm/runtime/c_backend_api.h before the core (TVMBackendParallelLaunch honours
 * TVM_NUM_THREADS); the standalone cffi build has no TVM runtime and gets a serial shim.
 */
#include <stdlib.h>
#include <string.h>
#include "refcg_fast.h"

/* Helpers of the kernels are always inlined: export_library compiles the generated source
 * without -O flags, and under the module's `#pragma GCC optimize("O3")` alone GCC keeps
 * small helpers as calls inside target("avx512...") loops, which spills every accumulator. */
#define REFCG_INLINE static inline __attribute__((always_inline))

/* Requantize + store of output row pieces: what every epilogue needs. */
typedef struct {
  const refcg_requant* rq;
  int32_t rq_vector;    /* 1: the mode has a vector implementation (see refcg_rq_vector_ok) */
  const int32_t* corr;  /* per channel, added to the raw accumulator */
  void* out;
  int32_t out_dtype;
  int64_t o_c;          /* element stride between channels */
} refcg_epi;

/* Epilogue of up to 16 channels [c0, c0 + nvalid) of one output pixel at element offset off. */
typedef void (*refcg_epi_fn)(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid, int64_t off);

/* One GEMM-shaped computation: rows are output pixels i, with A bytes of pixel i at
 * a + (i / cols) * a_row_h + (i % cols) * a_row_w + seg_off[s] + [0, seg_len) for each segment s. */
typedef struct {
  int32_t m, cols;
  int64_t a_row_h, a_row_w;
  const uint8_t* a;
  int32_t nseg, seg_len;
  const int64_t* seg_off;
  int32_t n, kp;
  const int8_t* w;
  refcg_epi epi;
  int64_t o_row_h, o_row_w; /* element strides of the output per output row / per pixel */
} refcg_gemm_job;

REFCG_INLINE const uint8_t* refcg_job_row(const refcg_gemm_job* j, int32_t i) {
  return j->a + (int64_t)(i / j->cols) * j->a_row_h + (int64_t)(i % j->cols) * j->a_row_w;
}

/* Row pointers of the tile starting at row i0; rows past the end repeat the last row (their
 * results are discarded), so the micro-kernels always run MR rows. Returns the valid rows. */
REFCG_INLINE int32_t refcg_tile_rows(const refcg_gemm_job* j, int32_t i0, int MR, const uint8_t** arow) {
  const int32_t rows = j->m - i0 < MR ? j->m - i0 : MR;
  for (int r = 0; r < MR; ++r) arow[r] = refcg_job_row(j, i0 + (r < rows ? r : rows - 1));
  return rows;
}

/* The tile loop of a variant with MR-row x 16-channel tiles: tile t is row block t / nblocks,
 * channel block t % nblocks; a last block of one row runs the MR = 1 kernel. */
#define REFCG_DEFINE_TILES(name, tile, MR)                                              \
  static void name(const void* ctx, int64_t t0, int64_t t1) {                          \
    const refcg_gemm_job* j = (const refcg_gemm_job*)ctx;                              \
    const int32_t nblocks = (j->n + 15) / 16;                                           \
    for (int64_t t = t0; t < t1; ++t) {                                                 \
      const int32_t i0 = (int32_t)(t / nblocks) * (MR), nb = (int32_t)(t % nblocks);     \
      if (j->m - i0 == 1)                                                               \
        tile(j, i0, nb, 1);                                                             \
      else                                                                              \
        tile(j, i0, nb, MR);                                                            \
    }                                                                                   \
  }

REFCG_INLINE int64_t refcg_job_out(const refcg_gemm_job* j, int32_t i) {
  return (int64_t)(i / j->cols) * j->o_row_h + (int64_t)(i % j->cols) * j->o_row_w;
}

/* Modes with vector code: int64 UPWARD without left shifts, float32 UPWARD/TONEAREST. */
REFCG_INLINE int refcg_rq_vector_ok(const refcg_requant* rq, int32_t channels) {
  if (rq->mode == REFCG_RQ_FLOAT32_UPWARD || rq->mode == REFCG_RQ_FLOAT32_TONEAREST) return 1;
  if (rq->mode != REFCG_RQ_INT64_UPWARD) return 0;
  if (rq->identity) return 1;
  for (int32_t c = 0; c < (rq->per_channel ? channels : 1); ++c)
    if (rq->shift[c] > 0 || rq->shift[c] < -31) return 0;
  return 1;
}

REFCG_INLINE void refcg_epi_scalar(const refcg_epi* e, const int32_t* acc, int32_t c0, int32_t nvalid,
                                    int64_t off) {
  for (int32_t l = 0; l < nvalid; ++l) {
    const int32_t c = c0 + l;
    const int32_t v = refcg_requantize_one(e->rq, (int32_t)((uint32_t)acc[l] + (uint32_t)e->corr[c]), c);
    refcg_store(e->out, off + c * e->o_c, e->out_dtype, v);
  }
}

/* Store requantized values (already clamped) of channels [c0, c0 + nvalid). */
REFCG_INLINE void refcg_epi_store(const refcg_epi* e, const int32_t* v, int32_t c0, int32_t nvalid, int64_t off) {
  if (e->out_dtype == REFCG_S32) {
    int32_t* o = (int32_t*)e->out + off + c0 * e->o_c;
    for (int32_t l = 0; l < nvalid; ++l) o[l * e->o_c] = v[l];
  } else { /* int8 and uint8 store the same low byte of an in-range value */
    uint8_t* o = (uint8_t*)e->out + off + c0 * e->o_c;
    for (int32_t l = 0; l < nvalid; ++l) o[l * e->o_c] = (uint8_t)v[l];
  }
}

/* ---- threads ---- */
typedef void (*refcg_range_fn)(const void* ctx, int64_t begin, int64_t end);
typedef struct {
  refcg_range_fn fn;
  const void* ctx;
  int64_t total;
} refcg_par_task;

REFCG_INLINE void refcg_par_run(const refcg_par_task* t, int task_id, int num_task) {
  const int64_t begin = t->total * task_id / num_task, end = t->total * (task_id + 1) / num_task;
  if (begin < end) t->fn(t->ctx, begin, end);
}

#if defined(TVM_RUNTIME_C_BACKEND_API_H_) && !defined(REFCG_SERIAL)
static int refcg_par_lambda(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  refcg_par_run((const refcg_par_task*)cdata, task_id, penv->num_task);
  return 0;
}
/* Split [0, total) into contiguous ranges over TVM's thread pool. */
REFCG_INLINE void refcg_parallel(refcg_range_fn fn, const void* ctx, int64_t total) {
  refcg_par_task t = {fn, ctx, total};
  if (total <= 1 || TVMBackendParallelLaunch(refcg_par_lambda, &t, 0) != 0) refcg_par_run(&t, 0, 1);
}
REFCG_INLINE void* refcg_ws_alloc(size_t n) { return TVMBackendAllocWorkspace(1 /* kDLCPU */, 0, n, 0, 8); }
REFCG_INLINE void refcg_ws_free(void* p) { TVMBackendFreeWorkspace(1 /* kDLCPU */, 0, p); }
#else
REFCG_INLINE void refcg_parallel(refcg_range_fn fn, const void* ctx, int64_t total) {
  refcg_par_task t = {fn, ctx, total};
  refcg_par_run(&t, 0, 1);
}
REFCG_INLINE void* refcg_ws_alloc(size_t n) { return malloc(n); }
REFCG_INLINE void refcg_ws_free(void* p) { free(p); }
#endif

/* ---- depthwise conv (channel multiplier 1) over the padded input copy ---- */
typedef struct {
  const uint8_t* a;       /* padded copy: [hp][wp][cp] domain bytes */
  int32_t signed_domain;  /* 1: bytes are int8, 0: uint8 */
  int32_t wp, cp;         /* padded width in pixels, channels per pixel (multiple of 16) */
  int32_t out_w, c, kh, kw, sh, sw, dh, dw;
  const int16_t* w;       /* [kh*kw][cp] */
  refcg_epi epi;
  int64_t o_h, o_w;       /* output element strides per row / pixel */
} refcg_dw_job;

/* Accumulators of 16 channels [c0, c0 + 16) of one output pixel whose first tap is at base. */
typedef void (*refcg_dw16_fn)(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc);

/* Portable dw16: products (x + s) * w' fit int32 exactly. */
REFCG_INLINE void refcg_dw16_portable(const refcg_dw_job* j, const uint8_t* base, int32_t c0, int32_t* acc) {
  for (int l = 0; l < 16; ++l) acc[l] = 0;
  for (int32_t kh = 0; kh < j->kh; ++kh) {
    for (int32_t kw = 0; kw < j->kw; ++kw) {
      const uint8_t* x = base + ((int64_t)kh * j->dh * j->wp + (int64_t)kw * j->dw) * j->cp + c0;
      const int16_t* w = j->w + (int64_t)(kh * j->kw + kw) * j->cp + c0;
      for (int l = 0; l < 16; ++l) acc[l] += (j->signed_domain ? (int32_t)(int8_t)x[l] : (int32_t)x[l]) * w[l];
    }
  }
}

/* Output rows [r0, r1), 16 channels at a time with the taps innermost; each ISA section
 * instantiates it with its own dw16 and epilogue. */
REFCG_INLINE void refcg_dw_rows(const refcg_dw_job* j, int64_t r0, int64_t r1,
                                                                refcg_dw16_fn dw16, refcg_epi_fn epi) {
  for (int64_t oh = r0; oh < r1; ++oh) {
    for (int32_t ow = 0; ow < j->out_w; ++ow) {
      const uint8_t* base = j->a + ((int64_t)oh * j->sh * j->wp + (int64_t)ow * j->sw) * j->cp;
      for (int32_t c0 = 0; c0 < j->c; c0 += 16) {
        int32_t acc[16];
        dw16(j, base, c0, acc);
        epi(&j->epi, acc, c0, j->c - c0 < 16 ? j->c - c0 : 16, oh * j->o_h + ow * j->o_w);
      }
    }
  }
}
