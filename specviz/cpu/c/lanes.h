/* Shared by rows_kernel.c and row_attention.c (one library, specviz/cpu/kernels.py builds both). */
#ifndef SPECVIZ_LANES_H
#define SPECVIZ_LANES_H
#include <immintrin.h>

/* The eight lanes of v summed in one fixed order. */
static inline float lanes_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif
