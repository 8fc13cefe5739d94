/* int8 weights times int8-quantized activations, for glassbox_linear (linear.c): x's rows quantized as
 * tiles.h says, and the tiles that multiply them, with VNNI, AVX2 or plain loops (the same integers). */
#include "tiles.h"


void quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx, uint8_t *xu, float *xs, int threads) {
    int64_t chunks = (K + QCHUNK - 1) / QCHUNK;
    #pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++)
        for (int64_t blk = 0; blk < 2 * chunks; blk++) {
            const float *xb = x + m * ldx;
            int64_t lo = blk * QBLOCK, hi = lo + QBLOCK < K ? lo + QBLOCK : K;
            float amax = 0.0f;
            for (int64_t k = lo; k < hi; k++) amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
            float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            uint8_t *qb = xu + m * chunks * QCHUNK;
            for (int64_t k = lo; k < lo + QBLOCK; k++) {
                int q = k < hi ? (int)nearbyintf(xb[k] * inv) : 0;
                qb[k] = (uint8_t)((q > 127 ? 127 : q < -127 ? -127 : q) + 128);
            }
            float *sb = xs + m * chunks * LANES + (blk / 2) * LANES + (blk % 2) * (LANES / 2);
            for (int j = 0; j < LANES / 2; j++) sb[j] = d;
        }
}

#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
/* Without VNNI: acc += float(lane dots of a chunk of x and 64 weights at w, the first `valid` of them) * x's
 * lane scales, the same integers as VNNI's (tile_q8) */
static inline f32x16 q8_chunk(f32x16 acc, const uint8_t *xu, const float *xs, const int8_t *w, int64_t valid) {
    float a[LANES];
    memcpy(a, &acc, sizeof a);
    for (int j = 0; j < LANES; j++) {
        int32_t dot = 0;
        for (int e = 4 * j; e < 4 * j + 4 && e < valid; e++) dot += ((int32_t)xu[e] - 128) * w[e];
        a[j] = fmaf((float)dot, xs[j], a[j]);
    }
    memcpy(&acc, a, sizeof acc);
    return acc;
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && !defined(GLASSBOX_GENERIC_TILES)
/* AVX2 (no VNNI, no 64-byte registers): a chunk's 16 lane dots from two 32-byte halves, by llama.cpp's sign
 * trick: |x_q| (unsigned) times w with x_q's sign, pairs summed in 16 bits (at most 2 * 127 * 127, no
 * saturation), then pairs of pairs in 32 bits: the integers q8_chunk computes, so the same results. */
static inline __attribute__((always_inline)) __m256i sign_trick(__m256i x_abs, __m256i xq, const int8_t *w) {
    __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)w), xq));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) __m256i q8_lane_dots(const uint8_t *xu, const int8_t *w) {
    __m256i xq = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xu), _mm256_set1_epi8((char)0x80));
    return sign_trick(_mm256_sign_epi8(xq, xq), xq, w);
}

/* dots[i][j] for i < mr, j < nr, at most 2 by 2 (as tile's) */
static inline __attribute__((always_inline)) void tile_q8(int mr, int nr, q8rows x, const int8_t *w, int64_t K,
                                                          int64_t n0, float dots[MR][NR]) {
    __m256 lo[2][2], hi[2][2];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < x.chunks; c++) {
        int64_t k = c * QCHUNK;
        const int8_t *wj[2];
        int8_t tail[2][QCHUNK];
        for (int j = 0; j < nr; j++) {
            wj[j] = w + (n0 + j) * K + k;
            PREFETCH(wj[j]);
            if (K - k < QCHUNK) {  /* the row's last, partial chunk: never read past the weights */
                memset(tail[j], 0, QCHUNK);
                memcpy(tail[j], wj[j], (size_t)(K - k));
                wj[j] = tail[j];
            }
        }
        for (int i = 0; i < mr; i++) {
            const uint8_t *xi = x.xu + i * x.chunks * QCHUNK + k;
            const float *si = x.xs + (i * x.chunks + c) * LANES;
            __m256 sl = _mm256_loadu_ps(si), sh = _mm256_loadu_ps(si + 8);
            for (int j = 0; j < nr; j++) {
                lo[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_lane_dots(xi, wj[j])), sl, lo[i][j]);
                hi[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_lane_dots(xi + 32, wj[j] + 32)), sh, hi[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) dots[i][j] = lanes_sum8x2(lo[i][j], hi[i][j]);
}

void tiles_q8(int mr, int nr, q8rows x, const int8_t *w, int64_t K, int64_t n0, float dots[MR][NR]) {
    for (int i0 = 0; i0 < mr; i0 += 2)
        for (int j0 = 0; j0 < nr; j0 += 2) {
            float part[MR][NR];
            q8rows xi = {x.xu + i0 * x.chunks * QCHUNK, x.xs + i0 * x.chunks * LANES, x.chunks};
            int two_rows = mr - i0 >= 2, two_cols = nr - j0 >= 2;
            if (two_rows && two_cols) tile_q8(2, 2, xi, w, K, n0 + j0, part);
            else if (two_rows) tile_q8(2, 1, xi, w, K, n0 + j0, part);
            else if (two_cols) tile_q8(1, 2, xi, w, K, n0 + j0, part);
            else tile_q8(1, 1, xi, w, K, n0 + j0, part);
            for (int i = 0; i < 2 && i0 + i < mr; i++)
                for (int j = 0; j < 2 && j0 + j < nr; j++) dots[i0 + i][j0 + j] = part[i][j];
        }
}

/* A lone row (a reply's decode step): x_q's magnitudes and x_q itself (the sign trick's two sides) worked out
 * once for the row, where each output's lane dots took them anew; then outputs one at a time straight through
 * the weights, each asked for AHEAD bytes early (tiles.h). The same integers and sums as tile_q8's. */
static inline __attribute__((always_inline)) __m256i q8_lane_dots_signed(const uint8_t *xabs, const int8_t *xq,
                                                                          const int8_t *w) {
    return sign_trick(_mm256_loadu_si256((const __m256i *)xabs), _mm256_loadu_si256((const __m256i *)xq), w);
}

static float lone_dot_q8(q8rows x, const uint8_t *xabs, const int8_t *xq, const int8_t *w, int64_t K) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (int64_t c = 0; c < x.chunks; c++) {
        int64_t k = c * QCHUNK;
        const int8_t *wk = w + k;
        int8_t tail[QCHUNK];
        PREFETCH(wk);
        if (K - k < QCHUNK) {  /* the row's last, partial chunk: never read past the weights */
            memset(tail, 0, QCHUNK);
            memcpy(tail, wk, (size_t)(K - k));
            wk = tail;
        }
        const float *sc = x.xs + c * LANES;
        lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_lane_dots_signed(xabs + k, xq + k, wk)), _mm256_loadu_ps(sc), lo);
        hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_lane_dots_signed(xabs + k + 32, xq + k + 32, wk + 32)),
                             _mm256_loadu_ps(sc + 8), hi);
    }
    return lanes_sum8x2(lo, hi);
}

int lone_row_q8(q8rows x, const int8_t *w, int64_t K, int64_t N, const float *scale, const float *b, float *y,
                int threads) {
    int64_t bytes = x.chunks * QCHUNK;
    uint8_t *xabs = scratch(2 * bytes);
    if (!xabs) return -2;
    int8_t *xq = (int8_t *)xabs + bytes;
    for (int64_t k = 0; k < bytes; k++) {
        int q = (int)x.xu[k] - 128;
        xabs[k] = (uint8_t)(q < 0 ? -q : q), xq[k] = (int8_t)q;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < threads; r++)
        for (int64_t n = N * r / threads; n < N * (r + 1) / threads; n++)
            y[n] = finish_dot(lone_dot_q8(x, xabs, xq, w + n * K, K), scale, b, n);
    free(xabs);
    return 0;
}
#else
static inline __attribute__((always_inline)) void tile_q8(int mr, int nr, q8rows x, const int8_t *w, int64_t K,
                                                          int64_t n0, float dots[MR][NR]) {
    f32x16 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (f32x16){0};
    for (int64_t c = 0; c < x.chunks; c++) {
        int64_t k = c * QCHUNK;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
        /* VNNI multiplies unsigned by signed: x_q + 128 by w, less 128 * (sum of w), is exactly x_q . w.
         * Each weight vector and its sum once for all rows; one weight row at a time (sixteen sums, the
         * rows' x and its scales would not all fit in registers). */
        __m512i zero = _mm512_setzero_si512();
        for (int j = 0; j < nr; j++) {
            const int8_t *wj = w + (n0 + j) * K + k;
            if (mr > 1) PREFETCH(wj);  /* a lone row: the hardware's prefetcher alone (tiles.h) */
            __m512i wv = K - k >= QCHUNK ? _mm512_loadu_si512(wj) : _mm512_maskz_loadu_epi8((1ULL << (K - k)) - 1, wj);
            __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)128), wv));
            for (int i = 0; i < mr; i++) {
                __m512i dots = _mm512_dpbusd_epi32(neg, _mm512_loadu_si512(x.xu + i * x.chunks * QCHUNK + k), wv);
                acc[i][j] = (f32x16)_mm512_fmadd_ps(_mm512_cvtepi32_ps(dots),
                                                    _mm512_loadu_ps(x.xs + (i * x.chunks + c) * LANES),
                                                    (__m512)acc[i][j]);
            }
        }
#else
        for (int j = 0; j < nr; j++)
            for (int i = 0; i < mr; i++)
                acc[i][j] = q8_chunk(acc[i][j], x.xu + i * x.chunks * QCHUNK + k, x.xs + (i * x.chunks + c) * LANES,
                                     w + (n0 + j) * K + k, K - k);
#endif
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) dots[i][j] = lanes_sum(acc[i][j]);
}

void tiles_q8(int mr, int nr, q8rows x, const int8_t *w, int64_t K, int64_t n0, float dots[MR][NR]) {
    if (mr > 4) {  /* 4 rows at a time at most: VNNI's sums, weights and their sums fill the registers */
        float rest[MR][NR];
        q8rows more = {x.xu + 4 * x.chunks * QCHUNK, x.xs + 4 * x.chunks * LANES, x.chunks};
        tiles_q8(4, nr, x, w, K, n0, dots);
        tiles_q8(mr - 4, nr, more, w, K, n0, rest);
        for (int i = 4; i < mr; i++) memcpy(dots[i], rest[i - 4], sizeof dots[i]);
        return;
    }
    if (nr == NR && mr > 1) {
        switch (mr) {
            case 2: tile_q8(2, NR, x, w, K, n0, dots); return;
            case 3: tile_q8(3, NR, x, w, K, n0, dots); return;
            default: tile_q8(4, NR, x, w, K, n0, dots); return;
        }
    }
    float one[MR][NR];  /* a lone row streams one row of W at a time, as above */
    for (int j = 0; j < nr; j++)
        for (int i = 0; i < mr; i++) {
            q8rows xi = {x.xu + i * x.chunks * QCHUNK, x.xs + i * x.chunks * LANES, x.chunks};
            tile_q8(1, 1, xi, w, K, n0 + j, one);
            dots[i][j] = one[0][0];
        }
}

int lone_row_q8(q8rows x, const int8_t *w, int64_t K, int64_t N, const float *scale, const float *b, float *y,
                int threads) {
    (void)x, (void)w, (void)K, (void)N, (void)scale, (void)b, (void)y, (void)threads;
    return 1;  /* the tiles take a lone row too */
}
#endif
