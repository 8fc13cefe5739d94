/* linear.c's tiles and lone row on AVX2 without AVX-512, included there in their place (they use its STREAM,
 * prefetch_next_tile and floats).
 *
 * GCC keeps 16-lane vectors in memory there (two registers each, spilled and reloaded every step), which made
 * a decode step compute-bound. The same sums in pairs of 8-lane registers: lane j of 16 is lane j of `lo`
 * (j < 8) or of `hi`, the same fused multiply-adds in the same order, and lanes_sum's tree (8, 4, 2, 1) at the
 * end, so every result is the bits the generic code gives. */
#ifndef GLASSBOX_LINEAR_AVX2_H
#define GLASSBOX_LINEAR_AVX2_H
#define AVX2_LONE_ROW  /* linear.c takes this file's lone row, not its generic one */

/* x . W[n]: a batch's one last row (a batch of 7 is a tile of six and this), the sums of a one-row tile */
static inline __attribute__((always_inline)) float row_dot(int kind, const float *x, const void *w, int64_t K,
                                                           int64_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {  /* no PREFETCH: the hardware's alone streams faster here */
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8_w(kind, w, n * K + k), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8_w(kind, w, n * K + k + 8), hi);
    }
    float s = lanes_sum8x2(lo, hi);
    for (; k < K; k++) s = fmaf(x[k], w_at(kind, w, n * K + k), s);
    return s;
}

/* A batch's rows by two weight rows, one half of the 16 lanes at a time: every lane's sum is its own (lane j of
 * 16 sums x[k + j] w[k + j] over k), so the lanes 0-7 and 8-15 can be summed in two passes over K, each holding
 * mr * 2 sums (12 of the 16 registers at six rows). Six rows load two weight vectors and six of x for twelve
 * multiply-adds, where tiles of two rows by two, both halves at once, loaded four for four (Zen 1 waited on the
 * loads). The second pass finds the two rows of weights in L1. */
static inline __attribute__((always_inline)) void rows_by_two(int kind, int mr, int nr, const float *x, int64_t ldx,
                                                              const void *w, int64_t K, int64_t n0, int half,
                                                              __m256 sums[MR][2], int64_t next) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) sums[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k + LANES <= K; k += LANES) {
        __m256 wv[2];
        for (int j = 0; j < nr; j++) {
            wv[j] = load8_w(kind, w, (n0 + j) * K + k + 8 * half);
            if (next >= 0 && !half) prefetch_next_tile(kind, w, (next + j) * K + k);
        }
        for (int i = 0; i < mr; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * ldx + k + 8 * half);
            /* held in a register for both weight rows: left to itself GCC folded the load into each
             * multiply-add, loading x twice (14 loads for 12 multiply-adds, and Zen 1 waited on them) */
            if (nr > 1) __asm__("" : "+x"(xv));
            for (int j = 0; j < nr; j++) sums[i][j] = _mm256_fmadd_ps(xv, wv[j], sums[i][j]);
        }
    }
}

static inline __attribute__((always_inline)) void batch_tile(int kind, int mr, int nr, const float *x, int64_t ldx,
                                                             const void *w, int64_t K, int64_t n0,
                                                             float dots[MR][NR], int64_t next) {
    for (int j0 = 0; j0 < nr; j0 += 2) {
        int two = nr - j0 >= 2 ? 2 : 1;
        int64_t ahead = next < 0 ? next : next + j0;  /* the next tile's rows for these */
        __m256 lo[MR][2], hi[MR][2];
        if (two == 2) {
            rows_by_two(kind, mr, 2, x, ldx, w, K, n0 + j0, 0, lo, ahead);
            rows_by_two(kind, mr, 2, x, ldx, w, K, n0 + j0, 1, hi, ahead);
        } else {
            rows_by_two(kind, mr, 1, x, ldx, w, K, n0 + j0, 0, lo, ahead);
            rows_by_two(kind, mr, 1, x, ldx, w, K, n0 + j0, 1, hi, ahead);
        }
        int64_t k = K / LANES * LANES;
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < two; j++) {
                float s = lanes_sum8x2(lo[i][j], hi[i][j]);
                for (int64_t t = k; t < K; t++) s = fmaf(x[i * ldx + t], w_at(kind, w, (n0 + j0 + j) * K + t), s);
                dots[i][j0 + j] = s;
            }
    }
}

/* float32 and bfloat16 weights: the batch's MR by NR by batch_tile, one row by row_dot */
#define TILES(KIND)                                                                                  \
    static void tiles_##KIND(int mr, int nr, const float *x, int64_t ldx, const void *w, int64_t K,  \
                             int64_t n0, float dots[MR][NR], int64_t next) {                         \
        switch (mr) {                                                                                \
            case 1: break;                                                                           \
            case 2: batch_tile(KIND, 2, nr, x, ldx, w, K, n0, dots, next); return;                   \
            case 3: batch_tile(KIND, 3, nr, x, ldx, w, K, n0, dots, next); return;                   \
            case 4: batch_tile(KIND, 4, nr, x, ldx, w, K, n0, dots, next); return;                   \
            case 5: batch_tile(KIND, 5, nr, x, ldx, w, K, n0, dots, next); return;                   \
            default: batch_tile(KIND, 6, nr, x, ldx, w, K, n0, dots, next); return;                  \
        }                                                                                            \
        for (int j = 0; j < nr; j++) dots[0][j] = row_dot(KIND, x, w, K, n0 + j);                    \
    }

/* A lone row (a reply's decode step) on AVX2: each output's sums are a one-row tile's, so the same bits, in
 * another schedule. One output at a time, each step waited on its own last multiply-add: the chain's latency,
 * not memory, bounded the stream on Zen 1. LONE_OUTPUTS outputs at a time overlap their chains and load each x
 * vector once for all of them. bfloat16 is widened by unpacking its 16 weights against zeros, one instruction
 * for 8 where a zero-extension and a shift took two each; the unpack takes them in the order [0-3, 8-11] and
 * [4-7, 12-15], so x is read in that order (xp: each 16 values so permuted, the tail as it is) and the two sums
 * are put back in lane order before lanes_sum's tree. bfloat16 rows also ask for the next outputs' rows
 * meanwhile (a few rows read side by side leave the hardware's prefetcher too little to follow), with the
 * non-temporal hint (each weight is read once a step; float32 streams faster on the hardware's alone).
 * docs/benchmarks.md, "One stream and the batched step on the AMD EPYC family 23 (Zen 1)". */
enum { LONE_OUTPUTS = 4 };

static void permute_for_unpack(const float *x, int64_t K, float *xp) {
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES)
        for (int i = 0; i < 4; i++) {
            xp[k + i] = x[k + i], xp[k + 4 + i] = x[k + 8 + i];
            xp[k + 8 + i] = x[k + 4 + i], xp[k + 12 + i] = x[k + 12 + i];
        }
    for (; k < K; k++) xp[k] = x[k];
}

/* dots[j] = x . W[n0 + j] for j < nr; ahead: also ask for the rows that many rows further on */
static inline __attribute__((always_inline)) void lone_outputs(int kind, int nr, const float *x, const float *xp,
                                                               const void *w, int64_t K, int64_t n0, int ahead,
                                                               float dots[LONE_OUTPUTS]) {
    __m256 lo[LONE_OUTPUTS], hi[LONE_OUTPUTS];
    const __m256i zero = _mm256_setzero_si256();
    for (int j = 0; j < nr; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        if (kind == F32) {
            __m256 xl = _mm256_loadu_ps(x + k), xh = _mm256_loadu_ps(x + k + 8);
            for (int j = 0; j < nr; j++) {
                const float *row = (const float *)w + (n0 + j) * K + k;
                lo[j] = _mm256_fmadd_ps(xl, _mm256_loadu_ps(row), lo[j]);
                hi[j] = _mm256_fmadd_ps(xh, _mm256_loadu_ps(row + 8), hi[j]);
            }
        } else {
            __m256 xa = _mm256_loadu_ps(xp + k), xb = _mm256_loadu_ps(xp + k + 8);
            for (int j = 0; j < nr; j++) {
                const uint16_t *row = (const uint16_t *)w + (n0 + j) * K + k;
                __m256i v = _mm256_loadu_si256((const __m256i *)row);
                if (ahead && k % 32 == 0) __builtin_prefetch(row + ahead * K, 0, 0);
                lo[j] = _mm256_fmadd_ps(xa, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), lo[j]);
                hi[j] = _mm256_fmadd_ps(xb, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), hi[j]);
            }
        }
    }
    for (int j = 0; j < nr; j++) {
        __m256 a = lo[j], b = hi[j];
        if (kind == BF16) a = _mm256_permute2f128_ps(lo[j], hi[j], 0x20), b = _mm256_permute2f128_ps(lo[j], hi[j], 0x31);
        float s = lanes_sum8x2(a, b);
        for (int64_t t = k; t < K; t++) s = fmaf(x[t], w_at(kind, w, (n0 + j) * K + t), s);
        dots[j] = s;
    }
}

#define LONE_ROW(KIND)                                                                                                \
    static __attribute__((noinline)) void lone_row_##KIND(const float *x, const float *xp, const void *w, int64_t K,  \
                                                          int64_t n0, int64_t n1, const float *scale, const float *b, \
                                                          float *y) {                                                 \
        float dot[LONE_OUTPUTS];                                                                                      \
        int64_t n = n0;                                                                                               \
        for (; n + 2 * LONE_OUTPUTS <= n1 && KIND == BF16; n += LONE_OUTPUTS) {                                       \
            lone_outputs(KIND, LONE_OUTPUTS, x, xp, w, K, n, LONE_OUTPUTS, dot);                                      \
            for (int j = 0; j < LONE_OUTPUTS; j++) y[n + j] = finish_dot(dot[j], scale, b, n + j);                    \
        }                                                                                                             \
        for (; n + LONE_OUTPUTS <= n1; n += LONE_OUTPUTS) {                                                           \
            lone_outputs(KIND, LONE_OUTPUTS, x, xp, w, K, n, 0, dot);                                                 \
            for (int j = 0; j < LONE_OUTPUTS; j++) y[n + j] = finish_dot(dot[j], scale, b, n + j);                    \
        }                                                                                                             \
        for (; n < n1; n++) {                                                                                         \
            lone_outputs(KIND, 1, x, xp, w, K, n, 0, dot);                                                            \
            y[n] = finish_dot(dot[0], scale, b, n);                                                                   \
        }                                                                                                             \
    }
#endif
