/* Attention for the few query rows that decoding and verifying feed, each row alone over exactly the
 * cache entries it may see (specviz/cpu/decoder.py). Built into one library with rows_kernel.c.
 *
 * A row's entries are the committed prefix, then the uncommitted entries its mask shows, in cache
 * order. Every sum below runs over those entries in that order, with the same vector code whatever
 * rows come with it, so a tree node's result is the same bits as plain decoding gives the same token
 * (the same entries, in the same order, wherever they sit in the cache). No entry is ever copied. Written on
 * simd.h's 8-float helpers: the same operations in the same order on every instruction set. */
#include "simd.h"
#include "specviz_cpu.h"
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0
#endif

/* a . b over D floats (D a multiple of 8), two accumulators in a fixed order */
static inline float dot(const float *a, const float *b, int D) {
    F8 s0 = f8_zero(), s1 = f8_zero();
    int i = 0;
    for (; i + 16 <= D; i += 16) {
        s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
        s1 = f8_fma(f8_load(a + i + 8), f8_load(b + i + 8), s1);
    }
    if (i < D) s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
    return f8_sum(f8_add(s0, s1));
}

/* q: [n, heads, D] (rotary applied); k, v: one layer's cache, [kv_heads, capacity, D];
 * visible: [n, cols] bytes, which of the entries committed .. committed + cols - 1 each row sees;
 * out: [n, heads, D]. Query head h reads kv head h / (heads / kv_heads), as grouped-query attention does.
 * scratch: threads * (E ints + G * E floats), E = committed + cols, G = heads / kv_heads. */
void attend_rows(const float *q, const float *k, const float *v, const uint8_t *visible, float *out,
                 int n, int heads, int kv_heads, int D, int capacity, int committed, int cols, float scale,
                 int threads, void *scratch) {
    const int E = committed + cols, G = heads / kv_heads;
    const size_t per_thread = (size_t)E * sizeof(int) + (size_t)G * E * sizeof(float);
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int task = 0; task < n * kv_heads; task++) {
        const int r = task / kv_heads, kvh = task % kv_heads;
        char *mine = (char *)scratch + per_thread * omp_get_thread_num();
        int *seen = (int *)mine;
        float *p = (float *)(mine + (size_t)E * sizeof(int));       /* [G, E]: scores, then weights */
        int m = 0;
        for (int e = 0; e < committed; e++) seen[m++] = e;
        for (int c = 0; c < cols; c++)
            if (visible[(size_t)r * cols + c]) seen[m++] = committed + c;
        const float *K = k + (size_t)kvh * capacity * D, *V = v + (size_t)kvh * capacity * D;
        const float *Q = q + ((size_t)r * heads + (size_t)kvh * G) * D;
        float *O = out + ((size_t)r * heads + (size_t)kvh * G) * D;
        for (int j = 0; j < m; j++) {
            const float *key = K + (size_t)seen[j] * D;
            for (int g = 0; g < G; g++) p[(size_t)g * m + j] = dot(Q + (size_t)g * D, key, D) * scale;
        }
        for (int g = 0; g < G; g++) {
            float *w = p + (size_t)g * m, top = -INFINITY, total = 0.0f;
            for (int j = 0; j < m; j++) top = fmaxf(top, w[j]);
            for (int j = 0; j < m; j++) {
                w[j] = expf(w[j] - top);
                total += w[j];
            }
            const float inverse = 1.0f / total;
            for (int j = 0; j < m; j++) w[j] *= inverse;
            for (int i = 0; i < D; i++) O[(size_t)g * D + i] = 0.0f;
        }
        for (int j = 0; j < m; j++) {
            const float *value = V + (size_t)seen[j] * D;
            for (int g = 0; g < G; g++) {
                const F8 weight = f8_dup(p[(size_t)g * m + j]);
                float *o = O + (size_t)g * D;
                for (int i = 0; i < D; i += 8) f8_store(o + i, f8_fma(weight, f8_load(value + i), f8_load(o + i)));
            }
        }
    }
}

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, each row alone (K a multiple of 8): the RMS norm of
 * Llama-family models, in one call rather than the five operations torch runs for it. */
void rms_norm_rows(const float *x, const float *w, float *y, int n, int K, float eps) {
    for (int r = 0; r < n; r++) {
        const float *row = x + (size_t)r * K;
        float *out = y + (size_t)r * K;
        const float inverse = 1.0f / sqrtf(dot(row, row, K) / (float)K + eps);
        const F8 factor = f8_dup(inverse);
        for (int i = 0; i < K; i += 8) f8_store(out + i, f8_mul(f8_mul(f8_load(row + i), factor), f8_load(w + i)));
    }
}
