/* What linear.c and linear_int8.c share: the shape of a tile, the int8 format and its quantized rows of x,
 * and the weights' prefetch. */
#ifndef GLASSBOX_TILES_H
#define GLASSBOX_TILES_H
#include "vectors.h"

enum { MR = 6, NR = 4 };  /* a tile: up to MR rows of x times NR rows of W (24 sums in registers) */
enum { I8 = 2 };          /* int8 weights (F32 and BF16: vectors.h) */

/* Each weight is read once per step: the AVX-512 tiles of 2 to 6 rows of bfloat16 or int8 weights ask for
 * it AHEAD bytes early, with the hint that it will not be used again soon (non-temporal), so that the
 * stream runs ahead of the hardware's own prefetcher and does not push the rest of the process (the
 * interpreter between calls included) out of the caches. Not for float32 weights, nor for a tile of one
 * row: the hardware's prefetcher alone streams those faster (docs/benchmarks.md, "One stream on the AMD
 * EPYC with AVX-512, model 17"). The AVX2 build's int8 tiles ask at every size (not measured without). */
enum { AHEAD = 8192 };
#define PREFETCH(p) __builtin_prefetch((const char *)(p) + AHEAD, 0, 0)

/* int8 weights meet int8 activations, as llama.cpp's q8_0 does: each row of x is quantized in blocks of
 * QBLOCK values (one float32 scale each, absmax / 127, rounded to nearest even), and each output is then a
 * sum over chunks of QCHUNK = 2 blocks of
 *     float(lane dots) * (the block's x scale),   lane j's dot = sum of 4 products x_q[4j..4j+3] * w[4j..4j+3]
 * in 16 float32 lanes, exact in integers within a chunk; times the weight row's scale at the end. AVX-512
 * VNNI computes a chunk's 16 lane dots in one instruction (64 int8 weights, no widening); elsewhere a
 * loop computes the same integers. A row's result depends only on that row: row invariance holds. */
enum { QBLOCK = 32, QCHUNK = 64 };

typedef struct {        /* x quantized: per row, chunks * QCHUNK bytes and chunks * LANES scales */
    const uint8_t *xu;  /* x_q + 128 (unsigned, as VNNI multiplies), zero-padded to whole chunks */
    const float *xs;    /* each chunk's lane scales: 8 lanes per block */
    int64_t chunks;
} q8rows;

/* x's rows quantized for int8 weights, each row on one thread; the int8 tiles (linear.c's tiles, for int8) */
__attribute__((visibility("hidden"))) void quantize_rows(const float *x, int64_t M, int64_t K, int64_t ldx,
                                                         uint8_t *xu, float *xs, int threads);
__attribute__((visibility("hidden"))) void tiles_q8(int mr, int nr, q8rows x, const int8_t *w, int64_t K,
                                                    int64_t n0, float dots[MR][NR]);
/* a lone row's int8 outputs, each thread a run of them: 0 done, 1 not in this build (the tiles instead), < 0 failed */
__attribute__((visibility("hidden"))) int lone_row_q8(q8rows x, const int8_t *w, int64_t K, int64_t N,
                                                      const float *scale, const float *b, float *y, int threads);

/* An output's last touch, the same wherever its dot was summed: y = dot * scale + b (each when given; only
 * int8 weights have a scale). Fused on purpose where both are: left to the compiler, some call sites were fused
 * and others not, and an int8 row's last bit then depended on which path summed it (alone or in a batch). */
static inline float finish_dot(float dot, const float *scale, const float *b, int64_t n) {
    if (scale && b) return fmaf(dot, scale[n], b[n]);
    if (scale) return dot * scale[n];
    return b ? dot + b[n] : dot;
}
#endif
