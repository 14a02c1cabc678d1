/*
 * qnn.batch_matmul (+bias) (+requantize) on two run-time operands. Each operand is copied once
 * with its zero point subtracted, as int16 (|v - zp| <= 383), so the work is contiguous int16 dot
 * products the compiler vectorizes; tasks of REFCG_BMM_ROWS x rows over every y row of their batch
 * run on the thread pool. Sums wrap through uint32 like TVM's int32 arithmetic (no signed overflow).
 */
#include "refcg_fast_internal.h"

#define REFCG_BMM_ROWS 4 /* x rows sharing each y row while it is in L1 */

typedef struct {
  const refcg_batch_matmul_params* p;
  const int16_t* xs; /* [x_batch][m][k] */
  const int16_t* ys; /* [y_batch][n][k] */
  void* out;
} refcg_bmm_job;

static void refcg_bmm_shift(const void* src, int64_t count, int32_t dtype, int32_t zp, int16_t* dst) {
  if (dtype == REFCG_S8) {
    for (int64_t i = 0; i < count; ++i) dst[i] = (int16_t)(((const int8_t*)src)[i] - zp);
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = (int16_t)(((const uint8_t*)src)[i] - zp);
  }
}

static inline int32_t refcg_bmm_dot(const int16_t* a, const int16_t* b, int32_t k) {
  uint32_t acc = 0;
  for (int32_t i = 0; i < k; ++i) acc += (uint32_t)((int32_t)a[i] * b[i]);
  return (int32_t)acc;
}

/* Tasks [t0, t1): task t is batch t / blocks, x rows from (t % blocks) * REFCG_BMM_ROWS. */
static void refcg_bmm_tasks(const void* ctx, int64_t t0, int64_t t1) {
  const refcg_bmm_job* j = (const refcg_bmm_job*)ctx;
  const refcg_batch_matmul_params* p = j->p;
  const int32_t blocks = (p->m + REFCG_BMM_ROWS - 1) / REFCG_BMM_ROWS;
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t b = (int32_t)(t / blocks), m0 = (int32_t)(t % blocks) * REFCG_BMM_ROWS;
    const int32_t rows = p->m - m0 < REFCG_BMM_ROWS ? p->m - m0 : REFCG_BMM_ROWS;
    const int16_t* x = j->xs + ((int64_t)(p->x_batch == 1 ? 0 : b) * p->m + m0) * p->k;
    const int16_t* y = j->ys + (int64_t)(p->y_batch == 1 ? 0 : b) * p->n * p->k;
    const int64_t out0 = ((int64_t)b * p->m + m0) * p->n;
    for (int32_t n = 0; n < p->n; ++n) {
      const int16_t* yrow = y + (int64_t)n * p->k;
      const uint32_t bias = p->bias ? (uint32_t)p->bias[n] : 0u;
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t acc = (int32_t)((uint32_t)refcg_bmm_dot(x + (int64_t)r * p->k, yrow, p->k) + bias);
        refcg_store(j->out, out0 + (int64_t)r * p->n + n, p->out_dtype, refcg_requantize_one(&p->rq, acc, n));
      }
    }
  }
}

REFCG_API int refcg_batch_matmul(const refcg_batch_matmul_params* p, const void* x, const void* y, void* out) {
  if (p->batch <= 0 || p->m <= 0 || p->n <= 0 || p->k <= 0) return -1;
  if ((p->x_batch != 1 && p->x_batch != p->batch) || (p->y_batch != 1 && p->y_batch != p->batch)) return -1;
  const int64_t xn = (int64_t)p->x_batch * p->m * p->k, yn = (int64_t)p->y_batch * p->n * p->k;
  int16_t* ws = (int16_t*)refcg_ws_alloc((size_t)(xn + yn) * sizeof(int16_t));
  if (!ws) return -2;
  refcg_bmm_shift(x, xn, p->x_dtype, p->x_zp, ws);
  refcg_bmm_shift(y, yn, p->y_dtype, p->y_zp, ws + xn);
  const refcg_bmm_job j = {p, ws, ws + xn, out};
  refcg_parallel(refcg_bmm_tasks, &j, (int64_t)p->batch * ((p->m + REFCG_BMM_ROWS - 1) / REFCG_BMM_ROWS));
  refcg_ws_free(ws);
  return 0;
}
