/*
 * Internals of the accelerated kernels (refcg_fast*.c), not part of the API: the jobs every
 * ISA variant executes, the scalar epilogue, threads and workspace, and the per-variant
 * configs the dispatcher chooses from.
 *
 * Threads and workspace come from the TVM runtime when the generated module includes
 * tvm/runtime/c_backend_api.h before the core (TVMBackendParallelLaunch honours
 * TVM_NUM_THREADS); standalone builds (librefcg_core.a, the cffi harness) get a serial shim.
 */
#ifndef REFCG_FAST_INTERNAL_H_
#define REFCG_FAST_INTERNAL_H_

#include <stdlib.h>
#include <string.h>
#include "refcg_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#define REFCG_HAVE_X86 1 /* refcg_fast_x86.c holds the x86 variants */
#endif
#if defined(__aarch64__)
#define REFCG_HAVE_ARM 1 /* refcg_fast_arm.c holds the aarch64 variants */
#endif

/* Helpers of the kernels are always inlined: export_library compiles the generated source
 * without -O flags, and under the module's `#pragma GCC optimize("O3")` alone GCC keeps
 * small helpers as calls inside target("avx512...") loops, which spills every accumulator. */
#define REFCG_INLINE static inline __attribute__((always_inline))
/* Unroll the next loop completely (its trip count a compile-time constant): what the body tests on
 * the loop index becomes constant. */
#if defined(__clang__)
#define REFCG_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define REFCG_UNROLL _Pragma("GCC unroll 32")
#else
#define REFCG_UNROLL
#endif

/* The requantize plan of a block of channels, fixed before its loops: the epilogue's mode and flags
 * become compile-time constants where a caller passes a constant plan (REFCG_WITH_PLAN).
 * REFCG_PLAN_ANY tests them per vector; REFCG_PLAN_I64_UP is the int64 UPWARD plan with right shifts
 * only; REFCG_PLAN_F32_UP + (fused) + 2 * (post added) is float32 UPWARD, not identity. */
enum { REFCG_PLAN_ANY = 0, REFCG_PLAN_I64_UP = 1, REFCG_PLAN_F32_UP = 2 };
/* The binary kernels' plan of both operands in refcg_rq32 form (past REFCG_WITH_PLAN's values). */
#define REFCG_PLAN_N32 16
#define REFCG_PLAN_FUSED(plan) (((plan) - REFCG_PLAN_F32_UP) & 1)
#define REFCG_PLAN_POST(plan) (((plan) - REFCG_PLAN_F32_UP) >> 1)
#define REFCG_PLAN_F32_FMA (REFCG_PLAN_F32_UP + 1)

/* The plan two blocks (or operands) share: REFCG_PLAN_ANY where they differ. */
#define REFCG_PLAN_MEET(a, b) ((a) == (b) ? (a) : REFCG_PLAN_ANY)

/* The plans hot kernels are copied for: those of default builds, int64 UPWARD (target llvm), float32
 * UPWARD fused (-mcpu since Haswell: sse4.1 and FMA) and unfused (the same targets' depthwise convs,
 * whose requantize TVM-only computes stage by stage, stagewise.py; a target without FMA). The others
 * (a separate + 0.5: float32 forced on a target without sse4.1) run the REFCG_PLAN_ANY copy: every copy
 * costs seconds of each core compile (refcg_fast_x86.c alone, gcc -O3: 30 s with the first two copied,
 * 41 s with the third; 71 s once with six copies). The set is spelled here only: REFCG_PLAN_INDEX,
 * REFCG_WITH_COPIED_PLAN and REFCG_DEFINE_BY_PLAN's copies. */
#define REFCG_PLAN_INDEX(plan) \
  ((plan) == REFCG_PLAN_I64_UP || (plan) == REFCG_PLAN_F32_UP || (plan) == REFCG_PLAN_F32_FMA ? (plan) : REFCG_PLAN_ANY)

/* CALL(p) with p the constant equal to plan, a copied plan (REFCG_PLAN_INDEX(plan) is not
 * REFCG_PLAN_ANY): for callers that take REFCG_PLAN_ANY elsewhere (out of line). */
#define REFCG_WITH_COPIED_PLAN(plan, CALL) \
  do {                                     \
    if ((plan) == REFCG_PLAN_I64_UP)       \
      CALL(REFCG_PLAN_I64_UP);             \
    else if ((plan) == REFCG_PLAN_F32_UP)  \
      CALL(REFCG_PLAN_F32_UP);             \
    else                                   \
      CALL(REFCG_PLAN_F32_FMA);            \
  } while (0)

/* CALL(p) with p the constant REFCG_PLAN_INDEX(plan): one specialized copy of CALL per copied plan. */
#define REFCG_WITH_PLAN(plan, CALL)                 \
  do {                                              \
    if (REFCG_PLAN_INDEX(plan) == REFCG_PLAN_ANY)   \
      CALL(REFCG_PLAN_ANY);                         \
    else                                            \
      REFCG_WITH_COPIED_PLAN(plan, CALL);           \
  } while (0)

/* NAME##_p##K(ARGS): FN(ARGS, K) as a function of its own, K a constant. Where a hot loop nest takes a
 * constant (a plan, a tile width), its copies are large; inlined into one caller they made one function
 * of ~300 KB of code, and GCC's register allocation and PRE grow faster than the code (the x86 core took
 * 111 s of gcc -O3, 54 s split). Called once per channel block and row range, the call costs nothing
 * measurable. */
#define REFCG_UNPAREN(...) __VA_ARGS__
#define REFCG_CONST_COPY(NAME, FN, PARAMS, ARGS, K) \
  static __attribute__((noinline)) void NAME##_p##K PARAMS { FN(REFCG_UNPAREN ARGS, K); }
/* NAME[REFCG_PLAN_INDEX(plan)](ARGS): FN(ARGS, p) copied per copied plan (REFCG_CONST_COPY) */
#define REFCG_DEFINE_BY_PLAN(NAME, FN, PARAMS, ARGS)                                           \
  REFCG_CONST_COPY(NAME, FN, PARAMS, ARGS, 0)                                                  \
  REFCG_CONST_COPY(NAME, FN, PARAMS, ARGS, 1)                                                  \
  REFCG_CONST_COPY(NAME, FN, PARAMS, ARGS, 2)                                                  \
  REFCG_CONST_COPY(NAME, FN, PARAMS, ARGS, 3)                                                  \
  static void(*const NAME[4]) PARAMS = {NAME##_p0, NAME##_p1, NAME##_p2, NAME##_p3};

/* Requantize + store of output row pieces: what every epilogue needs. */
typedef struct {
  const refcg_requant* rq;
  int32_t rq_vector;    /* 1: the mode has a vector implementation (see refcg_rq_vector_ok) */
  const int32_t* corr;  /* per channel, added to the raw accumulator */
  void* out;
  int32_t out_dtype;
  int64_t o_c;          /* element stride between channels */
} refcg_epi;

/* e requantizes whole vectors into contiguous 8-bit channels: the epilogues' direct byte stores. */
REFCG_INLINE int refcg_epi_vector_bytes(const refcg_epi* e) {
  return e->rq_vector && e->o_c == 1 && e->out_dtype != REFCG_S32;
}

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
  const uint8_t* pair_safe; /* refcg_gemm_weights.pair_safe: blocks AVX2 runs with vpmaddubsw */
  uint32_t flip4;           /* XOR of every 4 bytes of a read in place into the domain (refcg_gemm_config.flips) */
  const uint16_t* a16;      /* a's domain bytes zero-extended, same offsets (refcg_gemm_config.reads_a16), or NULL */
} refcg_gemm_job;

/* n bytes of src zero-extended into dst (refcg_gemm_job.a16), in tasks of REFCG_WIDEN_CHUNK bytes. */
typedef struct {
  const uint8_t* src;
  uint16_t* dst;
  int64_t n;
  uint8_t flip; /* XOR of each byte: an input of the other dtype read in place (refcg_gemm_job.flip4) */
} refcg_widen_job;
#define REFCG_WIDEN_CHUNK 8192

/* 1x1 stride-1 unpadded conv on planar (NCHW) tensors, pixels in the lanes: out[oc][p] =
 * sum_k w'[oc][k] x[k][p] + corr[oc]. The input is interleaved once into xi [kp/4][hw][4] domain
 * bytes, so 64 bytes hold 16 pixels x 4 k; the broadcast operand is w'[oc][4 k], read straight
 * from the packed GEMM weights. No NHWC copy and no output unpack. */
typedef struct {
  const uint8_t* xi; /* [kp/4][hw][4] (+ slack: tail pixel blocks read past hw) */
  int64_t hw;        /* pixels per plane */
  int32_t n, kp;     /* output channels, padded reduction */
  const int8_t* w;   /* refcg_gemm_weights.w */
  refcg_epi epi;     /* o_c: output plane stride (elements) */
} refcg_gemmp_job;
#define REFCG_GEMMP_MR 6  /* tile grid the job is split on: output channels ... */
#define REFCG_GEMMP_PX 64 /* ... x pixels */

/* The packed weights (4 bytes per k-step) of output channels [oc0, oc0 + REFCG_GEMMP_MR) of a tile; channels
 * past n repeat the last one (computed, not stored). Returns the channels that are stored. */
REFCG_INLINE int32_t refcg_gemmp_wrows(const refcg_gemmp_job* j, int32_t oc0, const int8_t** wrow) {
  const int32_t rows = j->n - oc0 < REFCG_GEMMP_MR ? j->n - oc0 : REFCG_GEMMP_MR;
  for (int r = 0; r < REFCG_GEMMP_MR; ++r) {
    const int32_t oc = oc0 + (r < rows ? r : rows - 1);
    wrow[r] = j->w + (int64_t)(oc / 16) * j->kp * 16 + (oc % 16) * 4;
  }
  return rows;
}

/* Winograd F(2x2, 3x3) over the padded NHWC domain copy of a 3x3 stride-1 conv: each tile of 2x2
 * outputs reads a 4x4 input patch d, V = B^T d B (int16: |V| <= 4 * 255), U = G' g G'^T with G' = 2G
 * (int16: |U| <= 9 * 128), M = sum_c U V in wrapping int32 (vpmaddwd), 4 y = A^T M A exact when
 * 4 * 9 * 255 * 128 * cp < 2^31 (REFCG_WINO_MAX_CP), y = (4 y) >> 2, then the GEMM's epilogue (corr,
 * requantize). 16 GEMMs of (tiles x cp) x (cp x n): 2.25x fewer multiplies than the direct conv.
 * Tasks: blocks of tb tiles (row-major over th x tw) x groups of gb 16-channel blocks. */
#define REFCG_WINO_MAX_CP 1824
typedef struct {
  const uint8_t* a;        /* [hp][wp][cp], hp >= 2 th + 2, wp >= 2 tw + 2 */
  int64_t wp;
  int32_t cp, nb;          /* channels per pixel (a multiple of 16), 16-channel blocks of output */
  int32_t th, tw, out_h, out_w;
  int32_t tb, gb, ngroups; /* tiles per block, blocks per channel group, groups */
  const int16_t* u;        /* refcg_wino_weights: [16][nb][cp / 2][16][2] */
  const refcg_gemm_job* gemm; /* the conv as a GEMM: its epilogue and output strides (n, epi, o_row_*) */
  int* failed;             /* set when a task's buffer could not be allocated */
} refcg_wino_job;

REFCG_INLINE const uint8_t* refcg_job_row(const refcg_gemm_job* j, int32_t i) {
  return j->a + (int64_t)(i / j->cols) * j->a_row_h + (int64_t)(i % j->cols) * j->a_row_w;
}

/* Input row pointers and output offsets of n rows from the one at output row q, column c. */
REFCG_INLINE void refcg_job_rows_at(const refcg_gemm_job* j, int32_t q, int32_t c, int n, const uint8_t** arow,
                                    int64_t* out_off) {
  for (int r = 0; r < n; ++r) {
    arow[r] = j->a + (int64_t)q * j->a_row_h + (int64_t)c * j->a_row_w;
    out_off[r] = (int64_t)q * j->o_row_h + (int64_t)c * j->o_row_w;
    if (++c == j->cols) {
      c = 0;
      ++q;
    }
  }
}

/* Output row q, column c of the row n rows further on: the tile loops' running position (no division
 * per tile). */
REFCG_INLINE void refcg_rows_advance(const refcg_gemm_job* j, int32_t* q, int32_t* c, int32_t n) {
  for (*c += n; *c >= j->cols; *c -= j->cols) ++*q;
}

/* Rows [i0, i0 + n) with one division (a division per row and channel block in the epilogue was
 * the largest cost of 1x1 convs with small K). */
REFCG_INLINE void refcg_job_rows(const refcg_gemm_job* j, int32_t i0, int n, const uint8_t** arow, int64_t* out_off) {
  const int32_t q = i0 / j->cols;
  refcg_job_rows_at(j, q, i0 - q * j->cols, n, arow, out_off);
}

/* refcg_job_rows_at of the tile starting at row i0 (output row q, column c); rows past the end
 * repeat the last row (their results are discarded), so the micro-kernels always run MR rows.
 * Returns the valid rows. */
REFCG_INLINE int32_t refcg_tile_rows_at(const refcg_gemm_job* j, int32_t i0, int32_t q, int32_t c, int MR,
                                        const uint8_t** arow, int64_t* out_off) {
  const int32_t rows = j->m - i0 < MR ? j->m - i0 : MR;
  refcg_job_rows_at(j, q, c, rows, arow, out_off);
  for (int r = rows; r < MR; ++r) {
    arow[r] = arow[rows - 1];
    out_off[r] = out_off[rows - 1];
  }
  return rows;
}

REFCG_INLINE int32_t refcg_tile_rows(const refcg_gemm_job* j, int32_t i0, int MR, const uint8_t** arow,
                                     int64_t* out_off) {
  const int32_t q = i0 / j->cols;
  return refcg_tile_rows_at(j, i0, q, i0 - q * j->cols, MR, arow, out_off);
}

/* A thread's range [t0, t1) of tiles t = row * ncols + col (rows: row blocks; cols: channel
 * blocks or groups): the rows [*lo, *hi) of column col in it. The range holds whole rows but at its
 * ends, so threads write disjoint output rows (a split by columns had 2 threads storing into the same
 * cache lines: slower than 1 thread). */
REFCG_INLINE void refcg_rows_of_col(int64_t t0, int64_t t1, int64_t ncols, int64_t col, int64_t* lo, int64_t* hi) {
  const int64_t first = t0 / ncols, last = (t1 - 1) / ncols;
  *lo = first + (first * ncols + col < t0);
  *hi = last + (last * ncols + col < t1);
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

/* The int64 modes as the vector epilogues compute them (refcg_fast_x86.c), exact wherever
 * refcg_fpm_upward / refcg_fpm_tonearest are defined (shifts s in [-32, 63]). With p = x * m in
 * int64 and t = 31 - min(s, 0), the result is bits [t, t + 32) of w = (p << max(s, 0)) + 2^(t-1)
 * (- 1 when TONEAREST and p << max(s, 0) < 0), sign-filled past bit 63: the high 32 bits of
 * u = w << a (a = 1 when t == 31) shifted right arithmetically by r = t - 32 + a, so the last shift
 * runs on 32-bit lanes and the two int64 halves merge with one shuffle. UPWARD folds a into the
 * first shift (l1 = max(s, 0) + a, rounding 2^kx with kx = t - 1 + a); TONEAREST takes the sign
 * before it (l2 = a). REFCG_FPM_PLAN computes l1, l2, kx and r from s, lane by lane for a GCC
 * vector of int32 of any width (the variants' lane loads); up: 1 for UPWARD, 0 for TONEAREST.
 * Branch-free: with n = s >> 31, min(s, 0) = s & n and a = n + 1. */
#define REFCG_FPM_PLAN(s, up, l1, l2, kx, r)                                                  \
  do {                                                                                        \
    const __typeof__(s) n_ = (s) >> 31, a_ = n_ + 1, upm_ = (s) - (s) - (up), nonpos_ = (s) & n_; \
    (l1) = ((s) & ~n_) + (a_ & upm_);                                                         \
    (l2) = a_ & ~upm_;                                                                        \
    (kx) = 30 - nonpos_ + (a_ & upm_);                                                        \
    (r) = a_ - 1 - nonpos_;                                                                   \
  } while (0)

/* REFCG_FPM_PLAN of one channel, which the plane kernels broadcast (per channel and tile): the
 * rounding as the int64 2^kx; general: TONEAREST or a left shift first (the full sequence). */
typedef struct {
  int32_t l1, l2, r, general;
  int64_t k;
} refcg_fpm_one;

REFCG_INLINE refcg_fpm_one refcg_fpm_one_of(const refcg_requant* rq, int32_t c) {
  const int32_t shift = rq->shift[c], up = rq->mode == REFCG_RQ_INT64_UPWARD;
  int32_t l1, l2, kx, r;
  REFCG_FPM_PLAN(shift, up, l1, l2, kx, r);
  const refcg_fpm_one one = {l1, l2, r, !up || l1 != 0, (int64_t)(1ULL << (kx & 63))}; /* kx < 64 where read */
  return one;
}

/* The int64 UPWARD right-shift plan (l1 = 0) with both zero points folded into its rounding
 * constant: ((x - izp) * m + k) >> (32 + r) + ozp == (x * m + k') >> (32 + r) with
 * k' = k - izp * m + ozp * 2^(32 + r) (refcg_fpm_fold_k), which saves the vector epilogue a
 * subtract and an add. Exact where x - izp does not wrap in int32 (izp = 0, or the caller's x are
 * 8-bit) and nothing overflows: for r <= 27 (k = 2^(31 + r) <= 2^58), |izp| <= 2^29 and
 * |ozp| * 2^r < 2^28, |k'| < 2^62 and |x * m| < 2^62, so the int64 sum cannot wrap, nor can the
 * + ozp it replaces (|sum| >> (32 + r) < 2^31 - 2^28). */
REFCG_INLINE int refcg_fpm_fold_ok(int32_t rmax, int32_t izp, int32_t ozp) {
  if (izp == 0 && ozp == 0) return 1;
  const int64_t o = ozp < 0 ? -(int64_t)ozp : ozp;
  return rmax >= 0 && rmax <= 27 && izp >= -(1 << 29) && izp <= (1 << 29) && (o << rmax) < (1 << 28);
}

REFCG_INLINE int64_t refcg_fpm_fold_k(int64_t k, int32_t r, int32_t m, int32_t izp, int32_t ozp) {
  return k - (int64_t)izp * m + (int64_t)ozp * ((int64_t)1 << (32 + r));
}

/* A qnn.add/subtract operand requantized in int64 UPWARD with a left shift first (l1 > 0: a scale
 * ratio >= 0.5, as in most residual adds) runs the right-shift plan on v = (x - zp) << l1: the
 * product's shift moved before the multiply, exact where v fits int32 (8-bit x and |zp| <= 255:
 * |x - zp| <= 510 < 2^(31 - l1) for l1 <= 21). The shift (0: the operand keeps its own plan). */
REFCG_INLINE int32_t refcg_bin_preshift(const refcg_requant* rq) {
  if (rq->mode != REFCG_RQ_INT64_UPWARD || rq->identity || rq->per_channel) return 0;
  if (rq->input_zp < -255 || rq->input_zp > 255 || rq->shift[0] > 63 || rq->shift[0] < -32) return 0;
  const int32_t l1 = refcg_fpm_one_of(rq, 0).l1;
  return l1 <= 21 ? l1 : 0;
}

/* An 8-bit operand's requantize before its clamp, q(x) for the 256 values of its dtype from lo, in
 * 32-bit lanes: (x * m + c) >> s, one multiply, add and shift where the int64 form takes two
 * multiplies, two adds and three shuffles per vector. The candidate is TVM's int64 UPWARD form
 * q(x) = ((x - izp) * M + 2^(T - 1) + (ozp << T)) >> T (T = 31 - shift) with the addend rounded
 * and M rounded (variant 0), floored (1) or raised (2) to T - s fewer bits, s the largest shift at
 * which x * m + c cannot wrap (an identity: x + ozp - izp). Only a candidate: a caller takes one that
 * equals its own vector requantize (any mode) on all 256 values (refcg_bin_rq32_*). A ratio whose
 * products land within 2^-16 or so of a rounding step (0.62 = 31/50: many do) has none. */
typedef struct {
  int32_t m, c, s;
} refcg_rq32;
#define REFCG_RQ32_VARIANTS 3

REFCG_INLINE int refcg_rq32_candidate(const refcg_requant* rq, int32_t lo, int variant, refcg_rq32* f) {
  if (rq->per_channel) return 0;
  if (rq->identity) {
    f->m = 1, f->c = rq->output_zp - rq->input_zp, f->s = 0;
    return variant == 0;
  }
  const int32_t T = 31 - rq->shift[0];
  if (T < 2 || T > 54) return 0; /* 2^(T - 1) and ozp << T (|ozp| < 2^8) in int64 */
  const int64_t M = rq->multiplier[0];
  const int64_t K = -(int64_t)rq->input_zp * M + ((int64_t)1 << (T - 1)) + (int64_t)rq->output_zp * ((int64_t)1 << T);
  const int64_t xmax = lo + 255 > -(int64_t)lo ? lo + 255 : -(int64_t)lo;
  for (int32_t s = T - 1; s >= 1; --s) {
    const int32_t e = T - s;
    const int64_t low = M & (((int64_t)1 << e) - 1);
    const int64_t m = (M >> e) + (variant == 0 ? (M >> (e - 1)) & 1 : variant == 2 ? low != 0 : 0);
    const int64_t c = (K >> e) + ((K >> (e - 1)) & 1);
    if (xmax * m + (c < 0 ? -c : c) >= ((int64_t)1 << 31)) continue;
    f->m = (int32_t)m, f->c = (int32_t)c, f->s = s;
    return 1;
  }
  return 0;
}

/* Modes with vector code: every mode but the aarch64 NEON one, int64 shifts in [-32, 63]. */
REFCG_INLINE int refcg_rq_vector_ok(const refcg_requant* rq, int32_t channels) {
  if (rq->mode == REFCG_RQ_INT64_UPWARD_NEON) return 0;
  if (rq->mode != REFCG_RQ_INT64_UPWARD && rq->mode != REFCG_RQ_INT64_TONEAREST) return 1;
  if (rq->identity) return 1;
  for (int32_t c = 0; c < (rq->per_channel ? channels : 1); ++c)
    if (rq->shift[c] > 63 || rq->shift[c] < -32) return 0;
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

/* Phases of one kernel call, each split over the threads, each waiting for the one before (a pad
 * copy, then the tiles that read it): one launch of the pool and a barrier per phase boundary, not a
 * launch per phase (a launch wakes the pool; a kernel of a small layer costs a few launches). */
typedef struct {
  const refcg_par_task* phase;
  int count;
} refcg_par_phases;

REFCG_INLINE void refcg_phases_serial(const refcg_par_task* phase, int count) {
  for (int i = 0; i < count; ++i) refcg_par_run(&phase[i], 0, 1);
}

#if defined(TVM_RUNTIME_C_BACKEND_API_H_) && !defined(REFCG_SERIAL)
static inline int refcg_par_lambda(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  refcg_par_run((const refcg_par_task*)cdata, task_id, penv->num_task);
  return 0;
}
static inline int refcg_phases_lambda(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  const refcg_par_phases* ph = (const refcg_par_phases*)cdata;
  for (int i = 0; i < ph->count; ++i) {
    if (i > 0) TVMBackendParallelBarrier(task_id, penv);
    refcg_par_run(&ph->phase[i], task_id, penv->num_task);
  }
  return 0;
}
/* Split [0, total) into contiguous ranges over TVM's thread pool. */
REFCG_INLINE void refcg_parallel(refcg_range_fn fn, const void* ctx, int64_t total) {
  refcg_par_task t = {fn, ctx, total};
  if (total <= 1 || TVMBackendParallelLaunch(refcg_par_lambda, &t, 0) != 0) refcg_par_run(&t, 0, 1);
}
/* refcg_parallel of each phase in order, in one launch (none when no phase splits). */
REFCG_INLINE void refcg_parallel_phases(const refcg_par_task* phase, int count) {
  const refcg_par_phases ph = {phase, count};
  int64_t most = 0;
  for (int i = 0; i < count; ++i) most = phase[i].total > most ? phase[i].total : most;
  if (most <= 1 || TVMBackendParallelLaunch(refcg_phases_lambda, (void*)&ph, 0) != 0) refcg_phases_serial(phase, count);
}
REFCG_INLINE void* refcg_ws_alloc(size_t n) { return TVMBackendAllocWorkspace(1 /* kDLCPU */, 0, n, 0, 8); }
REFCG_INLINE void refcg_ws_free(void* p) { TVMBackendFreeWorkspace(1 /* kDLCPU */, 0, p); }
#else
/* Without TVM's runtime (the cffi test core, the runtime's own build) the tasks run one after
 * another, split into *refcg_serial_tasks() ranges as a pool of that many threads would split them
 * (tests/epilogue_harness.c sets it: the kernels' partial ranges tested without threads). */
REFCG_INLINE int* refcg_serial_tasks(void) {
  static int tasks = 1;
  return &tasks;
}
REFCG_INLINE void refcg_parallel(refcg_range_fn fn, const void* ctx, int64_t total) {
  refcg_par_task t = {fn, ctx, total};
  const int n = *refcg_serial_tasks();
  for (int i = 0; i < n; ++i) refcg_par_run(&t, i, n);
}
REFCG_INLINE void refcg_parallel_phases(const refcg_par_task* phase, int count) {
  const int n = *refcg_serial_tasks();
  for (int p = 0; p < count; ++p)
    for (int i = 0; i < n; ++i) refcg_par_run(&phase[p], i, n);
}
/* Workspace allocations counted, those whose bit is set in mask failing (the harness sets them:
 * the kernels' fallbacks when a workspace does not fit, tested). */
typedef struct {
  uint32_t mask, count;
} refcg_ws_faults;
REFCG_INLINE refcg_ws_faults* refcg_serial_ws_faults(void) {
  static refcg_ws_faults faults = {0, 0};
  return &faults;
}
REFCG_INLINE void* refcg_ws_alloc(size_t n) {
  refcg_ws_faults* f = refcg_serial_ws_faults();
  const uint32_t i = f->count++;
  return i < 32 && (f->mask >> i & 1) ? NULL : malloc(n);
}
REFCG_INLINE void refcg_ws_free(void* p) { free(p); }
#endif

/* ---- depthwise conv (channel multiplier 1) over the padded input copy ---- */
#define REFCG_DW_MAX_TAPS 256 /* kernel_h * kernel_w of the fast paths (refcg_fast_usable) */
typedef struct {
  const uint8_t* a;       /* padded copy: [hp][wp][cp] domain bytes, from padded row a_row0 on */
  int64_t a_row0;         /* 0, or a task's first row (refcg_dw_padded_rows: each task pads its own rows) */
  int32_t signed_domain;  /* 1: bytes are int8, 0: uint8 */
  uint8_t flip;           /* XORed into every byte read: an input of the other dtype read in place (dw.flips) */
  int32_t wp, cp;         /* padded width in pixels, channels per pixel (multiple of 16) */
  int32_t out_w, c, kh, kw, sh, sw, dh, dw;
  const int16_t* w;       /* [kh*kw][cp], or the tap pairs of refcg_dw_pair_weights (refcg_dw_config.pairs) */
  const int16_t* w_taps;  /* [kh*kw][cp] always */
  const int8_t* wq;       /* the row quads of refcg_dw_quad_weights (refcg_dw_config.quads), or NULL */
  refcg_epi epi;
  int64_t o_h, o_w;       /* output element strides per row / pixel */
  int64_t tap_off[REFCG_DW_MAX_TAPS + 1]; /* bytes from a pixel's first tap to tap t; an odd count's last repeated */
} refcg_dw_job;

/* The next pixel after a PX-pixel step at ow of a w-wide row: ow + PX, or w - PX when MIN to PX - 1
 * pixels would be left (one more step ending at the row's end, over pixels already stored: the same
 * values stored again), instead of the per-pixel kernel: 3 of a 7-wide row's pixels, 2 of a 14-wide
 * one's. AVX-512 (MIN 1; its per-pixel kernel is the general one): 3x3 960@7 1.19x, 5x5 672@14 1.13x;
 * AVX2 (MIN 3: 960@7 1.05x; a 4-pixel step for 2 pixels measured 0.95x, its 2-pixel column step
 * takes them: 576@14 1.03x, 672@14 1.04x). */
REFCG_INLINE int32_t refcg_dw_next(int32_t ow, int32_t w, int32_t px, int32_t min) {
  const int32_t left = w - ow - px;
  return left >= min && left < px ? w - px : ow + px;
}

/* The shapes the x86 column-sharing depthwise kernels take: 3- or 5-wide kernel rows, undilated
 * along W, stride 1 or 2 along W. */
REFCG_INLINE int refcg_dw_cols_fit(const refcg_dw_job* j) {
  return j->dw == 1 && (j->kw == 3 || j->kw == 5) && (j->sw == 1 || j->sw == 2);
}

/* vpmaddwd takes two int16 taps per 32-bit lane: per pair of taps (t, t + 1; an odd last tap with a
 * zero weight) and 16 channels, 32 int16 in the order the lanes of unpacklo/hi_epi16 of the taps'
 * widened channels hold them: channels 0-3 | 8-11 (tap pairs), then 4-7 | 12-15. */
REFCG_INLINE int64_t refcg_dw_pairs_size(int32_t taps, int32_t cp) { return (int64_t)(taps + 1) / 2 * cp * 2; }

REFCG_INLINE void refcg_dw_pair_weights(const int16_t* w, int32_t taps, int32_t cp, int16_t* out) {
  for (int32_t t = 0; t < taps; t += 2)
    for (int32_t c = 0; c < cp; ++c) {
      const int32_t l = c % 16, half = l % 8 / 4, lane = l / 8;
      int16_t* d = out + (int64_t)t * cp + (c - l) * 2 + half * 16 + lane * 8 + l % 4 * 2;
      d[0] = w[(int64_t)t * cp + c];
      d[1] = t + 1 < taps ? w[(int64_t)(t + 1) * cp + c] : 0;
    }
}

/* vpdpbusd takes four u8 x s8 products per 32-bit lane: channel c's weights of kernel rows
 * 4 g .. 4 g + 3 (0 past kh) at column kw, as [group g][kw][cp][4]; the kernel reads 16 channels'
 * 64 bytes at once. Square kernels of 3 or 5 only (the column kernels' shapes). 0 where some weight
 * does not fit int8 (vpdpbusd's signed operand; the packer's w' always do, refcg.h's dw_w is int16),
 * and the caller keeps the int16 taps. */
REFCG_INLINE int64_t refcg_dw_quads_size(int32_t kh, int32_t kw, int32_t cp) { return (int64_t)(kh + 3) / 4 * kw * cp * 4; }

REFCG_INLINE int refcg_dw_quad_weights(const int16_t* w, int32_t kh, int32_t kw, int32_t cp, int8_t* out) {
  for (int64_t t = 0; t < (int64_t)kh * kw * cp; ++t)
    if (w[t] < -128 || w[t] > 127) return 0;
  for (int32_t g = 0; g < (kh + 3) / 4; ++g)
    for (int32_t x = 0; x < kw; ++x)
      for (int32_t c = 0; c < cp; ++c)
        for (int32_t r = 0; r < 4; ++r)
          out[(((int64_t)g * kw + x) * cp + c) * 4 + r] =
              4 * g + r < kh ? (int8_t)w[(int64_t)((4 * g + r) * kw + x) * cp + c] : (int8_t)0;
  return 1;
}

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

/* Padded row ph of a depthwise job's input. */
REFCG_INLINE const uint8_t* refcg_dw_row(const refcg_dw_job* j, int64_t ph) {
  return j->a + (ph - j->a_row0) * j->wp * j->cp;
}

/* Output rows [r0, r1), 16 channels at a time with the taps innermost; each ISA section
 * instantiates it with its own dw16 and epilogue. */
REFCG_INLINE void refcg_dw_rows(const refcg_dw_job* j, int64_t r0, int64_t r1,
                                                                refcg_dw16_fn dw16, refcg_epi_fn epi) {
  for (int64_t oh = r0; oh < r1; ++oh) {
    for (int32_t ow = 0; ow < j->out_w; ++ow) {
      const uint8_t* base = refcg_dw_row(j, oh * j->sh) + (int64_t)ow * j->sw * j->cp;
      for (int32_t c0 = 0; c0 < j->c; c0 += 16) {
        int32_t acc[16];
        dw16(j, base, c0, acc);
        epi(&j->epi, acc, c0, j->c - c0 < 16 ? j->c - c0 : 16, oh * j->o_h + ow * j->o_w);
      }
    }
  }
}

/* ---- depthwise conv on channel planes (planar input and output, NCHW) ----
 * Pixels go in the vector lanes. For each input row a variant "expands" the padded domain row
 * once: lane ow of group g holds the Q taps kw = g * Q + q of output pixel ow (bytes ow * sw +
 * (g * Q + q) * dw of the row) as one 32-bit lane: Q bytes (vpdpbusd, sdot, smull) or Q int16
 * (vpmaddwd).
 * An output row is then, per kernel row and group, one aligned load and one multiply-add per
 * 16 (or 8) pixels. Rows are expanded in strips of output rows into a stack buffer that stays
 * in L1; no workspace. */
#define REFCG_DWP_ROW 8192         /* bytes of padded input rows (each with its read slack) */
#define REFCG_DWP_EXPANDED 32768   /* bytes of the expanded rows of one strip */

typedef struct {
  const refcg_conv2d_params* p;
  const uint8_t* input;   /* one batch */
  int32_t pitch;          /* padded row bytes the expand step reads */
  uint8_t flip, pad;      /* domain flip of the input bytes, padding byte (izp in the domain) */
  int32_t mult;           /* channel multiplier: output channel oc reads input channel oc / mult */
  int32_t q, g;           /* taps per 32-bit lane, lane groups per kernel row */
  int32_t owp;            /* out_w rounded up to 16: lanes per expanded group */
  int32_t strip;          /* output rows per strip */
  int32_t ix[16];         /* expand, AVX-512: vpermd source dwords (lane k: bytes from 4 * k * sw) */
  uint8_t ctl[64];        /* expand: vpshufb / tbl control per 16 bytes (pixel j, tap q -> byte j * sw + q * dw) */
  const int16_t* w;       /* [kh*kw][cp] */
  int32_t cp;
  refcg_epi epi;          /* epi.out: this batch; o_c, o_h: output element strides (o_w == 1) */
  int64_t o_h;
} refcg_dwp_job;

/* Expand one padded row into g * owp 32-bit lanes. */
typedef void (*refcg_dwp_expand_fn)(const refcg_dwp_job* j, const uint8_t* row, int32_t* e);
/* Output rows [oh0, oh1) of output channel oc from expanded rows starting at padded row oh0 * sh. */
typedef void (*refcg_dwp_strip_fn)(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc,
                                   int32_t oh0, int32_t oh1);

/* Kernel-row taps of output channel oc, Q per 32-bit word as int8 (bits 8) or int16 (bits 16):
 * word kh * G + g holds taps kw = g * Q + q (zero past the kernel width). */
REFCG_INLINE void refcg_dwp_weights(const refcg_dwp_job* j, int32_t oc, int bits, int32_t* words) {
  const int32_t kh = j->p->kernel_h, kw = j->p->kernel_w, q = j->q;
  for (int32_t r = 0; r < kh; ++r)
    for (int32_t i = 0; i < j->g; ++i) {
      uint32_t word = 0;
      for (int32_t t = 0; t < q && i * q + t < kw; ++t)
        word |= ((uint32_t)j->w[(int64_t)(r * kw + i * q + t) * j->cp + oc] & ((1u << bits) - 1u)) << (bits * t);
      words[r * j->g + i] = (int32_t)word;
    }
}

/* dst[i] = src[i] ^ flip, 8 bytes at a time (GCC does not vectorize the byte loop: the
 * buffers may overlap as far as it knows). */
REFCG_INLINE void refcg_copy_flip(uint8_t* dst, const uint8_t* src, int64_t n, uint8_t flip) {
  const uint64_t f8 = 0x0101010101010101ULL * flip;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, src + i, 8);
    v ^= f8;
    memcpy(dst + i, &v, 8);
  }
  for (; i < n; ++i) dst[i] = (uint8_t)(src[i] ^ flip);
}

/* One padded row of pitch bytes: pad, in_w bytes of src (NULL: a padding row) ^ flip, pad. */
REFCG_INLINE void refcg_pad_row(uint8_t* row, const uint8_t* src, int32_t left, int32_t in_w, int32_t pitch,
                                uint8_t flip, uint8_t pad) {
  if (!src) {
    memset(row, pad, pitch);
    return;
  }
  memset(row, pad, left);
  refcg_copy_flip(row + left, src, in_w, flip);
  memset(row + left + in_w, pad, pitch - left - in_w);
}

/* Padded domain row r (pitch bytes) of input channel ic. */
REFCG_INLINE void refcg_dwp_row(const refcg_dwp_job* j, int32_t ic, int32_t r, uint8_t* row) {
  const refcg_conv2d_params* p = j->p;
  const int32_t ih = r - p->pad_top;
  const int inside = ih >= 0 && ih < p->in_h;
  refcg_pad_row(row, inside ? j->input + ic * p->in_stride[3] + ih * p->in_stride[1] : NULL, p->pad_left, p->in_w,
                j->pitch, j->flip, j->pad);
}

/* What a variant's blocks read: the expanded strip, weights, stride of a kernel row in lanes. */
typedef struct {
  const int32_t* e;
  const int32_t* words;
  int64_t row_step;
  int32_t kh, g, owp, oc;
  refcg_epi epi; /* a local copy: the byte stores may alias *j */
} refcg_dwp_strip;

/* nb (1 to 4) blocks of `width` pixels: lanes from e + lane_off, outputs at out_off, n valid. */
typedef void (*refcg_dwp_blocks_fn)(const refcg_dwp_strip* s, const void* k, int64_t lane_off, int64_t out_off,
                                    int32_t n, int32_t nb);

/* fn(..., NB) with NB the compile-time constant nb (1 to 4), for unrolled block loops. */
#define REFCG_NB_SWITCH(nb, fn, ...)           \
  do {                                          \
    switch (nb) {                               \
      case 4: fn(__VA_ARGS__, 4); break;        \
      case 3: fn(__VA_ARGS__, 3); break;        \
      case 2: fn(__VA_ARGS__, 2); break;        \
      default: fn(__VA_ARGS__, 1); break;       \
    }                                           \
  } while (0)

/* Output rows [oh0, oh1) of output channel oc, 4 blocks at a time (independent accumulators). */
REFCG_INLINE void refcg_dwp_walk(const refcg_dwp_job* j, const refcg_dwp_strip* s, const void* k, int32_t oh0,
                                 int32_t oh1, int32_t width, refcg_dwp_blocks_fn blocks) {
  const int32_t out_w = j->p->out_w;
  const int64_t lanes = (int64_t)s->g * s->owp, o_h = j->o_h, o_c = s->epi.o_c, sh = j->p->stride_h;
  for (int32_t oh = oh0; oh < oh1; ++oh) {
    const int64_t lane_off = (oh - oh0) * sh * lanes, off = s->oc * o_c + oh * o_h;
    int32_t ow = 0;
    for (; ow + 3 * width < out_w; ow += 4 * width) blocks(s, k, lane_off + ow, off + ow, out_w - ow, 4);
    if (ow < out_w) blocks(s, k, lane_off + ow, off + ow, out_w - ow, (out_w - ow + width - 1) / width);
  }
}

REFCG_INLINE refcg_dwp_strip refcg_dwp_strip_of(const refcg_dwp_job* j, const int32_t* e, const int32_t* words, int32_t oc) {
  const refcg_dwp_strip s = {e, words, (int64_t)j->g * j->owp * j->p->dilation_h, j->p->kernel_h, j->g, j->owp, oc,
                             j->epi};
  return s;
}

/* Input channels [c0, c1), strip by strip: expand the rows, then every output channel reading them. */
REFCG_INLINE void refcg_dwp_channels(const refcg_dwp_job* j, int64_t c0, int64_t c1, int bits,
                                     refcg_dwp_expand_fn expand, refcg_dwp_strip_fn strip) {
  const refcg_conv2d_params* p = j->p;
  uint8_t row[REFCG_DWP_ROW] __attribute__((aligned(64)));
  int32_t e[REFCG_DWP_EXPANDED / 4] __attribute__((aligned(64)));
  int32_t words[256];
  const int64_t lanes = (int64_t)j->g * j->owp;
  for (int64_t ic = c0; ic < c1; ++ic) {
    for (int32_t oh0 = 0; oh0 < p->out_h; oh0 += j->strip) {
      const int32_t oh1 = oh0 + j->strip < p->out_h ? oh0 + j->strip : p->out_h;
      const int32_t r0 = oh0 * p->stride_h, r1 = (oh1 - 1) * p->stride_h + (p->kernel_h - 1) * p->dilation_h + 1;
      /* rows in batches, built before any is expanded: the expand step's wide loads would not
       * forward from the narrow stores of a row just written, and stall */
      const int32_t batch = REFCG_DWP_ROW / j->pitch;
      for (int32_t b0 = r0; b0 < r1; b0 += batch) {
        const int32_t b1 = b0 + batch < r1 ? b0 + batch : r1;
        for (int32_t r = b0; r < b1; ++r) refcg_dwp_row(j, (int32_t)ic, r, row + (int64_t)(r - b0) * j->pitch);
        for (int32_t r = b0; r < b1; ++r) expand(j, row + (int64_t)(r - b0) * j->pitch, e + (r - r0) * lanes);
      }
      for (int32_t m = 0; m < j->mult; ++m) {
        const int32_t oc = (int32_t)ic * j->mult + m;
        refcg_dwp_weights(j, oc, bits, words);
        strip(j, e, words, oc, oh0, oh1);
      }
    }
  }
}

/* ---- qnn.add / subtract / mul over rows of the innermost dimension ----
 * Dimensions of size 1 are dropped and dimensions contiguous in a, b and out merged, so the
 * innermost run is as long as possible; its a and b strides are 0 (broadcast) or 1. */
typedef struct {
  const refcg_binary_params* p;
  const uint8_t* a;
  const uint8_t* b;
  uint8_t* out;
  int32_t ndim;
  int64_t shape[REFCG_MAX_DIMS], as[REFCG_MAX_DIMS], bs[REFCG_MAX_DIMS];
} refcg_bin_job;

/* n elements of one row: a at element ia (stride j->as[ndim-1]), b at ib, out at io (contiguous). */
typedef void (*refcg_bin_row_fn)(const refcg_bin_job* j, const void* k, int64_t ia, int64_t ib, int64_t io, int64_t n);

/* Merged dimensions of p; returns the rows (product of all but the innermost). */
REFCG_INLINE int64_t refcg_bin_merge(const refcg_binary_params* p, refcg_bin_job* j) {
  int32_t nd = 0;
  for (int32_t d = 0; d < p->ndim; ++d) {
    if (p->shape[d] == 1) continue;
    if (nd > 0 && j->as[nd - 1] == p->a_stride[d] * p->shape[d] && j->bs[nd - 1] == p->b_stride[d] * p->shape[d]) {
      j->shape[nd - 1] *= p->shape[d]; /* outer dimension d-1 continues into d: one dimension */
      j->as[nd - 1] = p->a_stride[d];
      j->bs[nd - 1] = p->b_stride[d];
      continue;
    }
    j->shape[nd] = p->shape[d];
    j->as[nd] = p->a_stride[d];
    j->bs[nd] = p->b_stride[d];
    ++nd;
  }
  if (nd == 0) { /* a single element */
    j->shape[0] = 1;
    j->as[0] = j->bs[0] = 0;
    nd = 1;
  }
  j->ndim = nd;
  int64_t rows = 1;
  for (int32_t d = 0; d + 1 < nd; ++d) rows *= j->shape[d];
  return rows;
}

/* Rows are split into chunks of REFCG_BIN_CHUNK elements, so one long row (a residual add of
 * two same-shape tensors merges into one) still spreads over threads. */
#define REFCG_BIN_CHUNK 4096
REFCG_INLINE int64_t refcg_bin_chunks(const refcg_bin_job* j, int64_t rows) {
  return rows * ((j->shape[j->ndim - 1] + REFCG_BIN_CHUNK - 1) / REFCG_BIN_CHUNK);
}

/* ---- qnn.requantize of an 8-bit or int32 tensor per tensor (refcg_requantize_params): rows of channels *
 * inner elements, contiguous in the input, at out_outer_stride in the output (the slab of a
 * concatenation), in chunks of REFCG_BIN_CHUNK elements (task t: row t / chunks) ---- */
typedef struct {
  const refcg_requantize_params* p;
  const uint8_t* in;
  uint8_t* out;
  int64_t n, chunks; /* elements per row, chunks per row */
} refcg_rq_job;

/* ---- sum / mean (refcg_reduce_params): chunks of up to REFCG_REDUCE_CHUNK inner elements, every
 * input row of a chunk added into int32 lanes by a loop per dtype the compiler vectorizes (the
 * reference reads element by element through a dtype switch); a contiguous run (inner 1) is one
 * vectorized sum. Sums wrap in uint32 and means truncate, as in refcg_reduce_ref. Compiled in each
 * variant's section (refcg_isa_config.reduce), vectorized for its ISA. ---- */
#define REFCG_REDUCE_CHUNK 256
typedef struct {
  const refcg_reduce_params* p;
  const void* in;
  void* out;
  int64_t chunks; /* per outer index */
} refcg_reduce_job;

/* The statements after `in, at` once per input dtype, with x_ the typed pointer to element `at`. */
#define REFCG_REDUCE_TYPED(dtype, in, at, ...)                                                \
  switch (dtype) {                                                                           \
    case REFCG_S8: { const int8_t* x_ = (const int8_t*)(in) + (at); __VA_ARGS__; } break;    \
    case REFCG_U8: { const uint8_t* x_ = (const uint8_t*)(in) + (at); __VA_ARGS__; } break;  \
    case REFCG_S16: { const int16_t* x_ = (const int16_t*)(in) + (at); __VA_ARGS__; } break; \
    default: { const int32_t* x_ = (const int32_t*)(in) + (at); __VA_ARGS__; } break;        \
  }

/* acc[0, n) += the n elements at element index at (a loop per dtype, which the compiler vectorizes) */
REFCG_INLINE void refcg_reduce_add(const refcg_reduce_params* p, const void* in, int64_t at, uint32_t* acc, int64_t n) {
  REFCG_REDUCE_TYPED(p->in_dtype, in, at, for (int64_t i = 0; i < n; ++i) acc[i] += (uint32_t)(int32_t)x_[i])
}

/* the sum of the n elements at element index at */
REFCG_INLINE uint32_t refcg_reduce_run(const refcg_reduce_params* p, const void* in, int64_t at, int64_t n) {
  uint32_t sum = 0;
  REFCG_REDUCE_TYPED(p->in_dtype, in, at, for (int64_t i = 0; i < n; ++i) sum += (uint32_t)(int32_t)x_[i])
  return sum;
}

REFCG_INLINE void refcg_reduce_store(const refcg_reduce_params* p, void* out, int64_t i, uint32_t sum) {
  int32_t v = (int32_t)sum;
  if (p->is_mean) v /= (int32_t)p->reduce;
  refcg_store(out, i, p->out_dtype, v);
}

/* acc[0, d) += rows [0, rows) of the first d of n 8-bit lanes (int8 where is_signed, else uint8) stride
 * bytes apart; returns d (the lanes its register blocks cover; refcg_reduce_add takes the rest): a
 * variant's sums kept in registers while the rows stream by (the compiler's loop over acc[] loaded and
 * stored every sum once per row, ~4 bytes per cycle); n <= REFCG_REDUCE_CHUNK, acc that long. */
typedef int64_t (*refcg_reduce_rows8_fn)(const uint8_t* x, int64_t stride, int64_t rows, int is_signed, uint32_t* acc,
                                         int64_t n);

REFCG_INLINE void refcg_reduce_run_chunks(const refcg_reduce_job* j, int64_t t0, int64_t t1, refcg_reduce_rows8_fn rows8) {
  const refcg_reduce_params* p = j->p;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t o = t / j->chunks;
    if (p->inner == 1) {
      refcg_reduce_store(p, j->out, o, refcg_reduce_run(p, j->in, o * p->reduce, p->reduce));
      continue;
    }
    const int64_t i0 = t % j->chunks * REFCG_REDUCE_CHUNK;
    const int64_t n = p->inner - i0 < REFCG_REDUCE_CHUNK ? p->inner - i0 : REFCG_REDUCE_CHUNK;
    /* a short inner axis (squeeze-excite's mean over the pixels of 16..96 channels): m consecutive rows
     * are one contiguous run, added as one wide row of m * n lanes and folded at the end */
    const int64_t m = p->inner == n ? REFCG_REDUCE_CHUNK / n : 1, wide = m * n, rows = p->reduce / m;
    uint32_t acc[REFCG_REDUCE_CHUNK] = {0};
    const int64_t at = o * p->reduce * p->inner + i0;
    const int64_t done = rows8 && refcg_is_8bit(p->in_dtype)
                             ? rows8((const uint8_t*)j->in + at, m * p->inner, rows, p->in_dtype == REFCG_S8, acc, wide)
                             : 0;
    for (int64_t r = 0; r < rows && done < wide; ++r)
      refcg_reduce_add(p, j->in, at + r * m * p->inner + done, acc + done, wide - done);
    for (int64_t r = rows * m; r < p->reduce; ++r) refcg_reduce_add(p, j->in, at + r * p->inner, acc, n);
    for (int64_t k = 1; k < m; ++k)
      for (int64_t i = 0; i < n; ++i) acc[i] += acc[k * n + i];
    for (int64_t i = 0; i < n; ++i) refcg_reduce_store(p, j->out, o * p->inner + i0 + i, acc[i]);
  }
}

/* ---- 256-entry table lookups (refcg_lut_params): chunks of REFCG_BIN_CHUNK bytes of each output row ---- */
typedef struct {
  const uint8_t* table; /* out_xor applied */
  const uint8_t* in;
  uint8_t* out;
  int64_t row_len, out_stride, chunks; /* chunks per row */
} refcg_lut_job;

/* A variant's lookup of n contiguous bytes. */
typedef void (*refcg_lut_bytes_fn)(const uint8_t* table, const uint8_t* in, uint8_t* out, int64_t n);

/* Tasks [t0, t1) of j (task t: chunk t % chunks of row t / chunks) through bytes. */
REFCG_INLINE void refcg_lut_tasks(const refcg_lut_job* j, int64_t t0, int64_t t1, refcg_lut_bytes_fn bytes) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / j->chunks, i0 = t % j->chunks * REFCG_BIN_CHUNK;
    const int64_t n = j->row_len - i0 < REFCG_BIN_CHUNK ? j->row_len - i0 : REFCG_BIN_CHUNK;
    bytes(j->table, j->in + row * j->row_len + i0, j->out + row * j->out_stride + i0, n);
  }
}

/* Task t's elements [*i0, *i1) of its row; returns the row. */
REFCG_INLINE int64_t refcg_rq_chunk(const refcg_rq_job* j, int64_t t, int64_t* i0, int64_t* i1) {
  if (j->chunks == 1) { /* rows of a concatenation's slab: no divisions */
    *i0 = 0;
    *i1 = j->n;
    return t;
  }
  *i0 = t % j->chunks * REFCG_BIN_CHUNK;
  *i1 = *i0 + REFCG_BIN_CHUNK < j->n ? *i0 + REFCG_BIN_CHUNK : j->n;
  return t / j->chunks;
}

/* The output range of binary op p: mul's is its product's requantize's (rq_a clamps), add/subtract's p's. */
REFCG_INLINE void refcg_bin_out_range(const refcg_binary_params* p, int32_t* lo, int32_t* hi) {
  const int mul = p->op == REFCG_BIN_MUL;
  *lo = mul ? p->rq_a.out_min : p->out_min;
  *hi = mul ? p->rq_a.out_max : p->out_max;
}

/* add/subtract: an operand's requantize clamps to less than the int32 range (refcodegen plans int32
 * operands, whose clamp the vector kernels skip; a C caller may narrow it). */
REFCG_INLINE int refcg_bin_clamps_operands(const refcg_binary_params* p) {
  return p->op != REFCG_BIN_MUL && (p->rq_a.out_min != INT32_MIN || p->rq_a.out_max != INT32_MAX ||
                                    p->rq_b.out_min != INT32_MIN || p->rq_b.out_max != INT32_MAX);
}

/* Chunks [t0, t1): offsets of the first row from its index, then an odometer. */
REFCG_INLINE void refcg_bin_rows(const refcg_bin_job* j, const void* k, int64_t t0, int64_t t1, refcg_bin_row_fn row) {
  const int32_t nd = j->ndim;
  const int64_t n = j->shape[nd - 1], per_row = (n + REFCG_BIN_CHUNK - 1) / REFCG_BIN_CHUNK;
  int64_t index[REFCG_MAX_DIMS] = {0}, ia = 0, ib = 0, r = t0 / per_row, rem = r;
  for (int32_t d = nd - 2; d >= 0; --d) {
    index[d] = rem % j->shape[d];
    rem /= j->shape[d];
    ia += index[d] * j->as[d];
    ib += index[d] * j->bs[d];
  }
  for (int64_t t = t0; t < t1; ++t) {
    if (t / per_row != r) { /* next row */
      ++r;
      for (int32_t d = nd - 2; d >= 0; --d) {
        ia += j->as[d];
        ib += j->bs[d];
        if (++index[d] < j->shape[d]) break;
        ia -= j->as[d] * j->shape[d];
        ib -= j->bs[d] * j->shape[d];
        index[d] = 0;
      }
    }
    const int64_t e0 = t % per_row * REFCG_BIN_CHUNK, e1 = e0 + REFCG_BIN_CHUNK < n ? e0 + REFCG_BIN_CHUNK : n;
    row(j, k, ia + e0 * j->as[nd - 1], ib + e0 * j->bs[nd - 1], r * n + e0, e1 - e0);
  }
}

/* ---- max / avg pool on channel planes (planar input and output, 8-bit input) ----
 * Portable C that GCC vectorizes for the ISA section it is inlined into: per output row and
 * kernel row, the padded row is split by stride phase (phase f holds bytes f, f + sw, ...), so
 * every tap is a contiguous run of output pixels. Bytes are in the uint8 domain (x ^ flip), where
 * max commutes with the flip and an average subtracts 128 per tap. */
#define REFCG_POOL_MAX_W 2048 /* output pixels per row of the vector path */
typedef struct {
  const refcg_pool2d_params* p;
  const uint8_t* in;
  void* out;
  int32_t pitch, phase_w;  /* planes: padded row bytes, bytes per stride phase */
  uint8_t flip, pad;       /* pad: dtype minimum (max pool) or 0 (avg) in the domain */
  int32_t nhwc;            /* channels last in and out: tasks are output rows, not planes */
} refcg_pool_job;

/* Taps of kernel extent k at output position o inside [lo, hi) of the input axis (start - pad). */
REFCG_INLINE int32_t refcg_pool_count(int32_t o, int32_t stride, int32_t pad, int32_t k, int32_t dil, int32_t lo,
                                      int32_t hi) {
  int32_t n = 0;
  for (int32_t t = 0; t < k; ++t) {
    const int32_t i = o * stride - pad + t * dil;
    n += i >= lo && i < hi;
  }
  return n;
}

/* The input bounds refcg_pool_count counts an average's taps inside: the input, or with its padding. */
REFCG_INLINE void refcg_pool_bounds(const refcg_pool2d_params* p, int32_t* lo_h, int32_t* hi_h, int32_t* lo_w,
                                    int32_t* hi_w) {
  const int32_t incl = p->is_avg && p->count_include_pad;
  *lo_h = incl ? -p->pad_top : 0;
  *hi_h = incl ? p->in_h + p->pad_bottom : p->in_h;
  *lo_w = incl ? -p->pad_left : 0;
  *hi_w = incl ? p->in_w + p->pad_right : p->in_w;
}

REFCG_INLINE void refcg_pool_planes(const refcg_pool_job* j, int64_t q0, int64_t q1) {
  const refcg_pool2d_params* p = j->p;
  uint8_t row[REFCG_DWP_ROW], phases[REFCG_DWP_ROW];
  uint32_t acc[REFCG_POOL_MAX_W];
  float colw[REFCG_POOL_MAX_W]; /* avg: taps per output column */
  const int32_t ow_n = p->out_w, sw = p->stride_w, avg = p->is_avg, pw = j->phase_w;
  int32_t lo_h, hi_h, lo_w, hi_w;
  refcg_pool_bounds(p, &lo_h, &hi_h, &lo_w, &hi_w);
  for (int32_t ow = 0; ow < ow_n; ++ow)
    colw[ow] = (float)refcg_pool_count(ow, sw, p->pad_left, p->kernel_w, p->dilation_w, lo_w, hi_w);
  const uint32_t bias = j->flip ? 128u * (uint32_t)(p->kernel_h * p->kernel_w) : 0u;
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t n = q / p->channels, c = q % p->channels;
    const uint8_t* src = j->in + n * p->in_stride[0] + c * p->in_stride[3];
    const int64_t obase = n * p->out_stride[0] + c * p->out_stride[3];
    for (int32_t oh = 0; oh < p->out_h; ++oh) {
      for (int32_t ow = 0; ow < ow_n; ++ow) acc[ow] = 0;
      for (int32_t kh = 0; kh < p->kernel_h; ++kh) {
        const int32_t ih = oh * p->stride_h - p->pad_top + kh * p->dilation_h;
        refcg_pad_row(row, ih >= 0 && ih < p->in_h ? src + ih * p->in_stride[1] : NULL, p->pad_left, p->in_w, j->pitch,
                      j->flip, j->pad);
        for (int32_t f = 0; f < sw; ++f)
          for (int32_t x = 0; x < pw; ++x) phases[f * pw + x] = row[f + x * sw];
        for (int32_t kw = 0; kw < p->kernel_w; ++kw) {
          const int32_t off = kw * p->dilation_w;
          const uint8_t* __restrict t = phases + (off % sw) * pw + off / sw;
          uint32_t* __restrict a = acc;
          if (avg)
            for (int32_t ow = 0; ow < ow_n; ++ow) a[ow] += t[ow];
          else
            for (int32_t ow = 0; ow < ow_n; ++ow) a[ow] = a[ow] > t[ow] ? a[ow] : t[ow];
        }
      }
      const int64_t o = obase + oh * p->out_stride[1];
      if (avg) { /* sum / count truncated: float32 division is exact here (|sum| < 2^24) */
        const float rows = (float)refcg_pool_count(oh, p->stride_h, p->pad_top, p->kernel_h, p->dilation_h, lo_h, hi_h);
        for (int32_t ow = 0; ow < ow_n; ++ow) {
          const float count = rows * colw[ow];
          acc[ow] = (uint32_t)(int32_t)((float)(int32_t)(acc[ow] - bias) / (count > 0.0f ? count : 1.0f));
        }
      } else {
        for (int32_t ow = 0; ow < ow_n; ++ow) acc[ow] ^= j->flip;
      }
      if (p->out_dtype == REFCG_S32) {
        int32_t* __restrict d = (int32_t*)j->out + o;
        for (int32_t ow = 0; ow < ow_n; ++ow) d[ow] = (int32_t)acc[ow];
      } else { /* the low byte: max pool values are bytes, averages of bytes fit the dtype */
        uint8_t* __restrict d = (uint8_t*)j->out + o;
        for (int32_t ow = 0; ow < ow_n; ++ow) d[ow] = (uint8_t)acc[ow];
      }
    }
  }
}

/* ---- pools of a channels-last input (channel stride 1); tasks are output rows n * out_h + oh ---- */
#define REFCG_POOL_CB 256 /* channels per pass of refcg_pool_pixel */

/* The statement (the variadic part) for each tap of output pixel (oh, ow) of pool p inside the
 * input, with x the tap's pixel (channel 0) in image in. */
#define REFCG_POOL_TAPS_INSIDE(p, in, oh, ow, x, ...)                                             \
  for (int32_t kh_ = 0; kh_ < (p)->kernel_h; ++kh_) {                                           \
    const int32_t ih_ = (oh) * (p)->stride_h - (p)->pad_top + kh_ * (p)->dilation_h;            \
    if (ih_ < 0 || ih_ >= (p)->in_h) continue;                                                  \
    for (int32_t kw_ = 0; kw_ < (p)->kernel_w; ++kw_) {                                         \
      const int32_t iw_ = (ow) * (p)->stride_w - (p)->pad_left + kw_ * (p)->dilation_w;         \
      if (iw_ < 0 || iw_ >= (p)->in_w) continue;                                                \
      const uint8_t* __restrict x = (in) + ih_ * (p)->in_stride[1] + iw_ * (p)->in_stride[2];   \
      __VA_ARGS__                                                                               \
    }                                                                                           \
  }

/* The taps of a kernel the vector pixel kernels take: a list of them per pixel; an average's |sum|
 * <= taps * 255 fits int16 lanes. */
#define REFCG_POOL_VEC_TAPS 128

/* The vector kernels' average: trunc(sum * (1 / div) + copysign(REFCG_POOL_AWAY, sum)) in float32, no
 * division. |sum / div| <= 255 (div counts at least the taps summed), so the product is within 2^-15
 * of the quotient, whose fraction is 0 or at least 1 / div >= 2^-7 from either integer: the truncation
 * is C's truncating sum / div, what refcg_pool_pixel's float division gives. */
#define REFCG_POOL_AWAY (1.0f / 1024.0f) /* 2^-10 */

/* One output pixel of a channels-last pool. */
typedef struct {
  const uint8_t* image;
  int32_t oh, ow;
  const uint8_t* in;   /* taps[t] bytes from in: its taps inside the input (ntaps; none past REFCG_POOL_VEC_TAPS) */
  const int64_t* taps;
  int32_t ntaps;
  uint8_t* out;        /* its channel 0 (a byte address) */
  float div;           /* an average's divisor: its tap count, 1 where there is none */
} refcg_pool_px;
typedef void (*refcg_pool_pixel_fn)(const refcg_pool_job* j, const refcg_pool_px* px);

/* pixel(j, px) for each output pixel of rows [r0, r1) (n * out_h + oh) of a channels-last pool. With
 * LISTS (for pixel kernels that read them), a window inside the input shares one tap list (offsets from
 * its first tap) and one at the border gets the list of its taps inside. */
REFCG_INLINE void refcg_pool_pixels(const refcg_pool_job* j, int64_t r0, int64_t r1, refcg_pool_pixel_fn pixel,
                                    const int LISTS) {
  const refcg_pool2d_params* p = j->p;
  const int64_t es = p->out_dtype == REFCG_S32 ? 4 : 1, rs = p->in_stride[1], ps = p->in_stride[2];
  const int32_t kh = p->kernel_h, kw = p->kernel_w, list = LISTS && kh * kw <= REFCG_POOL_VEC_TAPS;
  const int32_t reach_h = (kh - 1) * p->dilation_h, reach_w = (kw - 1) * p->dilation_w;
  int32_t lo_h, hi_h, lo_w, hi_w;
  refcg_pool_bounds(p, &lo_h, &hi_h, &lo_w, &hi_w);
  int64_t window[REFCG_POOL_VEC_TAPS], border[REFCG_POOL_VEC_TAPS];
  for (int32_t t = 0; list && t < kh * kw; ++t) window[t] = t / kw * p->dilation_h * rs + t % kw * p->dilation_w * ps;
  refcg_pool_px px = {NULL, 0, 0, NULL, NULL, 0, NULL, 1.0f};
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t n = (int32_t)(r / p->out_h), oh = (int32_t)(r % p->out_h), ih = oh * p->stride_h - p->pad_top;
    const int32_t rows = p->is_avg ? refcg_pool_count(oh, p->stride_h, p->pad_top, kh, p->dilation_h, lo_h, hi_h) : 0;
    px.image = j->in + n * p->in_stride[0];
    px.oh = oh;
    for (px.ow = 0; px.ow < p->out_w; ++px.ow) {
      const int32_t iw = px.ow * p->stride_w - p->pad_left;
      px.out = (uint8_t*)j->out + (n * p->out_stride[0] + px.oh * p->out_stride[1] + px.ow * p->out_stride[2]) * es;
      if (p->is_avg) {
        const int32_t count = rows * refcg_pool_count(px.ow, p->stride_w, p->pad_left, kw, p->dilation_w, lo_w, hi_w);
        px.div = (float)(count > 0 ? count : 1);
      }
      if (!list) {
        px.ntaps = 0;
      } else if (ih >= 0 && ih + reach_h < p->in_h && iw >= 0 && iw + reach_w < p->in_w) {
        px.in = px.image + ih * rs + iw * ps;
        px.taps = window;
        px.ntaps = kh * kw;
      } else {
        px.in = px.image;
        px.taps = border;
        px.ntaps = 0;
        REFCG_POOL_TAPS_INSIDE(p, px.image, px.oh, px.ow, x, { border[px.ntaps++] = x - px.image; })
      }
      pixel(j, &px);
    }
  }
}

/* Channels [first, channels) of a pixel of refcg_pool_pixels (first: a vector kernel's tail) in loops
 * the section's ISA vectorizes, REFCG_POOL_CB channels at a time: a max of bytes in the unsigned domain
 * (int8 XOR 0x80, where the dtype minimum is 0), or int32 sums divided in float32 (|sum| < 2^24: the
 * division truncates exactly, as refcg_pool_planes'). The output is stored at its channel stride (1:
 * channels last; else the planes of a layout change). */
REFCG_INLINE void refcg_pool_pixel_from(const refcg_pool_job* j, const refcg_pool_px* px, int64_t first) {
  const refcg_pool2d_params* p = j->p;
  const uint8_t* in = px->image;
  uint8_t* out = px->out;
  const float div = px->div;
  const int32_t avg = p->is_avg, s8 = p->in_dtype == REFCG_S8;
  const uint8_t flip = j->flip;
  const int64_t os = p->out_stride[3];
  int32_t acc[REFCG_POOL_CB];
  uint8_t top[REFCG_POOL_CB];
  for (int64_t c0 = first; c0 < p->channels; c0 += REFCG_POOL_CB) {
    const int32_t nc = (int32_t)(p->channels - c0 < REFCG_POOL_CB ? p->channels - c0 : REFCG_POOL_CB);
    if (avg)
      for (int32_t c = 0; c < nc; ++c) acc[c] = 0;
    else
      for (int32_t c = 0; c < nc; ++c) top[c] = 0;
    REFCG_POOL_TAPS_INSIDE(p, in + c0, px->oh, px->ow, x, {
      if (!avg) {
        for (int32_t c = 0; c < nc; ++c) {
          const uint8_t v = (uint8_t)(x[c] ^ flip);
          top[c] = v > top[c] ? v : top[c];
        }
      } else if (s8) {
        for (int32_t c = 0; c < nc; ++c) acc[c] += (int8_t)x[c];
      } else {
        for (int32_t c = 0; c < nc; ++c) acc[c] += x[c];
      }
    })
    if (!avg && os == 1) { /* bytes to bytes */
      uint8_t* __restrict d = out + c0;
      for (int32_t c = 0; c < nc; ++c) d[c] = (uint8_t)(top[c] ^ flip);
      continue;
    }
    if (!avg) {
      for (int32_t c = 0; c < nc; ++c) acc[c] = top[c] ^ flip;
    } else {
      for (int32_t c = 0; c < nc; ++c) acc[c] = (int32_t)((float)acc[c] / div);
    }
    if (p->out_dtype == REFCG_S32) {
      int32_t* __restrict d = (int32_t*)out + c0 * os;
      for (int32_t c = 0; c < nc; ++c) d[c * os] = acc[c];
    } else { /* max pool bytes and averages of bytes fit the dtype: the low byte */
      uint8_t* __restrict d = out + c0 * os;
      for (int32_t c = 0; c < nc; ++c) d[c * os] = (uint8_t)acc[c];
    }
  }
}

/* All channels of the pixel: refcg_pool_pixel_fn. */
REFCG_INLINE void refcg_pool_pixel(const refcg_pool_job* j, const refcg_pool_px* px) { refcg_pool_pixel_from(j, px, 0); }

/* refcg_pool_##SFX, a section's pool: its pixel kernels refcg_pool_pixel_##SFX(..., MAX, S8, S32) (a max
 * pool, or an average of int8 (S8) or uint8 into int32 (S32) or bytes) where they apply (channels last
 * in and out, kernels of up to REFCG_POOL_VEC_TAPS taps), refcg_pool_run elsewhere. */
#define REFCG_DEFINE_POOL_PIXELS(SFX)                                                                              \
  REFCG_POOL_PIXEL_CASE(SFX, max, 1, 0, 0)                                                                         \
  REFCG_POOL_PIXEL_CASE(SFX, avg_u8, 0, 0, 0)                                                                      \
  REFCG_POOL_PIXEL_CASE(SFX, avg_s8, 0, 1, 0)                                                                      \
  REFCG_POOL_PIXEL_CASE(SFX, avg_u8_s32, 0, 0, 1)                                                                  \
  REFCG_POOL_PIXEL_CASE(SFX, avg_s8_s32, 0, 1, 1)                                                                  \
  static void refcg_pool_##SFX(const void* ctx, int64_t q0, int64_t q1) {                                          \
    const refcg_pool_job* j = (const refcg_pool_job*)ctx;                                                          \
    const refcg_pool2d_params* p = j->p;                                                                           \
    static const refcg_pool_pixel_fn avg[2][2] = {{refcg_pool_avg_u8_##SFX, refcg_pool_avg_u8_s32_##SFX},          \
                                                  {refcg_pool_avg_s8_##SFX, refcg_pool_avg_s8_s32_##SFX}};         \
    if (!j->nhwc || p->out_stride[3] != 1 || p->kernel_h * p->kernel_w > REFCG_POOL_VEC_TAPS)                      \
      refcg_pool_run(j, q0, q1); /* vectorized for this section's ISA */                                          \
    else if (!p->is_avg)                                                                                           \
      refcg_pool_pixels(j, q0, q1, refcg_pool_max_##SFX, 1);                                                       \
    else                                                                                                           \
      refcg_pool_pixels(j, q0, q1, avg[p->in_dtype == REFCG_S8][p->out_dtype == REFCG_S32], 1);                    \
  }
#define REFCG_POOL_PIXEL_CASE(SFX, KIND, MAX, S8, S32)                                                             \
  static void refcg_pool_##KIND##_##SFX(const refcg_pool_job* j, const refcg_pool_px* px) {                       \
    refcg_pool_pixel_##SFX(j, px, MAX, S8, S32);                                                                   \
  }

/* A pool job's tasks [q0, q1): planes, or rows channels last. */
REFCG_INLINE void refcg_pool_run(const refcg_pool_job* j, int64_t q0, int64_t q1) {
  if (j->nhwc)
    refcg_pool_pixels(j, q0, q1, refcg_pool_pixel, 0); /* it walks the taps itself */
  else
    refcg_pool_planes(j, q0, q1);
}

/* ---- qnn.quantize: rows of [outer * channels][inner] in chunks (what the threads share) ---- */
#define REFCG_QUANT_CHUNK 4096
typedef struct {
  const refcg_quantize_params* p;
  const float* in;
  uint8_t* out;
  int64_t chunks_per_row;
} refcg_quant_job;

/* Chunk t: the channel of its row and its elements [*i0, *i1). */
REFCG_INLINE int64_t refcg_quant_chunk(const refcg_quant_job* j, int64_t t, int64_t* i0, int64_t* i1) {
  const int64_t row = t / j->chunks_per_row, row_end = (row + 1) * j->p->inner;
  *i0 = row * j->p->inner + t % j->chunks_per_row * REFCG_QUANT_CHUNK;
  *i1 = *i0 + REFCG_QUANT_CHUNK < row_end ? *i0 + REFCG_QUANT_CHUNK : row_end;
  return row % j->p->channels;
}

/* ---- 8-bit gathers along the last axis (refcg_copy): every output row reads its input row, found by
 * plain strides on the outer axes, through the same index table ---- */
#define REFCG_GATHER_MAX 1024 /* longest input and output row */
#define REFCG_GATHER_ROWS 64  /* rows per task */
#define REFCG_GATHER_W16 4    /* most 16-byte input windows a 16-byte output chunk may read (by16) */
typedef struct {
  const refcg_copy_params* p;
  const uint8_t* in;
  uint8_t* out;
  int64_t rows, n, size; /* output rows, their length, the input row's length */
  uint8_t idx[REFCG_GATHER_MAX]; /* take[i] % 128 (0 past n): a byte index into a 128-byte window */
  /* lanes of 64-byte output chunk k that read 128-byte input window w */
  uint64_t window[REFCG_GATHER_MAX / 64][REFCG_GATHER_MAX / 128];
  /* by16 (16-byte table lookups: vpshufb, tbl): 16-byte output chunk k ORs nwin16[k] windows, window w the 16
   * input bytes from win16_at[k][w], lane l taking its byte win16_idx[k][w][l] (0x80: none: a lane of
   * another window). 0 where a chunk reads more windows, a row is shorter than 16 bytes, or the variant
   * does not read them (refcg_isa_config.gather_by16). */
  int32_t by16;
  uint8_t nwin16[REFCG_GATHER_MAX / 16];
  int16_t win16_at[REFCG_GATHER_MAX / 16][REFCG_GATHER_W16];
  uint8_t win16_idx[REFCG_GATHER_MAX / 16][REFCG_GATHER_W16][16];
} refcg_gather_job;

/* The input offset of output row r, and its index on the outer axes for refcg_gather_next. */
REFCG_INLINE int64_t refcg_gather_first(const refcg_copy_params* p, int64_t r, int64_t* index) {
  int64_t at = p->offset;
  for (int32_t k = p->ndim - 2; k >= 0; --k) {
    index[k] = r % p->out_shape[k];
    r /= p->out_shape[k];
    at += index[k] * p->in_stride[k];
  }
  return at;
}

/* The input offset of the row after the one at `at` (an odometer over the outer axes). */
REFCG_INLINE int64_t refcg_gather_next(const refcg_copy_params* p, int64_t at, int64_t* index) {
  for (int32_t k = p->ndim - 2; k >= 0; --k) {
    at += p->in_stride[k];
    if (++index[k] < p->out_shape[k]) break;
    at -= p->in_stride[k] * p->out_shape[k];
    index[k] = 0;
  }
  return at;
}

/* The output rows [*r0, *r1) of gather row tasks [t0, t1) (REFCG_GATHER_ROWS rows each). */
REFCG_INLINE void refcg_gather_range(const refcg_gather_job* j, int64_t t0, int64_t t1, int64_t* r0, int64_t* r1) {
  *r0 = t0 * REFCG_GATHER_ROWS;
  *r1 = t1 * REFCG_GATHER_ROWS < j->rows ? t1 * REFCG_GATHER_ROWS : j->rows;
}

/* 16-byte output chunk k of a row of gather j read from input row in, into dst (16 bytes): the OR of
 * its windows (refcg_gather_job.by16) shuffled by a variant's 16-byte table lookup. */
typedef void (*refcg_gather_chunk_fn)(const refcg_gather_job* j, const uint8_t* in, int64_t k, uint8_t* dst);

/* Rows [r0, r1) of gather j by its 16-byte windows through chunk; a last partial chunk stored through a
 * buffer, not past its row (the next row may be another thread's). */
REFCG_INLINE void refcg_gather_rows16(const refcg_gather_job* j, int64_t r0, int64_t r1, refcg_gather_chunk_fn chunk) {
  int64_t index[REFCG_COPY_MAX_DIMS];
  int64_t at = refcg_gather_first(j->p, r0, index);
  for (int64_t r = r0; r < r1; ++r, at = refcg_gather_next(j->p, at, index)) {
    uint8_t* out = j->out + r * j->n;
    int64_t k = 0;
    for (; 16 * k + 16 <= j->n; ++k) chunk(j, j->in + at, k, out + 16 * k);
    if (16 * k < j->n) {
      uint8_t t[16];
      chunk(j, j->in + at, k, t);
      memcpy(out + 16 * k, t, (size_t)(j->n - 16 * k));
    }
  }
}

/* Rows [r0, r1) of gather j byte by byte (a variant without byte shuffles for it). */
REFCG_INLINE void refcg_gather_bytes(const refcg_gather_job* j, int64_t r0, int64_t r1) {
  const int32_t* take = j->p->take[j->p->ndim - 1];
  int64_t index[REFCG_COPY_MAX_DIMS];
  int64_t at = refcg_gather_first(j->p, r0, index);
  for (int64_t r = r0; r < r1; ++r, at = refcg_gather_next(j->p, at, index))
    for (int64_t i = 0; i < j->n; ++i) j->out[r * j->n + i] = j->in[at + take[i]];
}

/* Gather row tasks [t0, t1) (refcg_range_fn context j) by the 16-byte windows through chunk where every
 * chunk of the row has them, else byte by byte. */
REFCG_INLINE void refcg_gather_tasks(const void* ctx, int64_t t0, int64_t t1, refcg_gather_chunk_fn chunk) {
  const refcg_gather_job* j = (const refcg_gather_job*)ctx;
  int64_t r0, r1;
  refcg_gather_range(j, t0, t1, &r0, &r1);
  if (j->by16)
    refcg_gather_rows16(j, r0, r1, chunk);
  else
    refcg_gather_bytes(j, r0, r1);
}

/* ---- variant configs ----
 * One config per ISA variant, defined next to its kernels with named fields; per op family the
 * kernels and their tiling, NULL where the family keeps the generic path. refcg_fast.c holds the
 * table (best first) and chooses one at first use. */
typedef struct {
  int32_t mr, nv;              /* rows and 16-channel blocks per tile */
  refcg_range_fn tiles;        /* NHWC tiles over refcg_gemm_job */
  refcg_range_fn planes;       /* 1x1 conv on planar layouts, refcg_gemmp_job (NULL: the NHWC GEMM) */
  int (*flips)(int64_t k, int32_t n); /* the tiles of a K x N conv read an input of the other dtype in place,
                                       * XOR refcg_gemm_job.flip4, rather than its domain copy (NULL: never) */
  refcg_range_fn wino;         /* 3x3 stride-1 convs, refcg_wino_job tasks (NULL: the GEMM tiles) */
  int (*reads_a16)(const refcg_gemm_job* j); /* the tiles of j read refcg_gemm_job.a16 where it is built (NULL: never) */
} refcg_gemm_config;

typedef struct {
  refcg_range_fn rows;         /* rows of refcg_dw_job over the padded NHWC copy */
  refcg_range_fn planes;       /* planar layouts, refcg_dwp_job (NULL: rows on the NHWC copy) */
  int32_t pairs;               /* rows reads the weights as tap pairs (refcg_dw_pair_weights) */
  int32_t quads;               /* rows takes row quads (refcg_dw_quad_weights) where they fit */
  int32_t qmax;                /* taps per 32-bit lane of planes: 4 bytes, or 2 int16 (AVX2 vpmaddwd) */
  int32_t flips;               /* rows XOR refcg_dw_job.flip into the bytes they read (0: flip 0 only) */
} refcg_dw_config;

typedef struct {
  const char* name;
  const char* features;        /* CPU features it needs, for messages */
  int (*supported)(void);
  int32_t signed_domain;       /* 1: kernels read int8 inputs (aarch64), 0: uint8 (x86) */
  refcg_gemm_config gemm;
  refcg_dw_config dw;
  refcg_range_fn binary_rows;  /* qnn.add/subtract/mul rows, refcg_bin_job (NULL: the reference) */
  refcg_range_fn pool;         /* max/avg pool, refcg_pool_run's tasks (NULL: the reference) */
  refcg_range_fn quantize;     /* qnn.quantize chunks, refcg_quant_job (NULL: the reference) */
  refcg_range_fn requantize;   /* qnn.requantize chunks of 8-bit or int32 rows, refcg_rq_job (NULL: the reference) */
  refcg_range_fn lut;          /* table lookups, refcg_lut_job chunks (NULL: the reference) */
  refcg_range_fn reduce;       /* sum/mean chunks, refcg_reduce_job (NULL: the baseline ISA's) */
  refcg_range_fn gather;       /* 8-bit last-axis gathers, refcg_gather_job row tasks (NULL: the reference) */
  int (*gather_by16)(void);    /* gather reads refcg_gather_job.by16 on this CPU (NULL: never; not built) */
} refcg_isa_config;

/* Hidden here, at their first declaration (C++ ignores the attribute on the definitions). */
#if defined(REFCG_HAVE_X86)
extern REFCG_INTERNAL const refcg_isa_config refcg_isa_avx512vnni, refcg_isa_avxvnni, refcg_isa_avx2;
#endif
#if defined(REFCG_HAVE_ARM)
extern REFCG_INTERNAL const refcg_isa_config refcg_isa_dotprod, refcg_isa_neon;
#endif

#endif /* REFCG_FAST_INTERNAL_H_ */
