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

/* a . b over D floats (D a multiple of 8) as 8 lanes, two accumulators in a fixed order; f8_sum of them is the dot */
ALWAYS F8 dot_lanes(const float *a, const float *b, int D) {
    F8 s0 = f8_zero(), s1 = f8_zero();
    int i = 0;
    UNROLL
    for (; i + 16 <= D; i += 16) {
        s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
        s1 = f8_fma(f8_load(a + i + 8), f8_load(b + i + 8), s1);
    }
    if (i < D) s0 = f8_fma(f8_load(a + i), f8_load(b + i), s0);
    return f8_add(s0, s1);
}

static inline float dot(const float *a, const float *b, int D) { return f8_sum(dot_lanes(a, b, D)); }

/* p[g m + j] = scale (Q_g . key j) for the G query heads and the m entries seen, eight dots summed at a time */
ALWAYS void scores_of(const float *Q, const float *K, const int *seen, int m, int G, const int D, float scale, float *p) {
    F8 lanes[8];
    float sums[8];
    int at[8], filled = 0;
    for (int j = 0; j < m; j++) {
        const float *key = K + (size_t)seen[j] * D;
        for (int g = 0; g < G; g++) {
            lanes[filled] = dot_lanes(Q + (size_t)g * D, key, D);
            at[filled++] = g * m + j;
            if (filled == 8 || (j == m - 1 && g == G - 1)) {
                for (int k = filled; k < 8; k++) lanes[k] = f8_zero();
                f8_sums(lanes, sums);
                for (int k = 0; k < filled; k++) p[at[k]] = sums[k] * scale;
                filled = 0;
            }
        }
    }
}

/* scores_of, its dots unrolled for the common head sizes */
static void scores(const float *Q, const float *K, const int *seen, int m, int G, int D, float scale, float *p) {
    if (D == 64) scores_of(Q, K, seen, m, G, 64, scale, p);
    else if (D == 128) scores_of(Q, K, seen, m, G, 128, scale, p);
    else scores_of(Q, K, seen, m, G, D, scale, p);
}

/* w[0..m-1] = softmax(w): e^(w - max) over their sum, eight at a time; the sum's order depends on m alone */
static void softmax(float *w, int m) {
    F8 top8 = f8_dup(-INFINITY);
    int j = 0;
    for (; j + 8 <= m; j += 8) top8 = f8_max(top8, f8_load(w + j));
    float lanes[8];
    f8_store(lanes, top8);
    float top = lanes[0];
    for (int k = 1; k < 8; k++) top = fmaxf(top, lanes[k]);
    for (; j < m; j++) top = fmaxf(top, w[j]);
    const F8 shift = f8_dup(top);
    F8 total = f8_zero();
    for (j = 0; j + 8 <= m; j += 8) {
        const F8 e = f8_exp(f8_sub(f8_load(w + j), shift));
        f8_store(w + j, e);
        total = f8_add(total, e);
    }
    if (j < m) {                        /* the last few, their lanes past m adding nothing */
        for (int k = 0; k < 8; k++) lanes[k] = j + k < m ? w[j + k] : top;
        f8_store(lanes, f8_exp(f8_sub(f8_load(lanes), shift)));
        for (int k = 0; k < 8; k++) {
            if (j + k < m) w[j + k] = lanes[k];
            else lanes[k] = 0.0f;
        }
        total = f8_add(total, f8_load(lanes));
    }
    const float inverse = 1.0f / f8_sum(total);
    for (j = 0; j < m; j++) w[j] *= inverse;
}

/* O_g[i..i + 8C) = sum over the m entries, in their order, of w_g[j] V_j[i..i + 8C), for H (1 or 2) heads g0, g0 + 1:
 * the sums in registers, each value read once for both heads */
ALWAYS void weighted_values(const float *p, const float *V, const int *seen, int m, int D, int g0, int i, const int H,
                            const int C, float *O) {
    F8 acc[2][4];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) acc[h][c] = f8_zero();
    for (int j = 0; j < m; j++) {
        const float *value = V + (size_t)seen[j] * D + i;
        for (int h = 0; h < H; h++) {
            const F8 weight = f8_dup(p[(size_t)(g0 + h) * m + j]);
            for (int c = 0; c < C; c++) acc[h][c] = f8_fma(weight, f8_load(value + 8 * c), acc[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) f8_store(O + (size_t)(g0 + h) * D + i + 8 * c, acc[h][c]);
}

/* weighted_values over all D values of H heads from g0: 32 values at a time, then 8 */
ALWAYS void heads_values(const float *p, const float *V, const int *seen, int m, int D, int g0, const int H, float *O) {
    int i = 0;
    for (; i + 32 <= D; i += 32) weighted_values(p, V, seen, m, D, g0, i, H, 4, O);
    for (; i < D; i += 8) weighted_values(p, V, seen, m, D, g0, i, H, 1, O);
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
        scores(Q, K, seen, m, G, D, scale, p);
        for (int g = 0; g < G; g++) softmax(p + (size_t)g * m, m);
        for (int g = 0; g < G; g += 2) {
            if (g + 1 < G) heads_values(p, V, seen, m, D, g, 2, O);
            else heads_values(p, V, seen, m, D, g, 1, O);
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
