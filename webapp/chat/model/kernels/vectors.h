/* What the decode kernels share (linear.c, attend.c): 16 float32 lanes in GCC's vector extensions, loads
 * that widen float32 or bfloat16 (raw bits) to float32 exactly, and e^x 16 at a time. */
#ifndef GLASSBOX_VECTORS_H
#define GLASSBOX_VECTORS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

typedef float f32x16 __attribute__((vector_size(64)));

enum { LANES = 16 };
enum { F32 = 0, BF16 = 1 };  /* float32, or bfloat16 as raw bits: weights, keys and values */

static inline f32x16 load_x(const float *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Widen 16 weights to float32, exactly. With AVX-512 by its widening instructions; elsewhere by element
 * loops (GCC does not vectorize every widening loop, so the intrinsics where it matters most). */
static inline __attribute__((always_inline)) f32x16 load_w(int kind, const void *w, int64_t at) {
#ifdef __AVX512F__
    if (kind == F32) return _mm512_loadu_ps((const float *)w + at);
    /* bfloat16 is float32's top half */
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at))), 16));
#else
    f32x16 v;
    if (kind == F32) {
        memcpy(&v, (const float *)w + at, sizeof v);
    } else {
        const uint16_t *h = (const uint16_t *)w + at;
        uint32_t bits[LANES];
        for (int j = 0; j < LANES; j++) bits[j] = (uint32_t)h[j] << 16;
        memcpy(&v, bits, sizeof v);
    }
    return v;
#endif
}

static inline float w_at(int kind, const void *w, int64_t at) {
    if (kind == F32) return ((const float *)w)[at];
    uint32_t bits = (uint32_t)((const uint16_t *)w)[at] << 16;  /* bfloat16 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float lanes_sum(f32x16 v) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps(v);  /* a fixed tree of adds, as below */
#endif
    float s[LANES];
    memcpy(s, &v, sizeof s);
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int i = 0; i < width; i++) s[i] += s[i + width];
    return s[0];
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* AVX2 without AVX-512 (linear.c's and attend.c's 8-lane paths): 8 weights widened to float32, and the sum of
 * 16 lanes held as two halves, by lanes_sum's tree (8, 4, 2, 1), so the same bits */
static inline __attribute__((always_inline)) __m256 load8_w(int kind, const void *w, int64_t at) {
    if (kind == F32) return _mm256_loadu_ps((const float *)w + at);
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + at))), 16));
}

static inline __attribute__((always_inline)) float lanes_sum8x2(__m256 lo, __m256 hi) {
    __m256 t = _mm256_add_ps(lo, hi);                                                   /* width 8 */
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));     /* width 4 */
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));                                             /* width 2 */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));                            /* width 1 */
}
#endif

/* float32 to bfloat16 (raw bits), to nearest even as torch rounds; a NaN stays a NaN (rounding would carry it
 * to inf or 0) */
static inline uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* Scratch memory, 64-byte aligned (a 64-byte load from it never splits a cache line), at least `bytes`
 * rounded up to whole lines as aligned_alloc wants; free() it. */
static inline void *scratch(int64_t bytes) {
    return aligned_alloc(64, (size_t)(bytes / 64 + 1) * 64);
}

/* amx.c's: y = (x @ Wᵀ) * scale + b on AMX tiles for bfloat16 and int8 (2) weights; 1: not on this CPU
 * (or not permitted), the caller's vector kernels run; 0 done; < 0 failed */
int amx_linear(int kind, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
               const float *scale, const float *b, float *y, int threads);

/* attend.c's, which glassbox_block (linear.c) calls once per row */
int glassbox_attend(const float *q, const float *k, const float *v, int kv_kind, void *K, void *V, int64_t nh,
                    int64_t pos, int64_t max_len, int64_t hs, float *out, int threads);

typedef int32_t i32x16 __attribute__((vector_size(64)));

static inline f32x16 where(i32x16 mask, f32x16 a, f32x16 b) {  /* a where mask is set, else b */
    return (f32x16)(((i32x16)a & mask) | ((i32x16)b & ~mask));
}

/* a < b lane by lane (all bits set where so), and float32 to int32 truncated: C's `a < b` and
 * __builtin_convertvector on 16 lanes. On AVX2 without AVX-512 GCC turns both into a scalar loop over the
 * lanes (each lane moved out and back); there, two 8-lane instructions each, the same results. */
static inline __attribute__((always_inline)) i32x16 less16(f32x16 a, f32x16 b) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    __m256 a8[2], b8[2];
    __m256i m[2];
    i32x16 r;
    memcpy(a8, &a, sizeof a8), memcpy(b8, &b, sizeof b8);
    for (int h = 0; h < 2; h++) m[h] = _mm256_castps_si256(_mm256_cmp_ps(a8[h], b8[h], _CMP_LT_OQ));
    memcpy(&r, m, sizeof r);
    return r;
#else
    return a < b;
#endif
}

static inline __attribute__((always_inline)) i32x16 truncate16(f32x16 a) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    __m256 a8[2];
    __m256i t[2];
    i32x16 r;
    memcpy(a8, &a, sizeof a8);
    for (int h = 0; h < 2; h++) t[h] = _mm256_cvttps_epi32(a8[h]);
    memcpy(&r, t, sizeof r);
    return r;
#else
    return __builtin_convertvector(a, i32x16);
#endif
}

static inline f32x16 exp16(f32x16 x) {
    i32x16 lo = less16(x, (f32x16){0} - 87.0f);  /* all bits set where so */
    x = where(lo, (f32x16){0} - 87.0f, x);
    f32x16 n = x * 1.44269504088896341f + 12582912.0f - 12582912.0f;  /* round(x / ln 2): 1.5 * 2^23 */
    f32x16 r = x - n * 0.693359375f + n * 2.12194440e-4f;              /* ln 2 in two parts */
    f32x16 p = (f32x16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i32x16 pow2 = (truncate16(n) + 127) << 23;  /* 2^n, n in [-126, 0] */
    f32x16 e = p * (f32x16)pow2;
    return (f32x16)((i32x16)e & ~(i32x16)lo);
}

#endif
