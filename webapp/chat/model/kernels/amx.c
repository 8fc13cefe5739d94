/* The linear layers on Intel's AMX tile units (amx_linear), for bfloat16 and int8 weights, where the CPU
 * has them (compiled in when -march=native defines __AMX_BF16__ / __AMX_INT8__; elsewhere amx_linear
 * answers "not here" and linear.c's vector kernels run, as before).
 *
 * Why tiles: a decode step of B rows does 2 B flops per weight it reads. At B = 1 the step waits on memory
 * whatever the arithmetic; at B = 8 or 16 the vector kernels run out of arithmetic first (each weight
 * widened, each row's product and sum an instruction of 16 lanes). One tile product multiplies 16 weight
 * rows by 16 rows of x over 32 values of K (16 x 16 x 32 multiply-adds) in about the time of a few vector
 * instructions, each weight block loaded once for all the rows.
 *
 * The weights are the tile product's left operand A, read straight from W (16 rows of 64 bytes, K apart):
 * no repacking of the weights. x is the right operand B, repacked once per call into the tiles' pair
 * (bfloat16) or quad (int8) layout, 16 rows of x per tile, unused rows zero. A tile's C[n][m] depends
 * only on weight row n and x row m, so each row of x gets the same sums whatever the other rows are and
 * however many there are: a batch of one runs the same tiles as a batch of 16 (row invariance, linear.c).
 *
 * bfloat16: products of bfloat16 pairs summed into float32 inside the tile, all of K. x is split into
 * hi = bfloat16(x) and lo = bfloat16(x - hi), two tile products per block: x keeps ~16 of float32's 24
 * bits (hi alone, 8), so the result is within float32 rounding of the vector kernel's, not the same bits.
 *
 * int8: x quantized in blocks of 32 as linear.c's quantize_rows does (absmax / 127, to nearest even), but
 * kept signed; a tile product per block gives each (row, output) its exact integer dot over the block,
 * then   acc = fma(float(dot), x's block scale, acc)   block after block, times the weight row's scale at
 * the end. That is a different order of float32 sums than the vector kernel's (16 lanes of 4 products),
 * so an AMX build's int8 outputs differ from a vector build's in the last bits; each is row-invariant.
 */
#include "vectors.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#include <sys/syscall.h>
#include <unistd.h>

enum { TN = 16, TM = 16 };  /* a tile: 16 weight rows (outputs) by 16 rows of x */
enum { KB = 32 };           /* values of K per tile product: bfloat16 64 bytes, int8 32 bytes (one block) */
enum { TILE_AHEAD = 512 }; /* bytes ahead along each weight row to prefetch (16 rows stream at once) */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* Linux gives a process the tiles' 8 KB of state only when asked (once per process); refused: the vector
 * kernels run instead, for the whole process (a row's sums never depend on which call asked first). */
static int amx_permitted(void) {
    static int state;  /* 0 unknown, 1 yes, -1 no */
    int now = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (!now) {
        now = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
        __atomic_store_n(&state, now, __ATOMIC_RELEASE);
    }
    return now > 0;
}

/* tiles 0-1: C (int8: two blocks in turn; bfloat16: two groups of 16 outputs), 2-3: A (16 weight rows,
 * bytes_a of K each), 4-5: B (x packed: rows_b rows of `cols` rows of x, 4 bytes each). C and B are only as
 * wide as there are rows of x (up to 16): a lone row's tiles carry its 4 bytes, not 64, so x's packed
 * tiles stay in L1 beside the streaming weights. Each output of a tile product is the same sum however
 * wide the tile (the instructions' definition), so the width cannot change a row's result. */
static void configure(int bytes_a, int rows_b, int cols) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.colsb[t] = (uint16_t)(4 * cols), c.rows[t] = TN;
    for (int t = 2; t < 4; t++) c.colsb[t] = (uint16_t)bytes_a, c.rows[t] = TN;
    for (int t = 4; t < 6; t++) c.colsb[t] = (uint16_t)(4 * cols), c.rows[t] = (uint8_t)rows_b;
    _tile_loadconfig(&c);
}

/* Weight rows n0..n0+15 as the tiles read them: W itself, `lda` bytes apart, where all 16 rows exist and K
 * fills whole blocks; else a copy zero-padded past N and K (*copy, to free). NULL: n0 is past N, or no memory. */
static const uint8_t *weight_rows(const void *w, int64_t K, int64_t N, int64_t n0, int64_t kp, int esize,
                                  int64_t *lda, void **copy) {
    *copy = 0;
    if (n0 >= N) return 0;
    if (n0 + TN <= N && K == kp) {
        *lda = K * esize;
        return (const uint8_t *)w + n0 * K * esize;
    }
    uint8_t *out = scratch(TN * kp * esize);
    if (!out) return 0;
    memset(out, 0, (size_t)(TN * kp * esize));
    for (int64_t n = n0; n < N && n < n0 + TN; n++)
        memcpy(out + (n - n0) * kp * esize, (const uint8_t *)w + n * K * esize, (size_t)(K * esize));
    *lda = kp * esize;
    *copy = out;
    return out;
}

static inline void prefetch_rows(const uint8_t *a, int64_t lda) {
    for (int r = 0; r < TN; r++) __builtin_prefetch(a + r * lda + TILE_AHEAD, 0, 0);
}

static uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  /* to nearest even */
}

static float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* y[m][n] = v[n][m] * scale[n] + b[n] for one tile of outputs (v: 16 outputs' lanes, lane = row of x) */
static void store_tile(const float v[TN][TM], int64_t m0, int mr, int64_t n0, int64_t N, const float *scale,
                       const float *b, float *y) {
    for (int n = 0; n < TN && n0 + n < N; n++)
        for (int m = 0; m < mr; m++) {
            float out = v[n][m];
            if (scale) out *= scale[n0 + n];
            if (b) out += b[n0 + n];
            y[(m0 + m) * N + n0 + n] = out;
        }
}

/* x as B tiles, `cols` rows of x per group: for each block of 32 values of K, 16 rows of 4 * cols bytes,
 * row r holding values 2r, 2r+1 of each row of x in turn; hi = bfloat16(x), lo = bfloat16(x - hi) */
static void pack_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, int64_t blocks, int cols, uint16_t *hi,
                      uint16_t *lo) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            int64_t at = ((m / cols) * blocks + k / KB) * 32 * cols + ((k % KB) / 2) * 2 * cols + (m % cols) * 2
                         + k % 2;
            uint16_t h = to_bf16(x[m * ldx + k]);
            hi[at] = h;
            lo[at] = to_bf16(x[m * ldx + k] - from_bf16(h));
        }
}

static int amx_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w, int64_t N,
                    const float *scale, const float *b, float *y, int threads) {
    int cols = M < TM ? (int)M : TM;
    int64_t blocks = (K + KB - 1) / KB, kp = blocks * KB, groups = (M + cols - 1) / cols;
    size_t bytes = (size_t)(groups * blocks * 64 * cols);
    uint16_t *hi = scratch((int64_t)bytes), *lo = scratch((int64_t)bytes);
    if (!hi || !lo) { free(hi); free(lo); return -2; }
    memset(hi, 0, bytes);
    memset(lo, 0, bytes);
    pack_bf16(x, M, K, ldx, blocks, cols, hi, lo);
    /* two groups of 16 weight rows per pass share x's tiles; a few rows of x (memory-bound) stream one
     * group, 16 weight rows at a time, fewer streams for the prefetchers; the same sums either way */
    int64_t span = cols >= 4 ? 2 * TN : TN, pairs = (N + span - 1) / span;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        configure(64, 16, cols);
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            int64_t n0 = p * span, lda0 = 0, lda1 = 0;
            void *copy0, *copy1 = 0;
            const uint8_t *a0 = weight_rows(w, K, N, n0, kp, 2, &lda0, &copy0);
            const uint8_t *a1 = span > TN ? weight_rows(w, K, N, n0 + TN, kp, 2, &lda1, &copy1) : 0;
            if (!a0 || (!a1 && span > TN && n0 + TN < N)) {
                failed = 1;
            } else {
                for (int64_t gm = 0; gm < groups; gm++) {
                    const uint16_t *bh = hi + gm * blocks * 32 * cols, *bl = lo + gm * blocks * 32 * cols;
                    _tile_zero(0);
                    _tile_zero(1);
                    for (int64_t t = 0; t < blocks; t++) {
                        _tile_loadd(4, bh + t * 32 * cols, 4 * cols);
                        _tile_loadd(5, bl + t * 32 * cols, 4 * cols);
                        if (!gm) prefetch_rows(a0 + t * 64, lda0);
                        _tile_loadd(2, a0 + t * 64, lda0);
                        _tile_dpbf16ps(0, 2, 4);
                        _tile_dpbf16ps(0, 2, 5);
                        if (a1) {
                            if (!gm) prefetch_rows(a1 + t * 64, lda1);
                            _tile_loadd(3, a1 + t * 64, lda1);
                            _tile_dpbf16ps(1, 3, 4);
                            _tile_dpbf16ps(1, 3, 5);
                        }
                    }
                    float c[TN][TM] __attribute__((aligned(64)));
                    int mr = M - gm * cols < cols ? (int)(M - gm * cols) : cols;
                    _tile_stored(0, c, 64);
                    store_tile(c, gm * cols, mr, n0, N, scale, b, y);
                    if (a1) {
                        _tile_stored(1, c, 64);
                        store_tile(c, gm * cols, mr, n0 + TN, N, scale, b, y);
                    }
                }
            }
            free(copy0);
            free(copy1);
        }
        _tile_release();
    }
    free(hi);
    free(lo);
    return failed ? -2 : 0;
}

/* x quantized in blocks of 32 (as linear.c's quantize_rows: absmax / 127, to nearest even, within
 * +-127), signed, as B tiles: per group of `cols` rows and block, 8 rows of 4 * cols bytes, row r holding
 * values 4r..4r+3 of each row of x in turn; scales[group][block][row] (0 for rows past M) */
static void pack_q8(const float *x, int64_t M, int64_t K, int64_t ldx, int64_t blocks, int cols, int8_t *q,
                    float *scales) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t t = 0; t < blocks; t++) {
            const float *xb = x + m * ldx;
            int64_t lo = t * KB, hi = lo + KB < K ? lo + KB : K;
            float amax = 0.0f;
            for (int64_t k = lo; k < hi; k++) amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            scales[((m / cols) * blocks + t) * TM + m % cols] = amax / 127.0f;
            int8_t *tile = q + ((m / cols) * blocks + t) * 32 * cols;
            for (int64_t k = lo; k < hi; k++) {
                int v = (int)nearbyintf(xb[k] * inv);
                tile[((k - lo) / 4) * 4 * cols + (m % cols) * 4 + (k - lo) % 4] =
                    (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        }
}

static int amx_q8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, int64_t N, const float *scale,
                  const float *b, float *y, int threads) {
    int cols = M < TM ? (int)M : TM;
    int64_t blocks = (K + KB - 1) / KB, kp = blocks * KB, groups = (M + cols - 1) / cols;
    int8_t *q = scratch(groups * blocks * 32 * cols);
    float *xs = scratch(groups * blocks * TM * (int64_t)sizeof(float));
    if (!q || !xs) { free(q); free(xs); return -2; }
    memset(q, 0, (size_t)(groups * blocks * 32 * cols));
    memset(xs, 0, (size_t)(groups * blocks * TM) * sizeof(float));
    pack_q8(x, M, K, ldx, blocks, cols, q, xs);
    int64_t tiles = (N + TN - 1) / TN;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        configure(KB, KB / 4, cols);
        #pragma omp for schedule(static)
        for (int64_t tn = 0; tn < tiles; tn++) {
            int64_t n0 = tn * TN, lda = 0;
            void *copy;
            const uint8_t *a = weight_rows(w, K, N, n0, kp, 1, &lda, &copy);
            if (!a) {
                failed = 1;
                continue;
            }
            for (int64_t gm = 0; gm < groups; gm++) {
                const int8_t *bq = q + gm * blocks * 32 * cols;
                const float *bs = xs + gm * blocks * TM;
                int32_t dots[2][TN][TM] __attribute__((aligned(64)));
                __m512 acc[TN];
                for (int n = 0; n < TN; n++) acc[n] = _mm512_setzero_ps();
                /* block t's integer dots in C tile t % 2 while the other's are summed in float32: the
                 * float32 sums take every block in order, acc = fma(float(dot), scale, acc) */
                for (int64_t t = 0; t <= blocks; t++) {
                    if (t < blocks) {
                        if (!gm && t % 2 == 0) prefetch_rows(a + t * KB, lda);
                        _tile_loadd(4, bq + t * 32 * cols, 4 * cols);
                        _tile_loadd(2, a + t * KB, lda);
                        if (t % 2 == 0) {
                            _tile_zero(0);
                            _tile_dpbssd(0, 2, 4);
                            _tile_stored(0, dots[0], 64);
                        } else {
                            _tile_zero(1);
                            _tile_dpbssd(1, 2, 4);
                            _tile_stored(1, dots[1], 64);
                        }
                    }
                    if (t > 0) {
                        int64_t done = t - 1;
                        __m512 s = _mm512_loadu_ps(bs + done * TM);
                        for (int n = 0; n < TN; n++)
                            acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots[done % 2][n])), s,
                                                     acc[n]);
                    }
                }
                float c[TN][TM] __attribute__((aligned(64)));
                for (int n = 0; n < TN; n++) _mm512_store_ps(c[n], acc[n]);
                int mr = M - gm * cols < cols ? (int)(M - gm * cols) : cols;
                store_tile(c, gm * cols, mr, n0, N, scale, b, y);
            }
            free(copy);
        }
        _tile_release();
    }
    free(q);
    free(xs);
    return failed ? -2 : 0;
}

int amx_linear(int kind, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
               const float *scale, const float *b, float *y, int threads) {
    if (M < 1 || K < 1 || N < 1 || !amx_permitted()) return 1;
    if (kind == BF16) return amx_bf16(x, M, K, ldx, w, N, scale, b, y, threads);
    if (kind == 2 /* linear.c's I8 */) return amx_q8(x, M, K, ldx, w, N, scale, b, y, threads);
    return 1;
}
#else
int amx_linear(int kind, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
               const float *scale, const float *b, float *y, int threads) {
    (void)kind, (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)N, (void)scale, (void)b, (void)y, (void)threads;
    return 1;  /* no tiles on this CPU: linear.c's vector kernels */
}
#endif
