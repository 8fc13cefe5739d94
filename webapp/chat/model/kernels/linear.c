/* Glassbox's decode kernel for the linear layers: y = (x @ Wᵀ) * scale + b for a few rows of x, the
 * weights read once (glassbox_linear). Attention over the KV cache is attend.c's.
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
 * whichever thread computes it. float32 and bfloat16 weights are widened to float32 exactly (bfloat16
 * by a shift); products and sums are float32. int8 weights are multiplied by int8-quantized activations
 * instead (linear_int8.c).
 *
 * Batches: a tile holds up to MR = 6 rows of x by NR = 4 weight rows, 24 sums in registers, so each
 * weight vector loaded is used for 6 rows (16 rows pass over a weight tile 3 times, from L1 or L2, where
 * rows one at a time would stream it from memory 16 times). Tiles change which sums are in flight
 * together, never the order within one, so float32 results are the same bits as one row alone.
 * On a CPU with AMX, bfloat16 and int8 weights go to amx.c's tile products instead, for every batch size
 * alike (their sums are in amx.c's order, the same for a row alone as in a batch).
 *
 * Around the product, what a transformer block does next to it, so that a decode step makes one call where
 * it would make four: a layer norm of x before, GELU and a residual add after (glassbox_linear's last
 * arguments).
 *
 * Written with GCC's vector extensions (AVX-512 intrinsics to widen weights and for VNNI): one source for
 * AVX-512, AVX2 or SSE, compiled for the machine it runs on (webapp/chat/model/kernels/__init__.py). On
 * AVX2 without AVX-512 the tiles and the lone row are written in 8-lane intrinsics instead (linear_avx2.h: GCC
 * keeps 16-lane vectors in memory there), the same sums in the same order (-DGLASSBOX_GENERIC_TILES builds the
 * generic ones).
 */
#include "tiles.h"


/* A batch of more than MR rows passes over a tile of weights more than once: the first pass reads them from
 * memory, the later ones from the caches. A later pass asks for the next tile's weights into L2 meanwhile,
 * so that the next first pass finds them there instead of waiting on memory while the multiply-adds idle
 * (docs/benchmarks.md, "The batched step on the AMD EPYC with AVX-512"). A tile's `next` says which pass it
 * is: STREAM, the only pass (at most MR rows; bfloat16 batches of two or more prefetch AHEAD, tiles.h); CACHED, a
 * pass that prefetches nothing (the first of several, or a later one with no next tile); or the first row
 * of the next tile (a later pass). */
enum { STREAM = -1, CACHED = -2 };
static inline __attribute__((always_inline)) void prefetch_next_tile(int kind, const void *w, int64_t at) {
    if (kind == F32 || at % 32 == 0)  /* a line each: 16 float32 weights, or 32 bfloat16 */
        __builtin_prefetch((const char *)w + at * (kind == F32 ? 4 : 2), 0, 2);
}

static float *floats(int64_t n) {
    return scratch(n * (int64_t)sizeof(float));
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && !defined(GLASSBOX_GENERIC_TILES)
#include "linear_avx2.h"
#else
/* Holds a vector in a register for all its uses. Left to itself GCC keeps only one side of a tile in
 * registers and folds the other into every multiply-add as a memory operand, loading it again each time
 * (a 6-by-4 tile made 28 loads for 24 multiply-adds, and waited on the loads). With both sides held, 10.
 * It changes which instructions load, never the multiply-adds or their order. */
#ifdef __AVX512F__
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

enum { LONG_ROW_OUTPUTS = NR };  /* lone_row below: outputs at a time on long rows */

/* dots[i][j] = x[m0 + i] . W[n0 + j] for i < mr, j < nr; mr and nr are constants where inlined */
static inline __attribute__((always_inline)) void tile(int kind, int mr, int nr, const float *x, int64_t ldx,
                                                       const void *w, int64_t K, int64_t n0, float dots[MR][NR],
                                                       int64_t next) {
    f32x16 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (f32x16){0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        f32x16 wv[NR];
        for (int j = 0; j < nr; j++) {
            wv[j] = load_w(kind, w, (n0 + j) * K + k);
            if (kind != F32 && mr > 1 && next == STREAM) PREFETCH((const uint16_t *)w + (n0 + j) * K + k);
            if (mr > 1) IN_REGISTER(wv[j]);
            if (next >= 0) prefetch_next_tile(kind, w, (next + j) * K + k);
        }
        for (int i = 0; i < mr; i++) {
            f32x16 xv = load_x(x + i * ldx + k);
            if (mr > 1) IN_REGISTER(xv);
            for (int j = 0; j < nr; j++) acc[i][j] += xv * wv[j];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = lanes_sum(acc[i][j]);
            /* fused on purpose: left to the compiler, `s += x * w` was fused in some instantiations of a tile
             * and not in others (a lone row's, a batch's), and a row's bits then depended on its batch */
            for (int64_t t = k; t < K; t++) s = fmaf(x[i * ldx + t], w_at(kind, w, (n0 + j) * K + t), s);
            dots[i][j] = s;
        }
}

/* float32 and bfloat16 weights, widened as they are read */
#define TILES(KIND)                                                                                  \
    static void tiles_##KIND(int mr, int nr, const float *x, int64_t ldx, const void *w, int64_t K,  \
                             int64_t n0, float dots[MR][NR], int64_t next) {                         \
        if (nr == NR && mr > 1) {                                                                    \
            switch (mr) {                                                                            \
                case 2: tile(KIND, 2, NR, x, ldx, w, K, n0, dots, next); return;                     \
                case 3: tile(KIND, 3, NR, x, ldx, w, K, n0, dots, next); return;                     \
                case 4: tile(KIND, 4, NR, x, ldx, w, K, n0, dots, next); return;                     \
                case 5: tile(KIND, 5, NR, x, ldx, w, K, n0, dots, next); return;                     \
                default: tile(KIND, 6, NR, x, ldx, w, K, n0, dots, next); return;                    \
            }                                                                                        \
        }                                                                                            \
        /* A batch's one last row (a row streams faster through one row of W at a time), or the     \
         * last rows of W: one dot at a time, the same sums. */                                      \
        float one[MR][NR];                                                                           \
        for (int j = 0; j < nr; j++)                                                                 \
            for (int i = 0; i < mr; i++) {                                                           \
                tile(KIND, 1, 1, x + i * ldx, ldx, w, K, n0 + j, one, next < 0 ? next : next + j);    \
                dots[i][j] = one[0][0];                                                              \
            }                                                                                        \
    }
#endif
TILES(F32)
TILES(BF16)

#ifndef AVX2_LONE_ROW
/* One row of x (a lone reply's decode step): outputs n0 to n1, one after another straight through the
 * weights, the sums of a one-row tile. Through the tiles' loop (a call per four outputs) the same sums streamed
 * slower. Rows of LONG_ROW weights or more go LONG_ROW_OUTPUTS outputs at a time, each x vector loaded once for
 * all of them: there x (16 KiB of float32 at 4,096) is large enough that the weights streaming through L1 push
 * it out. Shorter rows streamed slower that way (docs/benchmarks.md, "A lone row straight through the weights"). */
enum { LONG_ROW = 4096 };
#define LONE_ROW(KIND)                                                                                                \
    static __attribute__((noinline)) void lone_row_##KIND(const float *x, const float *xp, const void *w, int64_t K,  \
                                                          int64_t n0, int64_t n1, const float *scale, const float *b, \
                                                          float *y) {                                                 \
        (void)xp;  /* the AVX2 build's */                                                                             \
        int64_t n = n0;                                                                                               \
        float dot[MR][NR];                                                                                            \
        if (LONG_ROW_OUTPUTS > 1 && K >= LONG_ROW)                                                                    \
            for (; n + LONG_ROW_OUTPUTS <= n1; n += LONG_ROW_OUTPUTS) {                                               \
                tile(KIND, 1, LONG_ROW_OUTPUTS, x, K, w, K, n, dot, STREAM);                                          \
                for (int j = 0; j < LONG_ROW_OUTPUTS; j++) y[n + j] = finish_dot(dot[0][j], scale, b, n + j);         \
            }                                                                                                         \
        for (; n < n1; n++) {                                                                                         \
            tile(KIND, 1, 1, x, K, w, K, n, dot, STREAM);                                                             \
            y[n] = finish_dot(dot[0][0], scale, b, n);                                                                \
        }                                                                                                             \
    }
#endif
LONE_ROW(F32)
LONE_ROW(BF16)

/* What surrounds a linear layer in a transformer block, done here rather than by a library call each: a
 * layer norm of the input rows (over K, float32 sums), and GELU and a residual add on the outputs. The rows
 * of a batch are normed (and int8's quantized) on all the threads, each row by one thread, in its own order:
 * one thread alone kept the other waiting. */
static void layer_norm_rows(const float *x, int64_t M, int64_t K, int64_t ldx, const float *g, const float *beta,
                            float eps, float *out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * ldx;
        float sum = 0.0f, sq = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += row[k];
        float mean = sum / (float)K;
        for (int64_t k = 0; k < K; k++) sq += (row[k] - mean) * (row[k] - mean);
        float rstd = 1.0f / sqrtf(sq / (float)K + eps);
        for (int64_t k = 0; k < K; k++) out[m * K + k] = (row[k] - mean) * rstd * g[k] + (beta ? beta[k] : 0.0f);
    }
}

/* GELU with erf (as torch's default), 16 at a time: erf by Abramowitz and Stegun's 7.1.26, within 1.5e-7
 * of it, its e^(-z^2) by exp16. */
static inline f32x16 gelu16(f32x16 v) {
    f32x16 z = v * 0.70710678118654752f;
    i32x16 negative = less16(z, (f32x16){0});
    f32x16 a = where(negative, -z, z);
    f32x16 t = 1.0f / (1.0f + 0.3275911f * a);
    f32x16 poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    f32x16 erf_a = 1.0f - poly * exp16(-(a * a));
    return 0.5f * v * (1.0f + where(negative, -erf_a, erf_a));
}

/* Below this many outputs they are finished on one thread: sharing them would cost more than it saves */
enum { FINISH_ALONE = 8192 };

/* y = gelu(y) (when asked) + residual (when given), over M * N outputs, 16 at a time, shared among the threads
 * (each output on its own: the same bits however they are shared) */
static void finish_outputs(float *y, int64_t count, int gelu, const float *residual, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (count >= FINISH_ALONE)
    for (int64_t i = 0; i < count; i += LANES) {
        int64_t n = count - i < LANES ? count - i : LANES;
        f32x16 v, add = {0};  /* zeros added even without a residual: -0 becomes +0 either way */
        if (n == LANES) {     /* whole vectors straight from y (the copies were calls to memcpy) */
            v = load_x(y + i);
            if (residual) add = load_x(residual + i);
        } else {
            float part[LANES] = {0}, more[LANES] = {0};
            memcpy(part, y + i, (size_t)n * sizeof(float));
            if (residual) memcpy(more, residual + i, (size_t)n * sizeof(float));
            v = load_x(part), add = load_x(more);
        }
        if (gelu) v = gelu16(v);
#if defined(__AVX2__) && !defined(__AVX512F__)
        __asm__("" : "+m"(v));  /* GELU's last product and the add stay two operations there, as before */
#endif
        v += add;
        if (n == LANES) memcpy(y + i, &v, sizeof v);
        else memcpy(y + i, &v, (size_t)n * sizeof(float));
    }
}

/* Rows of x by tiles of up to MR rows and NR outputs, the tiles (outputs) shared among the threads; q: x
 * quantized, for int8 weights */
static void tiled(int kind, const float *x, q8rows q, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
                  const float *scale, const float *b, float *y, int threads) {
    int64_t tiles = (N + NR - 1) / NR;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t n0 = t * NR;
        int nr = N - n0 < NR ? (int)(N - n0) : NR;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = M - m0 < MR ? (int)(M - m0) : MR;
            float dots[MR][NR];
            if (kind == I8) {
                q8rows xm = {q.xu + m0 * q.chunks * QCHUNK, q.xs + m0 * q.chunks * LANES, q.chunks};
                tiles_q8(mr, nr, xm, w, K, n0, dots);
            } else {
                int64_t next = M <= MR ? STREAM : m0 == 0 || n0 + 2 * NR > N ? CACHED : n0 + NR;
                (kind == F32 ? tiles_F32 : tiles_BF16)(mr, nr, x + m0 * ldx, ldx, w, K, n0, dots, next);
            }
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) y[(m0 + i) * N + n0 + j] = finish_dot(dots[i][j], scale, b, n0 + j);
        }
    }
}

/* y = act(layer_norm(x) @ Wᵀ * scale + b) + residual; norm_w NULL: no layer norm (norm_b NULL: none of its
 * bias), gelu 0: no activation, residual NULL: nothing added ((M, N) contiguous otherwise). */
int glassbox_linear(int kind, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int64_t N,
                    const float *scale, const float *b, float *y, int threads, const float *norm_w,
                    const float *norm_b, float eps, int gelu, const float *residual) {
    if ((kind != F32 && kind != BF16 && kind != I8) || M < 0 || K < 0 || N < 0) return -1;
    q8rows q = {0, 0, (K + QCHUNK - 1) / QCHUNK};
    uint8_t *xu = 0;
    float *xs = 0, *normed = 0;
    if (norm_w) {
        if (!(normed = scratch(M * K * (int64_t)sizeof(float)))) return -2;
        layer_norm_rows(x, M, K, ldx, norm_w, norm_b, eps, normed, threads);
        x = normed, ldx = K;
    }
    if (kind != F32) {  /* AMX's tiles where the CPU has them (amx.c), for every batch size alike */
        int status = amx_linear(kind, x, M, K, ldx, w, N, scale, b, y, threads);
        if (status <= 0) {
            if (!status && (gelu || residual)) finish_outputs(y, M * N, gelu, residual, threads);
            free(normed);
            return status;
        }
    }
    if (M == 1 && kind != I8) {  /* a lone row: each thread one run of the outputs */
        float *xp = 0;
#ifdef AVX2_LONE_ROW
        if (kind == BF16) {
            if (!(xp = floats(K))) { free(normed); return -2; }
            permute_for_unpack(x, K, xp);
        }
#endif
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < threads; r++)
            (kind == F32 ? lone_row_F32 : lone_row_BF16)(x, xp, w, K, N * r / threads, N * (r + 1) / threads, scale, b,
                                                         y);
        free(xp);
    } else {
        if (kind == I8) {
            xu = scratch(M * q.chunks * QCHUNK);
            xs = scratch(M * q.chunks * LANES * (int64_t)sizeof(float));
            if (!xu || !xs) { free(xu); free(xs); free(normed); return -2; }
            quantize_rows(x, M, K, ldx, xu, xs, threads);
            q.xu = xu, q.xs = xs;
        }
        int status = kind == I8 && M == 1 ? lone_row_q8(q, w, K, N, scale, b, y, threads) : 1;
        if (status == 1) tiled(kind, x, q, M, K, ldx, w, N, scale, b, y, threads);
        if (status < 0) { free(xu); free(xs); free(normed); return status; }
    }
    if (gelu || residual) finish_outputs(y, M * N, gelu, residual, threads);
    free(xu);
    free(xs);
    free(normed);
    return 0;
}

/* One transformer block's decode step for M new tokens, each row a sequence of its own (its own cache and
 * position), in place on x (M, C):  x += attention(ln_1(x));  x += mlp(ln_2(x))  -- the calls a decode step
 * would make one by one, in one call (a step is short: the interpreter's time between calls adds up).
 *   p: the block's parameters in nanoGPT's order -- ln_1 weight, bias; c_attn weight, scale, bias; attn
 *      c_proj weight, scale, bias; ln_2 weight, bias; c_fc weight, scale, bias; mlp c_proj weight, scale,
 *      bias (scales and biases may be NULL); every weight of format `kind`
 *   K[r], V[r]: row r's cache of this layer, (nh, max_len, hs) of kv_kind; pos[r]: its new position */
int glassbox_block(int kind, int kv_kind, float *x, int64_t M, int64_t C, int64_t nh, const void *const *p,
                   float eps, void *const *K, void *const *V, const int64_t *pos, int64_t max_len, int threads) {
    if (M < 1 || C < 1 || nh < 1 || C % nh) return -1;
    float *qkv = floats(M * 3 * C), *heads = floats(M * C), *mid = floats(M * C), *hidden = floats(M * 4 * C);
    int status = !qkv || !heads || !mid || !hidden ? -2 : 0;
    if (!status)
        status = glassbox_linear(kind, x, M, C, C, p[2], 3 * C, p[3], p[4], qkv, threads, p[0], p[1], eps, 0, 0);
    /* Attention row by row, each row's heads one thread's each as glassbox_attend does them (so the same
     * sums): the rows shared among the threads in one parallel region where there are rows enough, rather
     * than a region per row (each a fork and a join, and on a busy machine a wait for a preempted thread) */
    if (!status && M >= threads) {
        int failed = 0;
        #pragma omp parallel for num_threads(threads) schedule(static) reduction(|:failed)
        for (int64_t r = 0; r < M; r++) {
            const float *row = qkv + r * 3 * C;  /* q, k and v side by side */
            failed |= glassbox_attend(row, row + C, row + 2 * C, kv_kind, K[r], V[r], nh, pos[r], max_len, C / nh,
                                      heads + r * C, 1) != 0;
        }
        status = failed ? -2 : 0;
    }
    for (int64_t r = 0; r < M && M < threads && !status; r++) {
        const float *row = qkv + r * 3 * C;
        status = glassbox_attend(row, row + C, row + 2 * C, kv_kind, K[r], V[r], nh, pos[r], max_len, C / nh,
                                 heads + r * C, threads);
    }
    if (!status)  /* mid = x + attention */
        status = glassbox_linear(kind, heads, M, C, C, p[5], C, p[6], p[7], mid, threads, 0, 0, 0.0f, 0, x);
    if (!status)
        status = glassbox_linear(kind, mid, M, C, C, p[10], 4 * C, p[11], p[12], hidden, threads, p[8], p[9], eps, 1,
                                 0);
    if (!status)  /* x = mid + mlp */
        status = glassbox_linear(kind, hidden, M, 4 * C, 4 * C, p[13], C, p[14], p[15], x, threads, 0, 0, 0.0f, 0,
                                 mid);
    free(qkv);
    free(heads);
    free(mid);
    free(hidden);
    return status;
}
