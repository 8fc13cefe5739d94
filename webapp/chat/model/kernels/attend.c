/* One new token's attention over its own sequence's cache, every head (glassbox_attend). Its key and
 * value are first written at position `pos`, then
 *   out[h] = softmax(q[h] . K[h, :pos+1]ᵀ / sqrt(hs)) V[h, :pos+1]
 *   q, k, v, out (nh, hs) float32; K, V (nh, max_len, hs) float32 or bfloat16 (kv_kind: F32 or BF16),
 *   the new key and value rounded to it to nearest even, as torch rounds; the sums in float32.
 *
 * One pass over K and one over V, each read once, one head per thread at a time: the cache should stream
 * at the machine's bandwidth, and would not if each position paid for its own sum across lanes, its own
 * exp and a trip of the output through memory. So scores are made 16 positions at a time (their 16 sums
 * across lanes done together: sum16), exponentials 16 at a time (exp16), and the output stays in registers
 * while V streams past. Each head is one thread's, start to end: the result does not depend on the thread
 * count. Head sizes that are not a multiple of 16 (or over MAX_HS) take the plain path (attend_plain).
 */
#include "vectors.h"

enum { MAX_HS = 128 };  /* the register path's largest head size: q and two sets of outputs in registers */

static void store_row(int kind, void *dst, const float *src, int64_t n) {
    if (kind == F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = to_bf16(src[i]);
}

/* e^x, 16 at a time, for x <= 0 (a score less the largest): 2^n * e^r, r = x - n ln 2 in [-ln2/2, ln2/2],
 * e^r by Cephes' degree-6 polynomial (within 2 ulp); below -87 (e^x under float32's smallest normal) 0. */
/* out[i] = the sum of a[i]'s 16 lanes, for 16 vectors at once: pairs, then quads, then across the four
 * 128-bit quarters, with shuffles (one sum across lanes costs as much as these 45 operations do for 16). */
static inline f32x16 sum16(const f32x16 a[16]) {
#ifdef __AVX512F__
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) {
        __m512 x = (__m512)a[2 * i], y = (__m512)a[2 * i + 1];
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    return (f32x16)_mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
#else
    float s[LANES];
    for (int i = 0; i < LANES; i++) s[i] = lanes_sum(a[i]);
    return load_x(s);
#endif
}

static inline float lanes_max(f32x16 v) {
    float s[LANES], top = -INFINITY;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < LANES; i++) top = s[i] > top ? s[i] : top;
    return top;
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && !defined(GLASSBOX_GENERIC_TILES)
/* AVX2 without AVX-512 (GCC keeps 16-lane vectors in memory there, see linear.c): the generic head below,
 * the same operations in the same order in pairs of 8-lane registers -- a score's lanes summed by
 * lanes_sum's tree, the output's 16-lane slices over V (each its even and odd sums), the
 * exponentials as they are -- every product and add fused. (GCC's generic code leaves some of them unfused
 * in the head size 64 instantiation, so there the last bits differ from a -DGLASSBOX_GENERIC_TILES build;
 * a row alone and in a batch take this same code either way.) */
static inline __attribute__((always_inline)) void attend_head(int kind, int hv, const float *qh, const void *K,
                                                              const void *V, int64_t head, int64_t n, float scale,
                                                              float *p, float *oh) {
    const int64_t hs = 16 * hv;
    __m256 ql[MAX_HS / LANES], qh8[MAX_HS / LANES];
    __m256 sc = _mm256_set1_ps(scale);
    for (int d = 0; d < hv; d++) {
        ql[d] = _mm256_mul_ps(_mm256_loadu_ps(qh + 16 * d), sc);
        qh8[d] = _mm256_mul_ps(_mm256_loadu_ps(qh + 16 * d + 8), sc);
    }
    /* While the scores read K, each position's row of V is asked for into L2: the output's pass over V found
     * it in memory and waited there (a head's V is a short stream, the hardware's prefetcher ramped up late) */
    float top = -INFINITY;
    const int64_t item = kind == F32 ? 4 : 2, line = 64 / item;
    for (int64_t t = 0; t < n; t++) {
        int64_t at = head + t * hs;
        for (int64_t l = 0; l < hs; l += line) __builtin_prefetch((const char *)V + (at + l) * item, 0, 2);
        __m256 lo = _mm256_mul_ps(ql[0], load8_w(kind, K, at)), hi = _mm256_mul_ps(qh8[0], load8_w(kind, K, at + 8));
        for (int d = 1; d < hv; d++) {
            lo = _mm256_fmadd_ps(ql[d], load8_w(kind, K, at + 16 * d), lo);
            hi = _mm256_fmadd_ps(qh8[d], load8_w(kind, K, at + 16 * d + 8), hi);
        }
        p[t] = lanes_sum8x2(lo, hi);
        top = p[t] > top ? p[t] : top;
    }
    for (int64_t u = n; u % LANES; u++) p[u] = -INFINITY;  /* whole vectors below: e^-inf = 0 */
    f32x16 total16 = {0};
    for (int64_t u = 0; u < n; u += LANES) {
        f32x16 e = exp16(load_x(p + u) - top);
        memcpy(p + u, &e, sizeof e);
        total16 += e;
    }
    float inv = 1.0f / lanes_sum(total16);
    __m256 inv8 = _mm256_set1_ps(inv);
    /* the output's 16-lane slices two at a time over V (eight sums in registers): V's rows stream past half as
     * often. bfloat16 is widened by unpacking against zeros (one instruction for 8 values where a zero-extension
     * and a shift took two each), which leaves a slice's lanes in the order [0-3, 8-11], [4-7, 12-15]: the sums
     * are lane by lane, so they are put back in order at the end, the same bits. */
    const __m256i zero = _mm256_setzero_si256();
    for (int d0 = 0; d0 < hv; d0 += 2) {
        int slices = hv - d0 >= 2 ? 2 : 1;
        __m256 el[2], eh[2], ol[2], oh8[2];
        for (int s = 0; s < slices; s++) el[s] = eh[s] = ol[s] = oh8[s] = _mm256_setzero_ps();
        for (int64_t u = 0; u < n; u += 2) {
            int odd = u + 1 < n;
            __m256 pe = _mm256_set1_ps(p[u]), po = _mm256_set1_ps(odd ? p[u + 1] : 0.0f);
            for (int s = 0; s < slices; s++) {
                int64_t at = head + u * hs + 16 * (d0 + s);
                if (kind == F32) {
                    el[s] = _mm256_fmadd_ps(pe, _mm256_loadu_ps((const float *)V + at), el[s]);
                    eh[s] = _mm256_fmadd_ps(pe, _mm256_loadu_ps((const float *)V + at + 8), eh[s]);
                    if (odd) {
                        ol[s] = _mm256_fmadd_ps(po, _mm256_loadu_ps((const float *)V + at + hs), ol[s]);
                        oh8[s] = _mm256_fmadd_ps(po, _mm256_loadu_ps((const float *)V + at + hs + 8), oh8[s]);
                    }
                } else {
                    __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)V + at));
                    el[s] = _mm256_fmadd_ps(pe, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), el[s]);
                    eh[s] = _mm256_fmadd_ps(pe, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), eh[s]);
                    if (odd) {
                        v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)V + at + hs));
                        ol[s] = _mm256_fmadd_ps(po, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), ol[s]);
                        oh8[s] = _mm256_fmadd_ps(po, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), oh8[s]);
                    }
                }
            }
        }
        for (int s = 0; s < slices; s++) {
            __m256 a = _mm256_mul_ps(_mm256_add_ps(el[s], ol[s]), inv8), b = _mm256_mul_ps(_mm256_add_ps(eh[s], oh8[s]), inv8);
            if (kind == BF16) {
                __m256 lo = _mm256_permute2f128_ps(a, b, 0x20);
                b = _mm256_permute2f128_ps(a, b, 0x31), a = lo;
            }
            _mm256_storeu_ps(oh + 16 * (d0 + s), a);
            _mm256_storeu_ps(oh + 16 * (d0 + s) + 8, b);
        }
    }
}
#else
/* One head, hs = 16 * hv: p (n scores, room for a multiple of 16) is scratch. kind and hv are constants
 * where inlined. */
static inline __attribute__((always_inline)) void attend_head(int kind, int hv, const float *qh, const void *K,
                                                              const void *V, int64_t head, int64_t n, float scale,
                                                              float *p, float *oh) {
    const int64_t hs = 16 * hv;
    f32x16 qv[MAX_HS / LANES];
    for (int d = 0; d < hv; d++) qv[d] = load_x(qh + 16 * d) * scale;
    f32x16 top16 = (f32x16){0} - INFINITY;
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES) {  /* 16 positions' scores */
        f32x16 a[LANES];
        for (int i = 0; i < LANES; i++) {
            int64_t at = head + (t + i) * hs;
            a[i] = qv[0] * load_w(kind, K, at);
            for (int d = 1; d < hv; d++) a[i] += qv[d] * load_w(kind, K, at + 16 * d);
        }
        f32x16 s = sum16(a);
        memcpy(p + t, &s, sizeof s);
        top16 = where(s > top16, s, top16);
    }
    float top = lanes_max(top16);
    for (; t < n; t++) {  /* the last few, one at a time */
        int64_t at = head + t * hs;
        f32x16 a = qv[0] * load_w(kind, K, at);
        for (int d = 1; d < hv; d++) a += qv[d] * load_w(kind, K, at + 16 * d);
        p[t] = lanes_sum(a);
        top = p[t] > top ? p[t] : top;
    }
    for (int64_t u = n; u % LANES; u++) p[u] = -INFINITY;  /* whole vectors below: e^-inf = 0 */
    f32x16 total16 = {0};
    for (int64_t u = 0; u < n; u += LANES) {
        f32x16 e = exp16(load_x(p + u) - top);
        memcpy(p + u, &e, sizeof e);
        total16 += e;
    }
    /* out = sum of p[u] V[u], two sets of sums (even and odd u) so that each add waits on half as many */
    f32x16 even[MAX_HS / LANES], odd[MAX_HS / LANES];
    for (int d = 0; d < hv; d++) even[d] = odd[d] = (f32x16){0};
    int64_t u = 0;
    for (; u + 2 <= n; u += 2) {
        int64_t at = head + u * hs;
        for (int d = 0; d < hv; d++) {
            even[d] += p[u] * load_w(kind, V, at + 16 * d);
            odd[d] += p[u + 1] * load_w(kind, V, at + hs + 16 * d);
        }
    }
    if (u < n)
        for (int d = 0; d < hv; d++) even[d] += p[u] * load_w(kind, V, head + u * hs + 16 * d);
    float inv = 1.0f / lanes_sum(total16);
    for (int d = 0; d < hv; d++) {
        f32x16 o = (even[d] + odd[d]) * inv;
        memcpy(oh + 16 * d, &o, sizeof o);
    }
}
#endif

/* Any head size: one position at a time. */
static void attend_plain(int kind, const float *qh, const void *K, const void *V, int64_t head, int64_t n,
                         int64_t hs, float scale, float *p, float *oh) {
    float top = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        int64_t at = head + t * hs, d = 0;
        f32x16 acc = {0};
        for (; d + LANES <= hs; d += LANES) acc += load_x(qh + d) * load_w(kind, K, at + d);
        float s = lanes_sum(acc);
        for (; d < hs; d++) s += qh[d] * w_at(kind, K, at + d);
        p[t] = s * scale;
        top = p[t] > top ? p[t] : top;
    }
    float total = 0.0f;
    for (int64_t u = 0; u < n; u++) total += (p[u] = expf(p[u] - top));
    for (int64_t d = 0; d < hs; d++) oh[d] = 0.0f;
    for (int64_t u = 0; u < n; u++) {
        float pu = p[u] / total;
        for (int64_t d = 0; d < hs; d++) oh[d] += pu * w_at(kind, V, head + u * hs + d);
    }
}

int glassbox_attend(const float *q, const float *k, const float *v, int kv_kind, void *K, void *V, int64_t nh,
                    int64_t pos, int64_t max_len, int64_t hs, float *out, int threads) {
    if (nh < 0 || pos < 0 || pos >= max_len || hs < 1 || (kv_kind != F32 && kv_kind != BF16)) return -1;
    int64_t n = pos + 1;
    size_t item = kv_kind == F32 ? sizeof(float) : sizeof(uint16_t);
    float scale = 1.0f / sqrtf((float)hs);
    int hv = hs % LANES == 0 && hs <= MAX_HS ? (int)(hs / LANES) : 0;  /* 0: the plain path */
    int failed = 0;
    #pragma omp parallel for num_threads(threads) schedule(static) reduction(|:failed)
    for (int64_t h = 0; h < nh; h++) {
        int64_t head = h * max_len * hs;  /* this head's first element in K and V */
        store_row(kv_kind, (char *)K + (size_t)(head + pos * hs) * item, k + h * hs, hs);
        store_row(kv_kind, (char *)V + (size_t)(head + pos * hs) * item, v + h * hs, hs);
        float *p = scratch((n + LANES) * (int64_t)sizeof(float));  /* room for whole vectors past n */
        if (!p) { failed = 1; continue; }
        const float *qh = q + h * hs;
        float *oh = out + h * hs;
        if (hv == 4 && kv_kind == F32) attend_head(F32, 4, qh, K, V, head, n, scale, p, oh);  /* GPT-2's 64 */
        else if (hv == 4) attend_head(BF16, 4, qh, K, V, head, n, scale, p, oh);
        else if (hv && kv_kind == F32) attend_head(F32, hv, qh, K, V, head, n, scale, p, oh);
        else if (hv) attend_head(BF16, hv, qh, K, V, head, n, scale, p, oh);
        else attend_plain(kv_kind, qh, K, V, head, n, hs, scale, p, oh);
        free(p);
    }
    return failed ? -2 : 0;
}
