/* bench.decode.op_peak's harness: how many multiply-adds a second one core's vector units can do in the
 * instruction sequence each precision's kernel runs on AVX2 (webapp/chat/model/kernels/linear_avx2.h,
 * linear_int8.c), everything in registers: no load, no memory, independent chains enough to hide every
 * latency. A batch of B rows at a time is bound by this rate, not by memory, once B is large.
 *
 *   float32    8 weights a fused multiply-add
 *   bfloat16   16 weights unpacked against zeros into two vectors of 8, two fused multiply-adds (each 16
 *              weights for one output, as a lone row's; a batch widens each weight once for several rows)
 *   int8       32 weights: x's sign onto w, pairs multiplied and summed in 16 bits (maddubs), pairs of pairs in
 *              32 bits (madd), converted to float32 and multiplied by x's block scale into the sums (the sign
 *              trick, as llama.cpp's q8_0 on AVX2 does too)
 *
 * Where the compiler targets AVX-512 (-march=native on such a CPU), the ways a prefill's matrix products run there
 * too (oneDNN's float32 and bfloat16 inner products, issue 53), their peak for "the forward at a fraction of it":
 *
 *   float32-avx512    16 weights a fused multiply-add on 512-bit vectors
 *   bfloat16-dpbf16   32 weights a vdpbf16ps: pairs of bfloat16 products summed into 16 float32 sums
 *
 * Prints one line per way, "rate NAME GMAC/s", the best of `reps` runs of `n` iterations.
 * cc -O2 -march=native -o op_peak op_peak.c; ./op_peak [n] [reps]
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* each iteration's chains are the values the compiler cannot see through (the asm), so none is folded away */
#define OPAQUE(v) __asm__ volatile("" : "+x"(v))

/* twelve independent chains s0..s11, each s = op(s, w, x), then each made opaque: enough to hide the latency */
#define TWELVE_CHAINS(op, w, x)                                                                           \
    s0 = op(s0, w, x), s1 = op(s1, w, x), s2 = op(s2, w, x), s3 = op(s3, w, x), s4 = op(s4, w, x);       \
    s5 = op(s5, w, x), s6 = op(s6, w, x), s7 = op(s7, w, x), s8 = op(s8, w, x), s9 = op(s9, w, x);       \
    s10 = op(s10, w, x), s11 = op(s11, w, x);                                                             \
    OPAQUE(s0); OPAQUE(s1); OPAQUE(s2); OPAQUE(s3); OPAQUE(s4); OPAQUE(s5);                               \
    OPAQUE(s6); OPAQUE(s7); OPAQUE(s8); OPAQUE(s9); OPAQUE(s10); OPAQUE(s11);
/* the twelve chains' sums, each started at `start`, and their total (so that none is dead code) */
#define TWELVE_SUMS(type, start) type s0 = start, s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0, \
                                      s8 = s0, s9 = s0, s10 = s0, s11 = s0
#define TWELVE_TOTAL(add) add(add(add(add(s0, s1), add(s2, s3)), add(add(s4, s5), add(s6, s7))), \
                              add(add(s8, s9), add(s10, s11)))

static float float32_way(long n, double *seconds) {
    volatile float seed = 1.0f;
    __m256 w = _mm256_set1_ps(seed * 0.999f), x = _mm256_set1_ps(seed * 1e-3f);
    TWELVE_SUMS(__m256, _mm256_set1_ps(seed));
    double t = now();
    for (long i = 0; i < n; i++) {
        TWELVE_CHAINS(_mm256_fmadd_ps, w, x)
    }
    *seconds = now() - t;
    return _mm256_cvtss_f32(TWELVE_TOTAL(_mm256_add_ps));
}

#define BF16_STEP(lo, hi, v)                                                          \
    lo = _mm256_fmadd_ps(x, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), lo); \
    hi = _mm256_fmadd_ps(x, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), hi);

static float bfloat16_way(long n, double *seconds) {
    volatile float seed = 1.0f;
    __m256i zero = _mm256_setzero_si256(), v0 = _mm256_set1_epi16(0x3f80), v1 = _mm256_set1_epi16(0x3f81),
            v2 = _mm256_set1_epi16(0x3f82), v3 = _mm256_set1_epi16(0x3f83);
    __m256 x = _mm256_set1_ps(seed * 1e-3f);
    __m256 a0 = _mm256_set1_ps(seed), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    double t = now();
    for (long i = 0; i < n; i++) {
        /* each pair of sums its own 16 weights (a lone row's outputs each read their own row) */
        BF16_STEP(a0, a1, v0) BF16_STEP(a2, a3, v1) BF16_STEP(a4, a5, v2) BF16_STEP(a6, a7, v3)
        OPAQUE(v0); OPAQUE(v1); OPAQUE(v2); OPAQUE(v3); OPAQUE(a0); OPAQUE(a1); OPAQUE(a2); OPAQUE(a3); OPAQUE(a4); OPAQUE(a5); OPAQUE(a6); OPAQUE(a7);
    }
    *seconds = now() - t;
    __m256 all = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                               _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    return _mm256_cvtss_f32(all);
}

#define INT8_STEP(s, xa, xq)                                                                                  \
    s = _mm256_fmadd_ps(                                                                                     \
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xq)), ones)), scale, s);

static float int8_way(long n, double *seconds) {
    volatile char seed = 3;
    __m256i w = _mm256_set1_epi8(seed), ones = _mm256_set1_epi16(1);
    __m256i x0 = _mm256_set1_epi8((char)(seed + 1)), x1 = _mm256_set1_epi8((char)(seed - 5)),
            x2 = _mm256_set1_epi8((char)(seed + 7)), x3 = _mm256_set1_epi8((char)(seed - 2));
    __m256i a0 = _mm256_abs_epi8(x0), a1 = _mm256_abs_epi8(x1), a2 = _mm256_abs_epi8(x2), a3 = _mm256_abs_epi8(x3);
    __m256 scale = _mm256_set1_ps(seed * 1e-6f);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    double t = now();
    for (long i = 0; i < n; i++) {
        /* x's magnitude is given (worked out once per row), as in the fewest operations these numerics allow */
        INT8_STEP(s0, a0, x0) INT8_STEP(s1, a1, x1) INT8_STEP(s2, a2, x2) INT8_STEP(s3, a3, x3)
        OPAQUE(w); OPAQUE(s0); OPAQUE(s1); OPAQUE(s2); OPAQUE(s3);
    }
    *seconds = now() - t;
    return _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

#ifdef __AVX512F__
static float float32_avx512_way(long n, double *seconds) {
    volatile float seed = 1.0f;
    __m512 w = _mm512_set1_ps(seed * 0.999f), x = _mm512_set1_ps(seed * 1e-3f);
    TWELVE_SUMS(__m512, _mm512_set1_ps(seed));
    double t = now();
    for (long i = 0; i < n; i++) {
        TWELVE_CHAINS(_mm512_fmadd_ps, w, x)
    }
    *seconds = now() - t;
    return _mm512_reduce_add_ps(TWELVE_TOTAL(_mm512_add_ps));
}
#endif

#ifdef __AVX512BF16__
static float bfloat16_dpbf16_way(long n, double *seconds) {
    volatile float seed = 1.0f;
    __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16(0x3a83);
    TWELVE_SUMS(__m512, _mm512_set1_ps(seed));
    double t = now();
    for (long i = 0; i < n; i++) {
        TWELVE_CHAINS(_mm512_dpbf16_ps, w, x)
    }
    *seconds = now() - t;
    return _mm512_reduce_add_ps(TWELVE_TOTAL(_mm512_add_ps));
}
#endif

typedef float (*way_fn)(long, double *);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 50000000;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    const char *names[5] = {"float32", "bfloat16", "int8", "float32-avx512", "bfloat16-dpbf16"};
    const double macs[5] = {12 * 8, 8 * 8, 4 * 32, 12 * 16, 12 * 32};  /* multiply-adds an iteration */
    way_fn ways[5] = {float32_way, bfloat16_way, int8_way, NULL, NULL};
#ifdef __AVX512F__
    ways[3] = float32_avx512_way;
#endif
#ifdef __AVX512BF16__
    ways[4] = bfloat16_dpbf16_way;
#endif
    float sink = 0.0f;
    for (int way = 0; way < 5; way++) {
        if (ways[way] == NULL) continue;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double s;
            sink += ways[way](n, &s);
            best = s < best ? s : best;
        }
        printf("rate %s %.3f\n", names[way], n * macs[way] / best / 1e9);
    }
    fprintf(stderr, "%g\n", sink);  /* the results used: nothing above is dead code */
    return 0;
}
