/* y[n, N] = x[n, K] @ w[N, K].T in float32 with AVX2 + FMA, for the few rows (n <= 16) that decoding
 * and verifying feed; w in float32 (rows_matmul_f32) or in int8 with a float32 scale per output row
 * (rows_matmul_q8: y = scale * (x @ q.T)). See specviz/cpu/kernels.py for why and how it is built.
 *
 * Each output y[r, o] is one accumulator: eight lanes of fused multiply-adds over k = 0, 8, 16, ...
 * in order, then the lanes summed in a fixed order. No tiling choice changes that sequence, so a row's
 * outputs are the same bits whatever other rows are fed with it: a tree's forward computes each token
 * exactly as plain decoding does. Tiles of O outputs by R rows keep the accumulators in registers
 * and read each weight row from memory once per tile of rows (later tiles find it in cache). */
#include <immintrin.h>
#include "simd.h"
#include "tuning.h"
#include "specviz_cpu.h"
#include "rounding.h"
#include <stddef.h>
#include <stdlib.h>

#define MAX_O 8
#define MAX_R 4

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
        for (int r = 0; r < R; r++) y[(size_t)(r0 + r) * N + o0 + o] = q8 ? f8_sum(acc[o][r]) * scale[o0 + o] : f8_sum(acc[o][r]);
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

/* ---- 4-bit weights, 8-bit activations (rows_matmul_q4) ----
 * Weights come in tiles of 4 output rows, stored so that a tile is read as one stream: for each pair of
 * 32-weight blocks, the 4 rows' 32 bytes in turn. Their low nibbles are the first block's q[0..15] then the
 * second's, their high nibbles q[16..31] of each (q in 0..15): so one register's eight int32 lanes sum four
 * lanes of each block, and one float multiply by the two blocks' scales serves both (rows of x are stored
 * in the same order). Scales d and zeros z are bfloat16, a block's weights
 * being d * (q - 8) + z (specviz/cpu/int4.py): per tile, per chunk of 8 blocks, the 4 rows' 8 values in turn
 * (B, the blocks of a row, padded to a multiple of 8 with zeros). A draft's weights may take one scale and offset per
 * 64 weights (group 64: a chunk's 4 values per row, each serving its pair of blocks): 4.5 bits a weight instead of 5,
 * a tenth less to read per forward, with the same acceptance (int4.py's WIDE_GROUP). Each row of x is rounded to int8 per
 * chunk of 8 blocks (scale e = max |x| / 127), as llama.cpp's Q8_K does, so a block's product is an integer:
 * y = sum_chunks e sum_b d (q . x8) + sum_b (z - 8 d) e S, S the block's int sum. The integer dot products are exact
 * whichever instructions compute them (VNNI or AVX2), and each output's float operations run in one order
 * whatever rows come with it: a row's result is the same bits fed alone or with others. */
#include <stdint.h>

static inline __m256 bf16x8(const uint16_t *h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
}

/* Scales (or offsets) per chunk of 8 blocks and per output: 8 with groups of 32, 4 with groups of 64 */
static inline int chunk_values(int group) { return group == 64 ? 4 : 8; }

/* A chunk's 8 blocks' scales (or offsets) of one output as floats: its 8 values, or its 4 each twice (groups of 64) */
static inline __m256 block_scales(const uint16_t *h, const int per_chunk) {
    if (per_chunk == 8) return bf16x8(h);
    const __m256i four = _mm256_castsi128_si256(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)h)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_permutevar8x32_epi32(four, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)), 16));
}

/* Eight int32 lanes, each the sum of four unsigned-by-signed byte products of u and s and four of v and t. */
static inline __m256i dot2_u8_s8(__m256i u, __m256i s, __m256i v, __m256i t) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s), v, t);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s), v, t);
#else   /* int16 sums of four products: at most 4 * 15 * 127 */
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(v, t)), _mm256_set1_epi16(1));
#endif
}

static inline float max_lane(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* One row of x: int8 values (rounded to nearest, ties to even) on one scale per chunk of 8 blocks (256
 * values, as llama.cpp's Q8_K), and per block that scale e and e * S (Bp of each, zeros past the row). */
static void quantize_row(const float *x, int K, int Bp, int8_t *q, float *e, float *es) {
    const int B = K / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int c = 0; c < Bp; c += 8) {
        __m256 m = _mm256_setzero_ps();
        for (int i = c * 32; i < (c + 8 < B ? c + 8 : B) * 32; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
        const float amax = max_lane(m), scale = amax / 127.0f;
        const __m256 inverse = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        for (int b = c; b < c + 8; b++) {
            if (b >= B) { e[b] = es[b] = 0.0f; continue; }
            const float *v = x + b * 32;
            __m256i ints[4], sum = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                ints[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), inverse));
                sum = _mm256_add_epi32(sum, ints[i]);
            }
            /* pack 32 int32 to int8 in order: packs interleaves 128-bit lanes, the permute puts them back */
            const __m256i packed = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3])),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            /* the pair's layout: its first block's halves at 0 and 32, its second's at 16 and 48 */
            int8_t *pair = q + (b & ~1) * 32 + (b & 1) * 16;
            _mm_storeu_si128((__m128i *)pair, _mm256_castsi256_si128(packed));
            _mm_storeu_si128((__m128i *)(pair + 32), _mm256_extracti128_si256(packed, 1));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            e[b] = scale;
            es[b] = scale * (float)_mm_cvtsi128_si32(s4);
        }
    }
}

/* Blocks b8..b8+count-1 (one chunk: count even, at most 8) of a tile's rows into the accumulators: the
 * chunk's sum of d (q . x8) per output and row, then times the row's chunk scale e. One output at a time, so that
 * only its unpacked weights and scales and the rows' partial sums are live (AVX2 has 16 vector registers): 6-14% less
 * time than unpacking the tile's four outputs first, at 1-128 rows on AVX2 (a 0.5B layer's products);
 * each output's sums run in the same order either way. */
static inline __attribute__((always_inline)) void chunk_q4(const int8_t *__restrict__ xq, const float *__restrict__ xe,
        const uint8_t *__restrict__ w, const uint16_t *__restrict__ d, int K, int Bp, int r0, int b8,
        const int count, const int R, const int per_chunk, __m256 acc[Q4_TILE][MAX_R]) {
    __m256 dv[Q4_TILE], part[Q4_TILE][MAX_R];
    for (int o = 0; o < Q4_TILE; o++) {
        dv[o] = block_scales(d + (size_t)(b8 / 8 * Q4_TILE + o) * per_chunk, per_chunk);
        for (int r = 0; r < R; r++) part[o][r] = _mm256_setzero_ps();
    }
    for (int j = 0; j < count; j += 2) {
        const __m256i pair_lanes = _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1);
        for (int o = 0; o < Q4_TILE; o++) {
            const uint8_t *at = w + ((size_t)(b8 + j) / 2 * Q4_TILE + o) * 32;
            if (o & 1) _mm_prefetch((const char *)at + Q4_PREFETCH_BYTES, _MM_HINT_T0);
            const __m256i both = _mm256_loadu_si256((const __m256i *)at);
            const __m256i low = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(both, 4), _mm256_set1_epi8(0x0f));
            const __m256 db = _mm256_permutevar8x32_ps(dv[o], pair_lanes);
            for (int r = 0; r < R; r++) {
                const int8_t *xp = xq + (size_t)(r0 + r) * K + (size_t)(b8 + j) * 32;
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)xp), x1 = _mm256_loadu_si256((const __m256i *)(xp + 32));
                part[o][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot2_u8_s8(low, x0, high, x1)), db, part[o][r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256 e = _mm256_broadcast_ss(xe + (size_t)(r0 + r) * Bp + b8);
        for (int o = 0; o < Q4_TILE; o++) acc[o][r] = _mm256_fmadd_ps(part[o][r], e, acc[o][r]);
    }
}

/* CHUNK(b8, count) over a row's B blocks: whole chunks of 8, then the last 2, 4 or 6 (count a constant at each call) */
#define EVERY_CHUNK(B, CHUNK) do {                                                   \
        int b8 = 0;                                                                  \
        for (; b8 + 8 <= (B); b8 += 8) CHUNK(b8, 8);                                 \
        switch ((B) - b8) {                                                          \
        case 6: CHUNK(b8, 6); break;                                                 \
        case 4: CHUNK(b8, 4); break;                                                 \
        case 2: CHUNK(b8, 2); break;                                                 \
        }                                                                            \
    } while (0)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define Q4_WIDE 1
/* chunk_q4 with AVX-512: two outputs side by side in each register (outputs 2p and 2p + 1 of the tile are 64
 * consecutive bytes), each lane's operations those of chunk_q4 in the same order, so the same bits in half the
 * instructions. The 0.5B draft's forward (Zen 5, prepare's cost sampler, 5 alternations with the AVX2-width code): 3
 * tokens 8.0-8.4 -> 7.1-7.7 ms, 4 tokens 11.3-12.0 -> 9.3-9.9, 6 tokens 14.2-14.9 -> 11.3-12.1; one and two tokens as
 * before (6.1-6.8 ms: the memory bounds them). Tiles of 4 rows (32 registers would hold them) were no faster at 4. */
static inline __attribute__((always_inline)) void chunk_q4_wide(const int8_t *__restrict__ xq, const float *__restrict__ xe,
        const uint8_t *__restrict__ w, const uint16_t *__restrict__ d, int K, int Bp, int r0, int b8,
        const int count, const int R, const int per_chunk, __m512 acc[Q4_TILE / 2][MAX_R]) {
    __m512 dv[Q4_TILE / 2], part[Q4_TILE / 2][MAX_R];
    for (int p = 0; p < Q4_TILE / 2; p++) {
        const size_t at = (size_t)(b8 / 8 * Q4_TILE + 2 * p) * per_chunk;
        dv[p] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(block_scales(d + at, per_chunk))),
                                                    _mm256_castps_pd(block_scales(d + at + per_chunk, per_chunk)), 1));
        for (int r = 0; r < R; r++) part[p][r] = _mm512_setzero_ps();
    }
    for (int j = 0; j < count; j += 2) {
        const __m512i pair_lanes = _mm512_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1,
                                                     8 + j, 8 + j, 8 + j, 8 + j, 9 + j, 9 + j, 9 + j, 9 + j);
        __m512i x0[MAX_R], x1[MAX_R];
        for (int r = 0; r < R; r++) {
            const int8_t *xp = xq + (size_t)(r0 + r) * K + (size_t)(b8 + j) * 32;
            x0[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xp));
            x1[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xp + 32)));
        }
        for (int p = 0; p < Q4_TILE / 2; p++) {
            const uint8_t *at = w + ((size_t)(b8 + j) / 2 * Q4_TILE + 2 * p) * 32;
            _mm_prefetch((const char *)at + Q4_PREFETCH_BYTES, _MM_HINT_T0);
            const __m512i both = _mm512_loadu_si512((const void *)at);
            const __m512i low = _mm512_and_si512(both, _mm512_set1_epi8(0x0f));
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(both, 4), _mm512_set1_epi8(0x0f));
            const __m512 db = _mm512_permutexvar_ps(pair_lanes, dv[p]);
            for (int r = 0; r < R; r++) {
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), low, x0[r]), high, x1[r]);
                part[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), db, part[p][r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 e = _mm512_set1_ps(xe[(size_t)(r0 + r) * Bp + b8]);
        for (int p = 0; p < Q4_TILE / 2; p++) acc[p][r] = _mm512_fmadd_ps(part[p][r], e, acc[p][r]);
    }
}

/* The chunks' sums of a tile's rows, into acc (per output, as chunk_q4 leaves them) */
static inline __attribute__((always_inline)) void chunks_q4_wide(const int8_t *__restrict__ xq, const float *__restrict__ xe,
        const uint8_t *__restrict__ w, const uint16_t *__restrict__ d, int K, int Bp, int r0, const int R,
        const int per_chunk, __m256 acc[Q4_TILE][MAX_R]) {
    const int B = K / 32;
    __m512 wide[Q4_TILE / 2][MAX_R];
    for (int p = 0; p < Q4_TILE / 2; p++)
        for (int r = 0; r < R; r++) wide[p][r] = _mm512_setzero_ps();
#define WIDE_CHUNK(b8, count) chunk_q4_wide(xq, xe, w, d, K, Bp, r0, b8, count, R, per_chunk, wide)
    EVERY_CHUNK(B, WIDE_CHUNK);
#undef WIDE_CHUNK
    for (int p = 0; p < Q4_TILE / 2; p++)
        for (int r = 0; r < R; r++) {
            acc[2 * p][r] = _mm512_castps512_ps256(wide[p][r]);
            acc[2 * p + 1][r] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wide[p][r]), 1));
        }
}
#endif

/* The tile's outputs for rows r0..r0+R-1; w, d, z point at the tile. */
static inline __attribute__((always_inline)) void tile_q4(const int8_t *__restrict__ xq, const float *__restrict__ xe,
        const float *__restrict__ xes, const uint8_t *__restrict__ w, const uint16_t *__restrict__ d,
        const uint16_t *__restrict__ z, float *__restrict__ y, int K, int N, int r0, int o0, const int R, const int per_chunk) {
    const int B = K / 32, Bp = (B + 7) / 8 * 8;
    __m256 acc[Q4_TILE][MAX_R], offset[Q4_TILE][MAX_R];
    for (int o = 0; o < Q4_TILE; o++)
        for (int r = 0; r < R; r++) acc[o][r] = offset[o][r] = _mm256_setzero_ps();
#if defined(Q4_WIDE)
    chunks_q4_wide(xq, xe, w, d, K, Bp, r0, R, per_chunk, acc);
#else
#define CHUNK(b8, count) chunk_q4(xq, xe, w, d, K, Bp, r0, b8, count, R, per_chunk, acc)
    EVERY_CHUNK(B, CHUNK);
#undef CHUNK
#endif
    /* sum_b (z_b - 8 d_b) e_b S_b, eight blocks at a time (padding adds zeros) */
    for (int c = 0; c < Bp; c += 8)
        for (int o = 0; o < Q4_TILE; o++) {
            const size_t at = (size_t)(c / 8 * Q4_TILE + o) * per_chunk;
            const __m256 m = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), block_scales(d + at, per_chunk), block_scales(z + at, per_chunk));
            for (int r = 0; r < R; r++) offset[o][r] = _mm256_fmadd_ps(m, _mm256_loadu_ps(xes + (size_t)(r0 + r) * Bp + c), offset[o][r]);
        }
    for (int o = 0; o < Q4_TILE; o++)
        for (int r = 0; r < R; r++) y[(size_t)(r0 + r) * N + o0 + o] = f8_sum(acc[o][r]) + f8_sum(offset[o][r]);
}

static void outputs_q4(const int8_t *xq, const float *xe, const float *xes, const uint8_t *w, const uint16_t *d,
                       const uint16_t *z, float *y, int n, int K, int N, int o0, int per_chunk) {
    int r0 = 0;
    for (; r0 + 3 <= n; r0 += 3) tile_q4(xq, xe, xes, w, d, z, y, K, N, r0, o0, 3, per_chunk);
    if (n - r0 == 2) tile_q4(xq, xe, xes, w, d, z, y, K, N, r0, o0, 2, per_chunk);
    if (n - r0 == 1) tile_q4(xq, xe, xes, w, d, z, y, K, N, r0, o0, 1, per_chunk);
}

/* The n rows of x rounded by quantize_row into scratch (n * (K + 8 * Bp) bytes): int8 values *xq, scales *e, *es */
static void round_rows(const float *x, int n, int K, void *scratch, int8_t **xq, float **e, float **es, int threads) {
    const int Bp = (K / 32 + 7) / 8 * 8;
    int8_t *q = *xq = scratch;
    float *scales = *e = (float *)(q + (size_t)n * K), *sums = *es = scales + (size_t)n * Bp;
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (n >= 4)")     /* each row alone */
    for (int r = 0; r < n; r++) quantize_row(x + (size_t)r * K, K, Bp, q + (size_t)r * K, scales + (size_t)r * Bp, sums + (size_t)r * Bp);
}

/* y = the rounded rows times the 4-bit tiles, an output tile at a time (rows_matmul_q4's order) */
static void tiles_q4(const int8_t *xq, const float *xe, const float *xes, const uint8_t *w, const uint16_t *d,
                     const uint16_t *z, int per_chunk, float *y, int n, int K, int N, int threads) {
    const int Bp = (K / 32 + 7) / 8 * 8, Sp = Bp / 8 * per_chunk;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int t = 0; t < N / Q4_TILE; t++)
        outputs_q4(xq, xe, xes, w + (size_t)t * Q4_TILE * (K / 2), d + (size_t)t * Q4_TILE * Sp, z + (size_t)t * Q4_TILE * Sp,
                   y, n, K, N, t * Q4_TILE, per_chunk);
}

typedef void Q4Product(const int8_t *xq, const float *xe, const float *xes, const uint8_t *w, const uint16_t *d,
                       const uint16_t *z, int per_chunk, float *y, int n, int K, int N, int threads);

/* Whether quantize_row's rounding of row x crushed it (rounding.h), on one scale per chunk of 256 values, its values
 * put back in order where the rule must look at them (quantize_row interleaves a pair of blocks' halves). */
static int crushed_q4(const float *x, const int8_t *xq, const float *xe, int K) {
    float chunk_scales[(K / 32 + 7) / 8];
    for (int c = 0; c * 8 < K / 32; c++) chunk_scales[c] = xe[c * 8];
    if (rounding_fine(xq, chunk_scales, K, 256)) return 0;
    int8_t *ordered = malloc(K);
    if (!ordered) return 0;             /* rounded once, as llama.cpp rounds every row */
    for (int b = 0; b < K / 32; b++) {
        const int8_t *pair = xq + (b & ~1) * 32 + (b & 1) * 16;
        for (int i = 0; i < 32; i++) ordered[b * 32 + i] = pair[i < 16 ? i : i + 16];
    }
    const int crushed = rounding_crushed(x, ordered, chunk_scales, K, 256);
    free(ordered);
    return crushed;
}

/* The product of x's rows, each rounded to int8 by quantize_row; a row that rounding crushed rounded twice (rounding.h):
 * its remainder x - e q rounded and multiplied again, and added. Decided by each row alone, so a row's bits stay the
 * same in any batch. Where memory for that runs out, rows stay rounded once. */
static void product_q4(Q4Product *product, const float *x, const uint8_t *w, const uint16_t *d, const uint16_t *z,
                       int group, float *y, int n, int K, int N, int threads, void *scratch) {
    const int Bp = (K / 32 + 7) / 8 * 8, per_chunk = chunk_values(group);
    int8_t *xq;
    float *xe, *xes;
    round_rows(x, n, K, scratch, &xq, &xe, &xes, threads);
    product(xq, xe, xes, w, d, z, per_chunk, y, n, K, N, threads);
    int crushed[n], count = 0;
    for (int r = 0; r < n; r++) count += crushed[r] = crushed_q4(x + (size_t)r * K, xq + (size_t)r * K, xe + (size_t)r * Bp, K);
    if (!count) return;
    float *rest = malloc(((size_t)count * K + (size_t)count * N) * sizeof(float));
    void *again = malloc((size_t)count * (K + 8 * Bp));
    if (rest && again) {
        float *extra = rest + (size_t)count * K;
        for (int r = 0, i = 0; r < n; r++) {
            if (!crushed[r]) continue;
            const int8_t *q = xq + (size_t)r * K;
            for (int j = 0; j < K; j++) {
                const int b = j / 32, at = (b & ~1) * 32 + (b & 1) * 16 + (j % 32 < 16 ? j % 32 : j % 32 + 16);
                rest[(size_t)i * K + j] = x[(size_t)r * K + j] - xe[(size_t)r * Bp + b] * (float)q[at];
            }
            i++;
        }
        int8_t *again_q;
        float *again_e, *again_es;
        round_rows(rest, count, K, again, &again_q, &again_e, &again_es, threads);
        product(again_q, again_e, again_es, w, d, z, per_chunk, extra, count, K, N, threads);
        for (int r = 0, i = 0; r < n; r++) {
            if (!crushed[r]) continue;
            for (int o = 0; o < N; o++) y[(size_t)r * N + o] += extra[(size_t)i * N + o];
            i++;
        }
    }
    free(rest);
    free(again);
}

/* x: [n, K] float32, y: [n, N]; K a multiple of 64, N of Q4_TILE; group 32 or 64. scratch: n * (K + 8 * Bp) bytes. */
void rows_matmul_q4(const float *x, const uint8_t *w, const uint16_t *d, const uint16_t *z, int group, float *y,
                    int n, int K, int N, int threads, void *scratch) {
    product_q4(tiles_q4, x, w, d, z, group, y, n, K, N, threads, scratch);
}

/* ---- 4-bit weights, many rows, for a draft's prompt read (rows_matmul_q4_columns) ----
 * The same weights and the same rounding of x as rows_matmul_q4, summed in another order: 8 outputs (two tiles) at a
 * time, each pair of blocks' 32 bytes of the 8 outputs transposed in registers (transpose8), so that a vector holds
 * 4 consecutive weights of each output and a row's 4 activations there are broadcast (blocks.c's columns.h does the
 * same with a GGUF file's blocks). A block's 8 maddubs add up in int16 (16 products of at most 15 * 127 a lane),
 * one madd gives its 8 outputs' integer sums, and a fused multiply-add by the 8 outputs' scales adds them. Its bits
 * depend on nothing but the row, yet differ from rows_matmul_q4's: only a draft's prompt read takes it
 * (specviz/cpu/prompt_reader.py), where numerics move acceptance only. */

/* Per block of a chunk, the 8 outputs' scales (or zeros) as floats: bf16 values [tile][chunk][row][per_chunk] of the
 * chunk's two tiles t0, t1 -> v[b] lane o */
static inline __attribute__((always_inline)) void chunk_lanes(const uint16_t *t0, const uint16_t *t1, const int per_chunk, __m256 v[8]) {
    __m256i in[8];
    for (int o = 0; o < 8; o++) in[o] = _mm256_castps_si256(block_scales((o < 4 ? t0 : t1) + (o & 3) * per_chunk, per_chunk));
    transpose8(in);
    for (int b = 0; b < 8; b++) v[b] = _mm256_castsi256_ps(in[b]);
}

/* One block b (32 values: quads q[0..7], a row's x at its pair's 64 bytes + at[t]) into rows first_row + r0 .. + R - 1,
 * whose results are acc[r0 ..] */
static inline __attribute__((always_inline)) void columns_block_q4(const __m256i q[8], const int at[8], const int8_t *xq,
        const float *e, const float *es, int K, int Bp, int b, int first_row, int r0, const int R, __m256 d, __m256 m,
        __m256 *acc) {
    xq += (size_t)first_row * K, e += (size_t)first_row * Bp, es += (size_t)first_row * Bp;
    __m256i s16[READ_ROWS_AT_ONCE];
    for (int t = 0; t < 8; t++)
        for (int r = 0; r < R; r++) {
            int32_t four;
            memcpy(&four, xq + (size_t)(r0 + r) * K + (size_t)(b / 2) * 64 + at[t], 4);
            const __m256i p = _mm256_maddubs_epi16(q[t], _mm256_set1_epi32(four));
            s16[r] = t ? _mm256_add_epi16(s16[r], p) : p;
            __asm__("" : "+x"(s16[r]));       /* keeps GCC from regrouping the sums into more live registers */
        }
    for (int r = 0; r < R; r++) {
        const size_t at_row = (size_t)(r0 + r) * Bp + b;
        const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[r], _mm256_set1_epi16(1)));
        acc[r0 + r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, _mm256_set1_ps(e[at_row])), acc[r0 + r]);
        acc[r0 + r] = _mm256_fmadd_ps(m, _mm256_set1_ps(es[at_row]), acc[r0 + r]);
    }
}

/* a pair's x: its first block's halves at 0 and 32, its second's at 16 and 48; quads t < 4 of the transposed low
 * nibbles are the first block's values 4t.., t >= 4 the second's; the high nibbles the same, 16 values on */
static const int first_quads[8] = {0, 4, 8, 12, 32, 36, 40, 44}, second_quads[8] = {16, 20, 24, 28, 48, 52, 56, 60};

/* 8 outputs at a time (rows already rounded: xq, e, es) */
static void columns8_q4(const int8_t *xq, const float *e, const float *es, const uint8_t *w, const uint16_t *d,
                        const uint16_t *z, int per_chunk, float *y, int n, int K, int N, int threads) {
    const int B = K / 32, Bp = (B + 7) / 8 * 8, Sp = Bp / 8 * per_chunk;
    const int passes = (n + READ_ROWS_KEPT - 1) / READ_ROWS_KEPT;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int task = 0; task < N / 8 * passes; task++) {        /* each thread's tiles with all their rows */
        const int t = task / passes, r0 = task % passes * READ_ROWS_KEPT, rows = n - r0 < READ_ROWS_KEPT ? n - r0 : READ_ROWS_KEPT;
        __m256 acc[READ_ROWS_KEPT];
        for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
        const uint8_t *w0 = w + (size_t)(2 * t) * Q4_TILE * (K / 2), *w1 = w0 + (size_t)Q4_TILE * (K / 2);
        const uint16_t *d0 = d + (size_t)(2 * t) * Q4_TILE * Sp, *z0 = z + (size_t)(2 * t) * Q4_TILE * Sp;
        for (int c = 0; c < Bp; c += 8) {
            __m256 dc[8], zc[8];
            const size_t at = (size_t)c / 8 * Q4_TILE * per_chunk, next = (size_t)Q4_TILE * Sp;
            chunk_lanes(d0 + at, d0 + next + at, per_chunk, dc);
            chunk_lanes(z0 + at, z0 + next + at, per_chunk, zc);
            for (int b = c; b < c + 8 && b < B; b += 2) {
                __m256i v[8], low[8], high[8];
                for (int o = 0; o < 8; o++)
                    v[o] = _mm256_loadu_si256((const __m256i *)((o < 4 ? w0 : w1) + ((size_t)(b / 2) * Q4_TILE + (o & 3)) * 32));
                transpose8(v);
                for (int k = 0; k < 8; k++) {
                    low[k] = _mm256_and_si256(v[k], _mm256_set1_epi8(0x0f));
                    high[k] = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), _mm256_set1_epi8(0x0f));
                }
                const __m256i qa[8] = {low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]};
                const __m256i qb[8] = {low[4], low[5], low[6], low[7], high[4], high[5], high[6], high[7]};
                const __m256 m8 = _mm256_set1_ps(8.0f);
                for (int h = 0; h < 2; h++) {
                    const int blk = b + h, j = blk - c;
                    const __m256 dv = dc[j], mv = _mm256_fnmadd_ps(m8, dc[j], zc[j]);      /* z - 8 d */
                    const __m256i *q = h ? qb : qa;
                    const int *at = h ? second_quads : first_quads;
#define BLOCK8(R) columns_block_q4(q, at, xq, e, es, K, Bp, blk, r0, r, R, dv, mv, acc)
                    EVERY_ROW(rows, READ_ROWS_AT_ONCE, BLOCK8);
                }
            }
        }
        for (int r = 0; r < rows; r++) _mm256_storeu_ps(y + (size_t)(r0 + r) * N + (size_t)t * 8, acc[r]);
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* With AVX-512's VNNI, 16 outputs (four tiles) at a time: a block's 8 quads of a row summed in int32 by one vpdpbusd
 * each (4 products and their sum a lane), then the same two fused multiply-adds, 16 lanes wide: the 0.5B draft read a
 * 128-token prompt in 320 ms against 436 with the 8 outputs (its products about 175 G multiply-adds/s). */

ALWAYS void columns16_block_q4(const __m512i q[8], const int at[8], const int8_t *xq, const float *e, const float *es,
                               int K, int Bp, int b, int first_row, int r0, const int R, __m512 d, __m512 m, __m512 *acc) {
    xq += (size_t)first_row * K, e += (size_t)first_row * Bp, es += (size_t)first_row * Bp;
    __m512i s32[READ16_ROWS_AT_ONCE];
    for (int r = 0; r < R; r++) s32[r] = _mm512_setzero_si512();
    for (int t = 0; t < 8; t++)
        for (int r = 0; r < R; r++) {
            int32_t four;
            memcpy(&four, xq + (size_t)(r0 + r) * K + (size_t)(b / 2) * 64 + at[t], 4);
            s32[r] = _mm512_dpbusd_epi32(s32[r], q[t], _mm512_set1_epi32(four));
        }
    for (int r = 0; r < R; r++) {
        const size_t at_row = (size_t)(r0 + r) * Bp + b;
        acc[r0 + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32[r]), _mm512_mul_ps(d, _mm512_set1_ps(e[at_row])), acc[r0 + r]);
        acc[r0 + r] = _mm512_fmadd_ps(m, _mm512_set1_ps(es[at_row]), acc[r0 + r]);
    }
}

static void columns16_q4(const int8_t *xq, const float *e, const float *es, const uint8_t *w, const uint16_t *d,
                         const uint16_t *z, int per_chunk, float *y, int n, int K, int N, int threads) {
    const int B = K / 32, Bp = (B + 7) / 8 * 8, Sp = Bp / 8 * per_chunk;
    const int passes = (n + READ_ROWS_KEPT - 1) / READ_ROWS_KEPT;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int task = 0; task < N / 16 * passes; task++) {
        const int t = task / passes, r0 = task % passes * READ_ROWS_KEPT, rows = n - r0 < READ_ROWS_KEPT ? n - r0 : READ_ROWS_KEPT;
        __m512 acc[READ_ROWS_KEPT];
        for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        const uint8_t *wt = w + (size_t)(4 * t) * Q4_TILE * (K / 2);           /* its four tiles, one after the other */
        const uint16_t *dt = d + (size_t)(4 * t) * Q4_TILE * Sp, *zt = z + (size_t)(4 * t) * Q4_TILE * Sp;
        const size_t tile_bytes = (size_t)Q4_TILE * (K / 2), tile_groups = (size_t)Q4_TILE * Sp;
        for (int c = 0; c < Bp; c += 8) {
            __m256 dc[2][8], zc[2][8];
            const size_t at = (size_t)c / 8 * Q4_TILE * per_chunk;
            for (int h = 0; h < 2; h++) {
                chunk_lanes(dt + 2 * h * tile_groups + at, dt + (2 * h + 1) * tile_groups + at, per_chunk, dc[h]);
                chunk_lanes(zt + 2 * h * tile_groups + at, zt + (2 * h + 1) * tile_groups + at, per_chunk, zc[h]);
            }
            for (int b = c; b < c + 8 && b < B; b += 2) {
                __m512i low[8], high[8];
                for (int h = 0; h < 2; h++) {
                    __m256i v[8];
                    for (int o = 0; o < 8; o++)
                        v[o] = _mm256_loadu_si256((const __m256i *)(wt + (2 * h + o / 4) * tile_bytes + ((size_t)(b / 2) * Q4_TILE + (o & 3)) * 32));
                    transpose8(v);
                    for (int k = 0; k < 8; k++) {
                        const __m256i lo = _mm256_and_si256(v[k], _mm256_set1_epi8(0x0f));
                        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), _mm256_set1_epi8(0x0f));
                        low[k] = h ? join_halves(_mm512_castsi512_si256(low[k]), lo) : _mm512_castsi256_si512(lo);
                        high[k] = h ? join_halves(_mm512_castsi512_si256(high[k]), hi) : _mm512_castsi256_si512(hi);
                    }
                }
                const __m512i qa[8] = {low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]};
                const __m512i qb[8] = {low[4], low[5], low[6], low[7], high[4], high[5], high[6], high[7]};
                const __m256 m8 = _mm256_set1_ps(8.0f);
                for (int h = 0; h < 2; h++) {
                    const int blk = b + h, j = blk - c;
                    const __m512 dv = join_float_halves(dc[0][j], dc[1][j]);
                    const __m512 mv = join_float_halves(_mm256_fnmadd_ps(m8, dc[0][j], zc[0][j]), _mm256_fnmadd_ps(m8, dc[1][j], zc[1][j]));
                    const __m512i *q = h ? qb : qa;
                    const int *at = h ? second_quads : first_quads;
#define BLOCK16(R) columns16_block_q4(q, at, xq, e, es, K, Bp, blk, r0, r, R, dv, mv, acc)
                    EVERY_ROW(rows, READ16_ROWS_AT_ONCE, BLOCK16);
                }
            }
        }
        for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)(r0 + r) * N + (size_t)t * 16, acc[r]);
    }
}
#endif

/* the columns' product: 16 outputs at a time where the build and N allow, else 8 */
static void columns_q4(const int8_t *xq, const float *e, const float *es, const uint8_t *w, const uint16_t *d,
                       const uint16_t *z, int per_chunk, float *y, int n, int K, int N, int threads) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (N % 16 == 0) {
        columns16_q4(xq, e, es, w, d, z, per_chunk, y, n, K, N, threads);
        return;
    }
#endif
    columns8_q4(xq, e, es, w, d, z, per_chunk, y, n, K, N, threads);
}

/* x: [n, K] float32, y: [n, N]; K a multiple of 64, N of 8; group 32 or 64. scratch: n * (K + 8 * Bp) bytes. */
void rows_matmul_q4_columns(const float *x, const uint8_t *w, const uint16_t *d, const uint16_t *z, int group, float *y,
                            int n, int K, int N, int threads, void *scratch) {
    product_q4(columns_q4, x, w, d, z, group, y, n, K, N, threads, scratch);
}
