/* Glassbox's decode kernels: y = (x @ Wᵀ) * scale + b for a few rows of x, the weights read once
 * (glassbox_linear); and one new token's attention over its own KV cache (glassbox_attend, below).
 *
 * A decode step reads every weight once per token and does two flops with it per row: its speed is
 * the speed at which the weights stream from memory. This kernel streams them as fast as memory allows
 * for a single row (library kernels are built for many rows) and keeps every row's result the same
 * whatever the other rows are, bit for bit.
 *
 *   x      (M, K) float32, rows ldx apart
 *   W      (N, K) float32, bfloat16 (raw bits) or int8 -- one row per output, K contiguous
 *   scale  (N,)   float32 or NULL (int8: one scale per output row)
 *   b      (N,)   float32 or NULL
 *   y      (M, N) float32
 *
 * Row invariance: every output y[m, n] is summed in one fixed order -- 16 lanes over K in steps of 16,
 * the lanes added in a fixed tree, then the tail of K -- whichever tile of rows it is computed in and
 * whichever thread computes it. Weights are widened to float32 exactly (bfloat16 by a shift, int8 by
 * a conversion); products and sums are float32.
 *
 * Written with GCC's vector extensions (AVX-512 intrinsics only to widen weights): one source for AVX-512,
 * AVX2 or SSE, compiled for the machine it runs on (webapp/chat/kernels/__init__.py).
 */
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float f32x16 __attribute__((vector_size(64)));

enum { LANES = 16, MR = 4, NR = 4 };  /* a tile: up to MR rows of x times NR rows of W */
enum { F32 = 0, BF16 = 1, I8 = 2 };   /* the weights' format */

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
    if (kind == BF16)  /* bfloat16 is float32's top half */
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at))), 16));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)w + at))));
#else
    f32x16 v;
    if (kind == F32) {
        memcpy(&v, (const float *)w + at, sizeof v);
    } else if (kind == BF16) {
        const uint16_t *h = (const uint16_t *)w + at;
        uint32_t bits[LANES];
        for (int j = 0; j < LANES; j++) bits[j] = (uint32_t)h[j] << 16;
        memcpy(&v, bits, sizeof v);
    } else {
        const int8_t *q = (const int8_t *)w + at;
        float f[LANES];
        for (int j = 0; j < LANES; j++) f[j] = (float)q[j];
        memcpy(&v, f, sizeof v);
    }
    return v;
#endif
}

static inline float w_at(int kind, const void *w, int64_t at) {
    if (kind == F32) return ((const float *)w)[at];
    if (kind == BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)w)[at] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    return (float)((const int8_t *)w)[at];
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

/* dots[i][j] = x[m0 + i] . W[n0 + j] for i < mr, j < nr; mr and nr are constants where inlined */
static inline __attribute__((always_inline)) void tile(int kind, int mr, int nr, const float *x, int64_t ldx,
                                                       const void *w, int64_t K, int64_t n0, float dots[MR][NR]) {
    f32x16 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (f32x16){0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        f32x16 wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = load_w(kind, w, (n0 + j) * K + k);
        for (int i = 0; i < mr; i++) {
            f32x16 xv = load_x(x + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i][j] += xv * wv[j];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = lanes_sum(acc[i][j]);
            for (int64_t t = k; t < K; t++) s += x[i * ldx + t] * w_at(kind, w, (n0 + j) * K + t);
            dots[i][j] = s;
        }
}

#define TILES(KIND)                                                                                  \
    static void tile_##KIND(int mr, int nr, const float *x, int64_t ldx, const void *w, int64_t K,   \
                            int64_t n0, float dots[MR][NR]) {                                        \
        if (nr == NR && mr > 1) {                                                                    \
            switch (mr) {                                                                            \
                case 2: tile(KIND, 2, NR, x, ldx, w, K, n0, dots); return;                           \
                case 3: tile(KIND, 3, NR, x, ldx, w, K, n0, dots); return;                           \
                default: tile(KIND, 4, NR, x, ldx, w, K, n0, dots); return;                          \
            }                                                                                        \
        }                                                                                            \
        /* One row of x (a lone reply streams faster through one row of W at a time), or the last   \
         * rows of W: one dot at a time, the same sums. */                                           \
        float one[MR][NR];                                                                           \
        for (int j = 0; j < nr; j++)                                                                 \
            for (int i = 0; i < mr; i++) {                                                           \
                tile(KIND, 1, 1, x + i * ldx, ldx, w, K, n0 + j, one);                               \
                dots[i][j] = one[0][0];                                                              \
            }                                                                                        \
    }
TILES(F32)
TILES(BF16)
TILES(I8)

typedef void (*tile_fn)(int, int, const float *, int64_t, const void *, int64_t, int64_t, float[MR][NR]);

int glassbox_linear(int kind, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
                    const float *scale, const float *b, float *y, int threads) {
    tile_fn fn = kind == F32 ? tile_F32 : kind == BF16 ? tile_BF16 : kind == I8 ? tile_I8 : 0;
    if (!fn || M < 0 || K < 0 || N < 0) return -1;
    int64_t tiles = (N + NR - 1) / NR;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t n0 = t * NR;
        int nr = N - n0 < NR ? (int)(N - n0) : NR;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = M - m0 < MR ? (int)(M - m0) : MR;
            float dots[MR][NR];
            fn(mr, nr, x + m0 * ldx, ldx, w, K, n0, dots);
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    float v = dots[i][j];
                    if (scale) v *= scale[n0 + j];
                    if (b) v += b[n0 + j];
                    y[(m0 + i) * N + n0 + j] = v;
                }
        }
    }
    return 0;
}

/* One new token's attention over its own sequence's cache, every head. Its key and value are first
 * written at position `pos`, then
 *   out[h] = softmax(q[h] . K[h, :pos+1]ᵀ / sqrt(hs)) V[h, :pos+1]
 *   q, k, v, out (nh, hs) float32; K, V (nh, max_len, hs) float32 or bfloat16 (kv_kind: F32 or BF16),
 *   the new key and value rounded to it to nearest even, as torch rounds; the sums in float32.
 * One pass over K and one over V, each read once: the cache streams at the machine's bandwidth (torch's
 * fused CPU attention is built for many queries and reads a one-token step's cache slower). */
#include <math.h>
#include <stdlib.h>

static void store_row(int kind, void *dst, const float *src, int64_t n) {
    if (kind == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, src + i, sizeof bits);
        h[i] = (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  /* round to nearest even */
    }
}

int glassbox_attend(const float *q, const float *k, const float *v, int kv_kind, void *K, void *V, int64_t nh,
                    int64_t pos, int64_t max_len, int64_t hs, float *out, int threads) {
    if (nh < 0 || pos < 0 || pos >= max_len || hs < 1 || (kv_kind != F32 && kv_kind != BF16)) return -1;
    int64_t n = pos + 1;
    size_t item = kv_kind == F32 ? sizeof(float) : sizeof(uint16_t);
    float scale = 1.0f / sqrtf((float)hs);
    int failed = 0;
    #pragma omp parallel for num_threads(threads) schedule(static) reduction(|:failed)
    for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + h * hs;
        int64_t head = h * max_len * hs;  /* this head's first element in K and V */
        store_row(kv_kind, (char *)K + (size_t)(head + pos * hs) * item, k + h * hs, hs);
        store_row(kv_kind, (char *)V + (size_t)(head + pos * hs) * item, v + h * hs, hs);
        float *p = malloc((size_t)n * sizeof(float)), *oh = out + h * hs;
        if (!p) { failed = 1; continue; }
        float top = -INFINITY;
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) {  /* four positions at once: four independent sums in flight */
            int64_t at = head + t * hs;
            f32x16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            int64_t d = 0;
            for (; d + LANES <= hs; d += LANES) {
                f32x16 qv = load_x(qh + d);
                a0 += qv * load_w(kv_kind, K, at + d);
                a1 += qv * load_w(kv_kind, K, at + hs + d);
                a2 += qv * load_w(kv_kind, K, at + 2 * hs + d);
                a3 += qv * load_w(kv_kind, K, at + 3 * hs + d);
            }
            float s[4] = {lanes_sum(a0), lanes_sum(a1), lanes_sum(a2), lanes_sum(a3)};
            for (int i = 0; i < 4; i++) {
                for (int64_t e = d; e < hs; e++) s[i] += qh[e] * w_at(kv_kind, K, at + i * hs + e);
                p[t + i] = s[i] * scale;
                top = p[t + i] > top ? p[t + i] : top;
            }
        }
        for (; t < n; t++) {
            int64_t at = head + t * hs;
            f32x16 acc = {0};
            int64_t d = 0;
            for (; d + LANES <= hs; d += LANES) acc += load_x(qh + d) * load_w(kv_kind, K, at + d);
            float s = lanes_sum(acc);
            for (; d < hs; d++) s += qh[d] * w_at(kv_kind, K, at + d);
            p[t] = s * scale;
            top = p[t] > top ? p[t] : top;
        }
        float total = 0.0f;
        for (int64_t u = 0; u < n; u++) total += (p[u] = expf(p[u] - top));
        for (int64_t d = 0; d < hs; d++) oh[d] = 0.0f;
        for (int64_t u = 0; u < n; u++) {
            int64_t at = head + u * hs;
            float pu = p[u] / total;
            int64_t d = 0;
            for (; d + LANES <= hs; d += LANES) {
                f32x16 o = load_x(oh + d) + pu * load_w(kv_kind, V, at + d);
                memcpy(oh + d, &o, sizeof o);
            }
            for (; d < hs; d++) oh[d] += pu * w_at(kv_kind, V, at + d);
        }
        free(p);
    }
    return failed ? -2 : 0;
}
