/*
 * Test and bench harness of the requantize epilogue, appended to the bundled core (it calls the
 * core's internal inline functions, so it must share their translation unit): tests/core_cffi.py
 * builds it for tests/test_core_epilogue.py and tools/bench_epilogue.py. Not part of the core.
 *
 * refcg_harness_epilogue: out = requantize(acc + corr[channel]) through the epilogue a variant's
 * kernels run, channels in the lanes (planar == 0: acc and out [pixels][channels], per-channel
 * constants loaded once per 16-channel block as the GEMM tiles do) or pixels in the lanes
 * (planar == 1: [channels][pixels], one channel's constants broadcast, as the 1x1 plane and
 * depthwise plane kernels do). acc needs 16 readable int32 past its end. Returns -1 for a variant
 * this build or CPU lacks.
 * refcg_harness_tasks, refcg_harness_ws_fail: below.
 */
int refcg_harness_epilogue(const char* isa, int32_t planar, const refcg_requant* rq, const int32_t* acc,
                           const int32_t* corr, int32_t pixels, int32_t channels, void* out, int32_t out_dtype);

/* Every later kernel call splits its work into n ranges run one after another, as a pool of n
 * threads would (refcg_serial_tasks): the ranges that start or end inside a tile row or a channel
 * group, tested without threads. */
void refcg_harness_tasks(int32_t n);
void refcg_harness_tasks(int32_t n) { *refcg_serial_tasks() = n > 0 ? n : 1; }

/* Workspace allocations from now fail where their bit of mask is set (bit i: the i-th); returns
 * how many were made since the previous call. */
int32_t refcg_harness_ws_fail(uint32_t mask);
int32_t refcg_harness_ws_fail(uint32_t mask) {
  refcg_ws_faults* f = refcg_serial_ws_faults();
  const int32_t made = (int32_t)f->count;
  f->mask = mask;
  f->count = 0;
  return made;
}

static void refcg_harness_scalar(int32_t planar, const refcg_epi* e, const int32_t* acc, int32_t pixels,
                                 int32_t channels) {
  for (int32_t p = 0; p < pixels; ++p)
    for (int32_t c0 = 0; c0 < channels; c0 += 16) {
      int32_t t[16];
      const int32_t n = channels - c0 < 16 ? channels - c0 : 16;
      for (int32_t l = 0; l < n; ++l) t[l] = acc[planar ? (int64_t)(c0 + l) * pixels + p : (int64_t)p * channels + c0 + l];
      refcg_epi_scalar(e, t, c0, n, p * (planar ? 1 : (int64_t)channels));
    }
}

#if defined(REFCG_HAVE_X86)
__attribute__((target("avx2,fma"))) static void refcg_harness_avx2(int32_t planar, const refcg_epi* e,
                                                                  const int32_t* acc, int32_t pixels,
                                                                  int32_t channels) {
  if (planar) {
    for (int32_t c = 0; c < channels; ++c) {
      const refcg_rqv_avx2 r = refcg_rqv_load_avx2(e->rq, c, 8, 0);
      const __m256i corr = _mm256_set1_epi32(e->corr[c]);
      for (int32_t p = 0; p < pixels; p += 8) {
        const __m256i a = _mm256_loadu_si256((const __m256i*)(acc + (int64_t)c * pixels + p));
        refcg_dwp_store_avx2(e, &r, _mm256_add_epi32(a, corr), c, (int64_t)c * pixels + p, pixels - p < 8 ? pixels - p : 8);
      }
    }
    return;
  }
  refcg_gemm_job j; /* the fields the tile epilogue reads */
  memset(&j, 0, sizeof(j));
  j.n = channels;
  j.epi = *e;
  for (int32_t nb = 0; nb * 16 < channels; ++nb) {
#if defined(REFCG_BLK_AVX2) /* constants prepared once per block, as the tiles do */
    refcg_blk_avx2 b;
    refcg_blk_init_avx2(&j, nb, &b);
#endif
    for (int32_t p0 = 0; p0 < pixels; p0 += REFCG_AVX2B_MR) {
      const int32_t rows = pixels - p0 < REFCG_AVX2B_MR ? pixels - p0 : REFCG_AVX2B_MR;
      __m256i sum[REFCG_AVX2_MR_MAX][2];
      int64_t off[REFCG_AVX2_MR_MAX];
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t* a = acc + (int64_t)(p0 + r) * channels + nb * 16;
        sum[r][0] = _mm256_loadu_si256((const __m256i*)a);
        sum[r][1] = _mm256_loadu_si256((const __m256i*)(a + 8));
        off[r] = (int64_t)(p0 + r) * channels;
      }
#if defined(REFCG_BLK_AVX2)
      refcg_tile_sums_epi_avx2(&j, &b, off, sum, rows);
#else /* an older core: constants per tile */
      refcg_tile_sums_epi_avx2(&j, off, nb, sum, rows);
#endif
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))) static void refcg_harness_avx512(
    int32_t planar, const refcg_epi* e, const int32_t* acc, int32_t pixels, int32_t channels) {
  if (planar) {
    for (int32_t c = 0; c < channels; ++c) {
      const refcg_rqv_avx512 r = refcg_rqv_load_avx512(e->rq, c, 0, 0);
      const __m512i corr = _mm512_set1_epi32(e->corr[c]);
      for (int32_t p = 0; p < pixels; p += 16) {
        const __m512i a = _mm512_loadu_si512(acc + (int64_t)c * pixels + p);
        refcg_dwp_store_avx512(e, &r, _mm512_add_epi32(a, corr), c, (int64_t)c * pixels + p,
                               pixels - p < 16 ? pixels - p : 16);
      }
    }
    return;
  }
  for (int32_t c0 = 0; c0 < channels; c0 += 16) {
    const int32_t n = channels - c0 < 16 ? channels - c0 : 16;
    const __mmask16 mask = (__mmask16)((1u << n) - 1u);
    const refcg_rqv_avx512 r = refcg_rqv_load_avx512(e->rq, c0, mask, 1);
    const __m512i corr = _mm512_maskz_loadu_epi32(mask, e->corr + c0);
    for (int32_t p = 0; p < pixels; ++p)
      refcg_epi_vec_avx512(e, &r, _mm512_add_epi32(_mm512_loadu_si512(acc + (int64_t)p * channels + c0), corr), c0, n,
                           (int64_t)p * channels);
  }
}
#endif

int refcg_harness_epilogue(const char* isa, int32_t planar, const refcg_requant* rq, const int32_t* acc,
                           const int32_t* corr, int32_t pixels, int32_t channels, void* out, int32_t out_dtype) {
  const refcg_epi e = refcg_make_epi(rq, channels, corr, out, out_dtype, planar ? pixels : 1);
  if (!strcmp(isa, "scalar")) {
    refcg_harness_scalar(planar, &e, acc, pixels, channels);
    return 0;
  }
#if defined(REFCG_HAVE_X86)
  if (!refcg_isa_supported(isa)) return -1;
  if (!strcmp(isa, "avx2")) {
    refcg_harness_avx2(planar, &e, acc, pixels, channels);
    return 0;
  }
  if (!strcmp(isa, "avx512vnni")) {
    refcg_harness_avx512(planar, &e, acc, pixels, channels);
    return 0;
  }
#endif
  return -1;
}
