/* y[n, N] = x[n, K] @ w[N, K].T in float32 with AVX2 + FMA, for the few rows (n <= 16) that decoding
 * and verifying feed; w in float32 (rows_matmul_f32) or in int8 with a float32 scale per output row
 * (rows_matmul_q8: y = scale * (x @ q.T)). See specviz/rows_kernel.py for why and how it is built.
 *
 * Each output y[r, o] is one accumulator: eight lanes of fused multiply-adds over k = 0, 8, 16, ...
 * in order, then the lanes summed in a fixed order. No tiling choice changes that sequence, so a row's
 * outputs are the same bits whatever other rows are fed with it: a tree's forward computes each token
 * exactly as plain decoding does. Tiles of O outputs by R rows keep the accumulators in registers
 * and read each weight row from memory once per tile of rows (later tiles find it in cache). */
#include <immintrin.h>
#include <stddef.h>

#define MAX_O 8
#define MAX_R 4

static inline float lanes_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight weights as floats: loaded, or (q8) sign-extended from int8 and converted. */
static inline __attribute__((always_inline)) __m256 weights(const void *w, size_t at, const int q8) {
    if (q8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const signed char *)w + at))));
    return _mm256_loadu_ps((const float *)w + at);
}

/* Outputs o0..o0+O-1 of rows r0..r0+R-1; O, R and q8 are constants at every call, so the loops unroll. */
static inline __attribute__((always_inline)) void tile(const float *__restrict__ x, const void *__restrict__ w,
        const float *__restrict__ scale, float *__restrict__ y, int K, int N, int r0, int o0, const int R, const int O, const int q8) {
    __m256 acc[MAX_O][MAX_R];
    for (int o = 0; o < O; o++)
        for (int r = 0; r < R; r++) acc[o][r] = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 8) {
        __m256 xv[MAX_R];
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + (size_t)(r0 + r) * K + k);
        for (int o = 0; o < O; o++) {
            __m256 wv = weights(w, (size_t)(o0 + o) * K + k, q8);
            for (int r = 0; r < R; r++) acc[o][r] = _mm256_fmadd_ps(wv, xv[r], acc[o][r]);
        }
    }
    for (int o = 0; o < O; o++)
        for (int r = 0; r < R; r++) y[(size_t)(r0 + r) * N + o0 + o] = q8 ? lanes_sum(acc[o][r]) * scale[o0 + o] : lanes_sum(acc[o][r]);
}

/* All rows of outputs o0..o0+O-1, in tiles of up to 4 rows. */
#define OUTPUTS(O, Q)                                                                \
    static void outputs_##O##_##Q(const float *x, const void *w, const float *sc, float *y, int n, int K, int N, int o0) { \
        int r0 = 0;                                                                  \
        for (; r0 + 4 <= n; r0 += 4) tile(x, w, sc, y, K, N, r0, o0, 4, O, Q);        \
        switch (n - r0) {                                                            \
        case 3: tile(x, w, sc, y, K, N, r0, o0, 3, O, Q); break;                      \
        case 2: tile(x, w, sc, y, K, N, r0, o0, 2, O, Q); break;                      \
        case 1: tile(x, w, sc, y, K, N, r0, o0, 1, O, Q); break;                      \
        }                                                                            \
    }
/* x: [n, K], w: [N, K], y: [n, N], all contiguous; K a multiple of 8. Fewer rows take wider tiles (more
 * weight rows streamed at once, 8-12 accumulators either way). */
#define PRODUCT(Q, NAME)                                                             \
    OUTPUTS(1, Q) OUTPUTS(3, Q) OUTPUTS(4, Q) OUTPUTS(6, Q) OUTPUTS(8, Q)             \
    void NAME(const float *x, const void *w, const float *sc, float *y, int n, int K, int N, int threads) { \
        const int O = n == 1 ? 8 : n == 2 ? 6 : n == 3 ? 4 : 3;                       \
        int blocks = N / O;                                                          \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")            \
        for (int b = 0; b < blocks; b++) {                                           \
            switch (O) {                                                             \
            case 8: outputs_8_##Q(x, w, sc, y, n, K, N, b * 8); break;               \
            case 6: outputs_6_##Q(x, w, sc, y, n, K, N, b * 6); break;               \
            case 4: outputs_4_##Q(x, w, sc, y, n, K, N, b * 4); break;               \
            default: outputs_3_##Q(x, w, sc, y, n, K, N, b * 3); break;              \
            }                                                                        \
        }                                                                            \
        for (int o = blocks * O; o < N; o++) outputs_1_##Q(x, w, sc, y, n, K, N, o);  \
    }
PRODUCT(0, rows_matmul_f32)
PRODUCT(1, rows_matmul_q8)
