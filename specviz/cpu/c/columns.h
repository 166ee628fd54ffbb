/* blocks.c's product of many rows with K-quant blocks (Q4_K, Q6_K): on AVX2 without VNNI 8 outputs at a time, their
 * blocks transposed in registers; on AVX-512 with VNNI (and no AMX) 16 at a time, the same way (the second part).
 *
 * Why. The tile path multiplies 32 weights of one output into a row with one multiply-add of bytes (maddubs) and one
 * of its int16 pairs by the sub-block's scale (madd), and at each block's end sums the 8 lanes of each output's
 * accumulator across. Here a vector holds 4 consecutive weights of each of 8 outputs (a "quad"), and a row's 4
 * activations at those places are broadcast to every lane. A sub-block's maddubs add up in int16 (Q4_K: 8 quads, 16
 * products of at most 15 * 127 a lane; Q6_K: 2 quads, 4 products of at most 63 * 127), one madd applies the 8
 * outputs' scales, and the 8 int32 lanes are the 8 outputs' sums: nothing to add across. Q4_K takes 9 multiplying
 * instructions per 256 products instead of 16, Q6_K 12. Measured on the Qwen2.5-Coder-1.5B's products, AVX2, one
 * process, the builds' calls interleaved (scripts/blocks_ab.py, 2026-11-26): a layer's Q4_K products 1.2x at 3 rows,
 * 1.6x at 8, 1.9x at 32-64; Q6_K 1.1x at 5 rows, 1.3x at 8, 1.6x at 16-64. With VNNI (one instruction per 4 products
 * and sum) the tiles measured faster.
 *
 * Bits. The integer sums are the tile path's (exact whatever adds them), and the float work per block, output and row
 * is the same formula in the same order (blocks.c's header), lane by lane: a row gets the same bits as alone. */
#define COLUMNS 8                   /* outputs at a time: the 8 int32 lanes */
#define COLUMN_ROWS 4               /* rows per pass over a transposed block: their accumulators stay in registers */
/* fewer rows take the tile path (the transposing costs more than it saves) */
#define COLUMN_MIN_ROWS(type) ((type) == GGUF_Q4_K ? 3 : 5)

/* 8 outputs' block, transposed: weights 32j + 4t .. 32j + 4t + 3 of output o in q[j][t]'s lane o; the scales of its
 * sub-blocks (Q4_K: 8 of 32 values; Q6_K: 16 of 16) per lane as an int16 pair (s, s); what multiplies the rows' sums
 * (Q4_K: the mins as q4_k_scales pairs them; Q6_K: -32 times the scales, in pairs); d; Q4_K's dmin */
typedef struct {
    __m256i q[8][8];
    __m256i scale[16];
    __m256i sums[8];
    __m256 d, m;
} Columns;

/* 32 bytes at blk[o] + offset (o = 0..7), transposed */
ALWAYS void load_transposed(const uint8_t *const blk[COLUMNS], int offset, __m256i v[8]) {
    for (int o = 0; o < COLUMNS; o++) v[o] = _mm256_loadu_si256((const __m256i *)(blk[o] + offset));
    transpose8(v);
}

/* in[o]: output o's scales as int16, in order -> pairs[k] lane o: (s_2k, s_2k+1); scale[g] lane o: (s_g, s_g) */
ALWAYS void scale_lanes(__m256i in[8], const int pairs_used, __m256i *pairs, __m256i *scale) {
    const __m256i low = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i high = _mm256_add_epi8(low, _mm256_set1_epi8(2));
    transpose8(in);
    for (int k = 0; k < pairs_used; k++) {
        pairs[k] = in[k];
        scale[2 * k] = _mm256_shuffle_epi8(in[k], low);
        scale[2 * k + 1] = _mm256_shuffle_epi8(in[k], high);
    }
}

/* 8 halves (at blk[o] + offset) as floats */
ALWAYS __m256 halves_at(const uint8_t *const blk[COLUMNS], int offset) {
    return _mm256_cvtph_ps(_mm_setr_epi16(read16(blk[0] + offset), read16(blk[1] + offset), read16(blk[2] + offset),
                                          read16(blk[3] + offset), read16(blk[4] + offset), read16(blk[5] + offset),
                                          read16(blk[6] + offset), read16(blk[7] + offset)));
}

ALWAYS void columns_q4_k(const uint8_t *const blk[COLUMNS], Columns *u) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int p = 0; p < 4; p++) {                       /* qs byte 32p + l: weight 64p + l (low), 64p + 32 + l (high) */
        __m256i v[8];
        load_transposed(blk, 16 + 32 * p, v);
        for (int t = 0; t < 8; t++) {
            u->q[2 * p][t] = _mm256_and_si256(v[t], low4);
            u->q[2 * p + 1][t] = _mm256_and_si256(_mm256_srli_epi16(v[t], 4), low4);
        }
    }
    uint8_t scales[COLUMNS][8];
    I4 mins[2][4];
    F4 d[2], m[2];
    for (int h = 0; h < 2; h++) q4_k_scales(blk + 4 * h, scales + 4 * h, mins[h], &d[h], &m[h]);
    for (int k = 0; k < 4; k++) u->sums[k] = _mm256_set_m128i(mins[1][k], mins[0][k]);
    u->d = _mm256_set_m128(d[1], d[0]);
    u->m = _mm256_set_m128(m[1], m[0]);
    __m256i in[8], pairs[4];
    for (int o = 0; o < COLUMNS; o++) in[o] = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)scales[o])));
    scale_lanes(in, 4, pairs, u->scale);
}

ALWAYS void columns_q6_k(const uint8_t *const blk[COLUMNS], Columns *u) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {   /* weights 128h + 32k + l: 4 bits of ql[64h + 32 (k & 1) + l], 2 of qh[32h + l] */
        __m256i a[8], b[8], bits[8];
        load_transposed(blk, 64 * h, a);
        load_transposed(blk, 64 * h + 32, b);
        load_transposed(blk, 128 + 32 * h, bits);
        for (int t = 0; t < 8; t++) {
            const __m256i nibbles[4] = {_mm256_and_si256(a[t], low4), _mm256_and_si256(b[t], low4),
                                        _mm256_and_si256(_mm256_srli_epi16(a[t], 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi16(b[t], 4), low4)};
            for (int k = 0; k < 4; k++)
                u->q[4 * h + k][t] = _mm256_or_si256(nibbles[k], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits[t], 2 * k), two), 4));
        }
    }
    __m256i in[8];
    for (int o = 0; o < COLUMNS; o++) in[o] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk[o] + 192)));
    scale_lanes(in, 8, u->sums, u->scale);
    for (int k = 0; k < 8; k++) u->sums[k] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(u->sums[k], 5));
    u->d = halves_at(blk, 208);
}

/* sum[r] (+)= SCALE times the int16 sums of quads T0 .. T0 + N - 1 of q[j] times row r's activations there. A macro,
 * so that s16 stays in registers (passed to a function, GCC keeps it in memory for the asm below). */
#define SCALED_QUADS(T0, N, SCALE, FIRST)                                                                             \
    do {                                                                                                             \
        __m256i s16[COLUMN_ROWS];                                                                                    \
        UNROLL for (int t = (T0); t < (T0) + (N); t++) {                                                              \
            const __m256i w = u->q[j][t];                                                                            \
            for (int r = 0; r < R; r++) {                                                                            \
                int32_t four;                                                                                        \
                memcpy(&four, xb[r] + 32 * j + 4 * t, 4);                                                            \
                const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(four));                                  \
                s16[r] = t > (T0) ? _mm256_add_epi16(s16[r], p) : p;                                                 \
                __asm__("" : "+x"(s16[r]));   /* keeps GCC from regrouping the sums into more live registers */      \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < R; r++) {                                                                                \
            const __m256i scaled = _mm256_madd_epi16(s16[r], (SCALE));                                               \
            sum[r] = (FIRST) ? scaled : _mm256_add_epi32(sum[r], scaled);                                            \
        }                                                                                                            \
    } while (0)

/* A transposed block into rows r0 .. r0 + R - 1 (R <= COLUMN_ROWS; arrays of that size, not R: variable-length ones
 * measured 1.5x slower): each sub-block's int16 sums scaled into sum (Q4_K: 32 values, 8 quads; Q6_K: 16 values, in
 * halves of 2 quads, whose 4 products a lane stay within int16), then the block's float work */
ALWAYS void columns_rows(const int type, const Columns *u, const Rows *x, int b, int r0, const int R, __m256 *acc) {
    const int8_t *xb[COLUMN_ROWS];
    for (int r = 0; r < R; r++) xb[r] = x->q + (size_t)(r0 + r) * x->K + (size_t)b * QK_K;
    __m256i sum[COLUMN_ROWS];
    _Pragma("GCC unroll 1") for (int j = 0; j < 8; j++) {
        if (type == GGUF_Q4_K) SCALED_QUADS(0, 8, u->scale[j], j == 0);
        else {
            SCALED_QUADS(0, 2, u->scale[2 * j], j == 0);
            SCALED_QUADS(2, 2, u->scale[2 * j], 0);
            SCALED_QUADS(4, 2, u->scale[2 * j + 1], 0);
            SCALED_QUADS(6, 2, u->scale[2 * j + 1], 0);
        }
    }
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(r0 + r);
        const int16_t *s = x->bsum + row * (x->K / 16) + (size_t)b * 16;   /* quantize_q8_k's sums, in pairs */
        const __m256 dx = _mm256_set1_ps(x->d[row * x->blocks + b]);
        __m256i sums = type == GGUF_Q6_K ? sum[r] : _mm256_setzero_si256();
        for (int k = 0; k < (type == GGUF_Q6_K ? 8 : 4); k++) {
            int32_t pair;
            memcpy(&pair, s + 2 * k, 4);
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(u->sums[k], _mm256_set1_epi32(pair)));
        }
        if (type == GGUF_Q6_K) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(u->d, dx), _mm256_cvtepi32_ps(sums)));
        else acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(u->d, dx), _mm256_cvtepi32_ps(sum[r])),
                                                          _mm256_mul_ps(_mm256_mul_ps(u->m, dx), _mm256_cvtepi32_ps(sums))));
    }
}

/* 8 outputs (w[o]: their rows; past the last output, the last again) into every row */
ALWAYS void columns_tile(const int type, const uint8_t *const w[COLUMNS], const Rows *x, int n, float *y, int ldy, int o0,
                         int outputs) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        __m256 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < x->blocks; b++) {
            if (r0 == 0) prefetch_ahead(type, w, COLUMNS, x->blocks, b);
            const uint8_t *blk[COLUMNS];
            for (int o = 0; o < COLUMNS; o++) blk[o] = w[o] + (size_t)b * bytes_of(type);
            Columns u;
            if (type == GGUF_Q4_K) columns_q4_k(blk, &u);
            else columns_q6_k(blk, &u);
#define ROWS8(R) columns_rows(type, &u, x, b, r0 + r, R, acc + r)
            EVERY_ROW(count, COLUMN_ROWS, ROWS8);
        }
        for (int r = 0; r < count; r++) {
            float out[COLUMNS];
            _mm256_storeu_ps(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + o] = out[o];
        }
    }
}

#if !defined(__AVX512VNNI__)
#define COLUMNS_PATH
static void columns_product(const int type, const uint8_t *w, size_t row_bytes, const Rows *x, int n, float *y, int ldy,
                            int N, int threads) {
    const int tiles = (N + COLUMNS - 1) / COLUMNS;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * COLUMNS, outputs = N - o0 < COLUMNS ? N - o0 : COLUMNS;
        const uint8_t *rows[COLUMNS];
        for (int o = 0; o < COLUMNS; o++) rows[o] = w + (size_t)(o0 + (o < outputs ? o : outputs - 1)) * row_bytes;
        if (type == GGUF_Q4_K) columns_tile(GGUF_Q4_K, rows, x, n, y, ldy, o0, outputs);
        else columns_tile(GGUF_Q6_K, rows, x, n, y, ldy, o0, outputs);
    }
}

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define COLUMNS16_PATH
/* The same with AVX-512's VNNI: 16 outputs at a time (two 8-output Columns side by side), and a sub-block's products
 * of a row summed in int32 by one dot-product instruction per quad (vpdpbusd: 4 products and their sum a lane), its
 * scale then applied by an int32 multiply. The integers are the tile path's, and the float work per block the same
 * formula lane by lane, as above. */
#define COLUMNS16 16
#define COLUMN16_ROWS 8
/* fewer rows take the tiles, as measured (scripts/blocks_ab.py): Q4_K below 6; Q6_K below 8, or below 32 in rows of few
 * blocks (the output layer's: 6), where these measured slower up to 16 rows and faster from 32 */
#define COLUMN16_MIN_ROWS(type, blocks) ((type) == GGUF_Q4_K ? 6 : (blocks) > 16 ? 8 : 32)

typedef struct {
    __m512i q[8][8];                /* as Columns' q, 16 lanes */
    __m512i scale[16];              /* the sub-blocks' scales as int32 (Q4_K: 8, Q6_K: 16) */
    __m512i sums[8];                /* as Columns' sums */
    __m512 d, m;
} Columns16;

ALWAYS void columns16(const int type, const uint8_t *const blk[COLUMNS16], Columns16 *u) {
    Columns half[2];
    for (int h = 0; h < 2; h++) {
        if (type == GGUF_Q4_K) columns_q4_k(blk + COLUMNS * h, &half[h]);
        else columns_q6_k(blk + COLUMNS * h, &half[h]);
    }
    for (int j = 0; j < 8; j++)
        for (int t = 0; t < 8; t++) u->q[j][t] = join_halves(half[0].q[j][t], half[1].q[j][t]);
    const int scales = type == GGUF_Q4_K ? 8 : 16, pairs = type == GGUF_Q4_K ? 4 : 8;
    for (int g = 0; g < scales; g++)        /* (s, s) int16 pairs: the high one, sign-extended */
        u->scale[g] = _mm512_srai_epi32(join_halves(half[0].scale[g], half[1].scale[g]), 16);
    for (int k = 0; k < pairs; k++) u->sums[k] = join_halves(half[0].sums[k], half[1].sums[k]);
    u->d = join_float_halves(half[0].d, half[1].d);
    if (type == GGUF_Q4_K) u->m = join_float_halves(half[0].m, half[1].m);
}

/* sum[r] (+)= SCALE times the int32 sum of quads T0 .. T0 + N - 1 of q[j] times row r's activations there */
#define DOT_QUADS(T0, N, SCALE, FIRST)                                                                                \
    do {                                                                                                             \
        __m512i s32[COLUMN16_ROWS];                                                                                  \
        for (int r = 0; r < R; r++) s32[r] = _mm512_setzero_si512();                                                 \
        UNROLL for (int t = (T0); t < (T0) + (N); t++) {                                                              \
            const __m512i w = u->q[j][t];                                                                            \
            for (int r = 0; r < R; r++) {                                                                            \
                int32_t four;                                                                                        \
                memcpy(&four, xb[r] + 32 * j + 4 * t, 4);                                                            \
                s32[r] = _mm512_dpbusd_epi32(s32[r], w, _mm512_set1_epi32(four));                                    \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < R; r++) {                                                                                \
            const __m512i scaled = _mm512_mullo_epi32(s32[r], (SCALE));                                              \
            sum[r] = (FIRST) ? scaled : _mm512_add_epi32(sum[r], scaled);                                            \
        }                                                                                                            \
    } while (0)

ALWAYS void columns16_rows(const int type, const Columns16 *u, const Rows *x, int b, int r0, const int R, __m512 *acc) {
    const int8_t *xb[COLUMN16_ROWS];
    for (int r = 0; r < R; r++) xb[r] = x->q + (size_t)(r0 + r) * x->K + (size_t)b * QK_K;
    __m512i sum[COLUMN16_ROWS];
    _Pragma("GCC unroll 1") for (int j = 0; j < 8; j++) {
        if (type == GGUF_Q4_K) DOT_QUADS(0, 8, u->scale[j], j == 0);
        else {
            DOT_QUADS(0, 4, u->scale[2 * j], j == 0);
            DOT_QUADS(4, 4, u->scale[2 * j + 1], 0);
        }
    }
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(r0 + r);
        const int16_t *s = x->bsum + row * (x->K / 16) + (size_t)b * 16;
        const __m512 dx = _mm512_set1_ps(x->d[row * x->blocks + b]);
        __m512i sums = type == GGUF_Q6_K ? sum[r] : _mm512_setzero_si512();
        for (int k = 0; k < (type == GGUF_Q6_K ? 8 : 4); k++) {
            int32_t pair;
            memcpy(&pair, s + 2 * k, 4);
            sums = _mm512_add_epi32(sums, _mm512_madd_epi16(u->sums[k], _mm512_set1_epi32(pair)));
        }
        if (type == GGUF_Q6_K) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(u->d, dx), _mm512_cvtepi32_ps(sums)));
        else acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(u->d, dx), _mm512_cvtepi32_ps(sum[r])),
                                                          _mm512_mul_ps(_mm512_mul_ps(u->m, dx), _mm512_cvtepi32_ps(sums))));
    }
}

ALWAYS void columns16_tile(const int type, const uint8_t *const w[COLUMNS16], const Rows *x, int n, float *y, int ldy,
                           int o0, int outputs) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        __m512 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < x->blocks; b++) {
            if (r0 == 0) prefetch_ahead(type, w, COLUMNS16, x->blocks, b);
            const uint8_t *blk[COLUMNS16];
            for (int o = 0; o < COLUMNS16; o++) blk[o] = w[o] + (size_t)b * bytes_of(type);
            Columns16 u;
            columns16(type, blk, &u);
#define ROWS16(R) columns16_rows(type, &u, x, b, r0 + r, R, acc + r)
            EVERY_ROW(count, COLUMN16_ROWS, ROWS16);
        }
        for (int r = 0; r < count; r++) {
            float out[COLUMNS16];
            _mm512_storeu_ps(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + o] = out[o];
        }
    }
}

static void columns16_product(const int type, const uint8_t *w, size_t row_bytes, const Rows *x, int n, float *y, int ldy,
                              int N, int threads) {
    const int tiles = (N + COLUMNS16 - 1) / COLUMNS16;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * COLUMNS16, outputs = N - o0 < COLUMNS16 ? N - o0 : COLUMNS16;
        const uint8_t *rows[COLUMNS16];
        for (int o = 0; o < COLUMNS16; o++) rows[o] = w + (size_t)(o0 + (o < outputs ? o : outputs - 1)) * row_bytes;
        if (type == GGUF_Q4_K) columns16_tile(GGUF_Q4_K, rows, x, n, y, ldy, o0, outputs);
        else columns16_tile(GGUF_Q6_K, rows, x, n, y, ldy, o0, outputs);
    }
}
#endif
