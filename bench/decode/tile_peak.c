/* bench.decode.tile_peak's harness: one thread multiplies MR = 6 rows of x by bfloat16 weights held in L2, the
 * kernels' 6 x 4 tile (webapp/chat/model/kernels/linear.c) in four ways, and prints each one's multiply-add
 * rate and its error against double precision:
 *   float32   float32 weights (the float32 kernel's tile)
 *   widened   bfloat16 weights widened to float32, x float32 (the bfloat16 kernel's tile today)
 *   split     AVX-512 BF16's vdpbf16ps, x as hi + lo bfloat16 (two products per pair: AMX's numerics, amx.c)
 *   rounded   vdpbf16ps with x rounded to bfloat16 (one product per pair)
 * and, for its error alone, "widened" with x rounded to float16 first (llama.cpp's f16 weights meet
 * activations rounded to float16).
 * "split" and "rounded" need AVX-512 BF16; without it they print nothing.
 *   usage: tile_peak K N REPS   (K a multiple of 32, N of 4; N * K * 4 bytes, the float32 weights, in L2) */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HELD(v) __asm__("" : "+v"(v))  /* kept in a register, as the kernels' IN_REGISTER */
enum { MR = 6, NR = 4 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint16_t bf16(float f) {  /* to nearest even */
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

static float widen(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void finish(__m512 acc[MR][NR], float d[MR][NR]) {
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) d[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

static void zero(__m512 acc[MR][NR]) {
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
}

/* 16 weights as float32: float32 as they are, bfloat16 widened by a shift (the kernels' load_w) */
static inline __attribute__((always_inline)) __m512 weights16(const void *w, int bf16, int64_t at) {
    if (!bf16) return _mm512_loadu_ps((const float *)w + at);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* the kernels' tile: float32 x times float32 weights, or bfloat16 ones widened (bf16 a constant where inlined) */
static inline __attribute__((always_inline)) void tile_fma(const float *x, const void *w, int bf16, int64_t K,
                                                           float d[MR][NR]) {
    __m512 acc[MR][NR];
    zero(acc);
    for (int64_t k = 0; k < K; k += 16) {
        __m512 wv[NR];
        for (int j = 0; j < NR; j++) {
            wv[j] = weights16(w, bf16, j * K + k);
            HELD(wv[j]);
        }
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * K + k);
            HELD(xv);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    finish(acc, d);
}

__attribute__((noinline)) static void tile_float32(const float *x, const float *w, int64_t K, float d[MR][NR]) {
    tile_fma(x, w, 0, K, d);
}

__attribute__((noinline)) static void tile_widened(const float *x, const uint16_t *w, int64_t K, float d[MR][NR]) {
    tile_fma(x, w, 1, K, d);
}

#ifdef __AVX512BF16__
/* lo: NULL for "rounded" */
__attribute__((noinline)) static void tile_dot(const uint16_t *hi, const uint16_t *lo, const uint16_t *w, int64_t K,
                                               float d[MR][NR]) {
    __m512 acc[MR][NR];
    zero(acc);
    for (int64_t k = 0; k < K; k += 32) {
        __m512bh wv[NR];
        for (int j = 0; j < NR; j++) {
            wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
            HELD(wv[j]);
        }
        for (int i = 0; i < MR; i++) {
            __m512bh h = (__m512bh)_mm512_loadu_si512(hi + i * K + k);
            HELD(h);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], h, wv[j]);
            if (lo) {
                __m512bh l = (__m512bh)_mm512_loadu_si512(lo + i * K + k);
                HELD(l);
                for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], l, wv[j]);
            }
        }
    }
    finish(acc, d);
}
#endif

typedef struct {
    const char *name;
    int variant;
} way;

int main(int argc, char **argv) {
    if (argc != 4) return fprintf(stderr, "usage: tile_peak K N REPS\n"), 2;
    int64_t K = atoll(argv[1]), N = atoll(argv[2]);
    int reps = atoi(argv[3]);
    if (K < 32 || K % 32 || N < 4 || N % 4 || reps < 1)
        return fprintf(stderr, "K: a multiple of 32, N: of 4, REPS: at least 1\n"), 2;
    float *wf = aligned_alloc(64, N * K * 4), *x = aligned_alloc(64, MR * K * 4), *got = malloc(MR * N * 4);
    float *x16 = aligned_alloc(64, MR * K * 4);
    uint16_t *w = aligned_alloc(64, N * K * 2);
    uint16_t *hi = aligned_alloc(64, MR * K * 2), *lo = aligned_alloc(64, MR * K * 2);
    double *exact = malloc(MR * N * sizeof(double)), *scale = malloc(MR * N * sizeof(double));
    srand(1);
    for (int64_t i = 0; i < N * K; i++) wf[i] = widen(w[i] = bf16((rand() / (float)RAND_MAX - 0.5f) * 0.1f));
    for (int64_t i = 0; i < MR * K; i++) {
        x[i] = (rand() / (float)RAND_MAX - 0.5f) * 4.0f;
        hi[i] = bf16(x[i]);
        lo[i] = bf16(x[i] - widen(hi[i]));
        x16[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
    }
    for (int i = 0; i < MR; i++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[i * K + k] * wf[n * K + k];
                s += p, a += fabs(p);
            }
            exact[i * N + n] = s, scale[i * N + n] = a;
        }
    way ways[] = {{"float32", 0}, {"widened", 1}, {"float16-x", 4},
#ifdef __AVX512BF16__
                  {"split", 2}, {"rounded", 3},
#endif
    };
    int count = sizeof ways / sizeof ways[0];
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    float d[MR][NR];
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < count; v++) {  /* interleaved: each rep times every way in turn */
            double t = now();
            for (int64_t n = 0; n < N; n += NR) {
                switch (ways[v].variant) {
                    case 0: tile_float32(x, wf + n * K, K, d); break;
                    case 1: tile_widened(x, w + n * K, K, d); break;
                    case 4: tile_widened(x16, w + n * K, K, d); break;
#ifdef __AVX512BF16__
                    case 2: tile_dot(hi, lo, w + n * K, K, d); break;
                    case 3: tile_dot(hi, 0, w + n * K, K, d); break;
#endif
                }
                for (int i = 0; i < MR; i++)
                    for (int j = 0; j < NR; j++) got[i * N + n + j] = d[i][j];
            }
            t = now() - t;
            if (t < best[v]) best[v] = t;
            if (r == 0) {  /* the error of every output against double precision, relative to sum |x w| */
                double worst = 0, mean = 0;
                for (int64_t o = 0; o < MR * N; o++) {
                    double e = fabs(got[o] - exact[o]) / scale[o];
                    worst = e > worst ? e : worst, mean += e / (MR * N);
                }
                printf("error %s %.3e %.3e\n", ways[v].name, mean, worst);
            }
        }
    for (int v = 0; v < count; v++)
        if (ways[v].variant != 4) printf("rate %s %.2f\n", ways[v].name, 2.0 * MR * N * K / best[v] / 1e9);
    return 0;
}
