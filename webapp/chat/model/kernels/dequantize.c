/* int8 weights widened back for a product of many rows (webapp/chat/model/precision.py, int8_matmul):
 *   out[n, k] = w[n, k] * scale[n]
 * the float32 product rounded once, then to bfloat16 to nearest even where asked -- the bits torch's
 * (w * scale[:, None]).to(dtype) gives, in one pass over the weights on every thread instead of three passes
 * (widen, multiply, narrow) on tensors the size of the layer. */
#include "vectors.h"

int glassbox_dequantize(const int8_t *w, const float *scale, int64_t N, int64_t K, int kind, void *out, int threads) {
    if (N < 0 || K < 0 || (kind != F32 && kind != BF16)) return -1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *row = w + n * K;
        const float s = scale[n];
        if (kind == F32) {
            float *o = (float *)out + n * K;
            for (int64_t k = 0; k < K; k++) o[k] = (float)row[k] * s;
        } else {
            uint16_t *o = (uint16_t *)out + n * K;
            for (int64_t k = 0; k < K; k++) o[k] = to_bf16((float)row[k] * s);
        }
    }
    return 0;
}
