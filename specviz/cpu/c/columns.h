/* blocks.c's product of many rows with Q4_K blocks on x86 (AVX2 and up): 8 outputs at a time, their blocks transposed
 * in registers.
 *
 * Why. The tile path multiplies 32 weights of one output into a row with one multiply-add of bytes (maddubs) and one
 * of its int16 pairs by the sub-block's scale (madd), and at each block's end sums the 8 lanes of each output's
 * accumulator across. Here a vector holds 4 consecutive weights of each of 8 outputs (a "quad"), and a row's 4
 * activations at those places are broadcast to every lane: a sub-block's 8 maddubs add up in int16 (16 products of at
 * most 15 * 127 a lane), one madd a sub-block applies the 8 outputs' scales, and the 8 int32 lanes are the 8 outputs'
 * sums: nothing to add across. 9 multiplying instructions per 256 products instead of 16. Measured on a Qwen2-1.5B
 * layer's Q4_K products, AVX2 (2026-11-26): 1.2x at 5-8 rows, 1.5x at 16-64. Q6_K stays on the tile path: its 6-bit
 * weights let only 2 quads add up in int16, and a 6-bit block costs three transposes, so it measured slower.
 *
 * Bits. The integer sums are the tile path's (exact whatever adds them), and the float work per block, output and row
 * is the same formula in the same order (blocks.c's header), lane by lane: a row gets the same bits as alone. */
#define COLUMNS 8                   /* outputs at a time: the 8 int32 lanes */
#define COLUMN_ROWS 4               /* rows per pass over a transposed block: their 8 accumulators stay in registers */
#define COLUMN_MIN_ROWS 5           /* fewer rows: the tile path (the transposing costs more than it saves) */

/* 8 outputs' Q4_K block, transposed: weights 32j + 4t .. 32j + 4t + 3 of output o in q[j][t]'s lane o; sub-block j's
 * scales per lane as an int16 pair (s, s); the mins as q4_k_scales pairs them; d and dmin */
typedef struct {
    __m256i q[8][8];
    __m256i scale[8];
    __m256i mins[4];
    __m256 d, m;
} Columns;

/* 8 x 8 int32: out lane o of v[t] = in lane t of v[o] */
ALWAYS void transpose8(__m256i v[8]) {
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    v[0] = _mm256_permute2x128_si256(u0, u4, 0x20), v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    v[1] = _mm256_permute2x128_si256(u1, u5, 0x20), v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    v[2] = _mm256_permute2x128_si256(u2, u6, 0x20), v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    v[3] = _mm256_permute2x128_si256(u3, u7, 0x20), v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* 32 bytes at p + o * stride (o = 0..7), transposed */
ALWAYS void load_transposed(const uint8_t *const blk[COLUMNS], int offset, __m256i v[8]) {
    for (int o = 0; o < COLUMNS; o++) v[o] = _mm256_loadu_si256((const __m256i *)(blk[o] + offset));
    transpose8(v);
}

/* (s, s) int16 pairs per lane from 8 outputs' scales: s[o][i] -> scale[i] lane o */
ALWAYS __m256i scale_pairs(const int32_t s[COLUMNS]) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)s);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
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
    for (int k = 0; k < 4; k++) u->mins[k] = _mm256_set_m128i(mins[1][k], mins[0][k]);
    u->d = _mm256_set_m128(d[1], d[0]);
    u->m = _mm256_set_m128(m[1], m[0]);
    for (int j = 0; j < 8; j++) {
        int32_t s[COLUMNS];
        for (int o = 0; o < COLUMNS; o++) s[o] = scales[o][j];
        u->scale[j] = scale_pairs(s);
    }
}

/* A transposed block into rows r0 .. r0 + R - 1 */
ALWAYS void columns_rows(const Columns *u, const Rows *x, int b, int r0, const int R, __m256 *acc) {
    const int8_t *xb[R];
    for (int r = 0; r < R; r++) xb[r] = x->q + (size_t)(r0 + r) * x->K + (size_t)b * QK_K;
    __m256i sum[R];
    _Pragma("GCC unroll 1") for (int j = 0; j < 8; j++) {
        __m256i s16[R];
        UNROLL for (int t = 0; t < 8; t++) {
            const __m256i w = u->q[j][t];
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, xb[r] + 32 * j + 4 * t, 4);
                const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(four));
                s16[r] = t ? _mm256_add_epi16(s16[r], p) : p;
                __asm__("" : "+x"(s16[r]));   /* keeps GCC from regrouping the sums into more live registers */
            }
        }
        for (int r = 0; r < R; r++) {
            const __m256i scaled = _mm256_madd_epi16(s16[r], u->scale[j]);
            sum[r] = j ? _mm256_add_epi32(sum[r], scaled) : scaled;
        }
    }
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(r0 + r);
        const int16_t *s = x->bsum + row * (x->K / 16) + (size_t)b * 16;   /* quantize_q8_k's pairs of sums */
        __m256i summ = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            int32_t pair;
            memcpy(&pair, s + 2 * k, 4);
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(u->mins[k], _mm256_set1_epi32(pair)));
        }
        const __m256 dx = _mm256_set1_ps(x->d[row * x->blocks + b]);
        acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(u->d, dx), _mm256_cvtepi32_ps(sum[r])),
                                                     _mm256_mul_ps(_mm256_mul_ps(u->m, dx), _mm256_cvtepi32_ps(summ))));
    }
}

/* 8 outputs (w[o]: their rows; past the last output, the last again) into every row */
static void columns_tile(const uint8_t *const w[COLUMNS], const Rows *x, int n, float *y, int ldy, int o0,
                         int outputs) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        __m256 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < x->blocks; b++) {
            if (r0 == 0) prefetch_ahead(GGUF_Q4_K, w, COLUMNS, x->blocks, b);
            const uint8_t *blk[COLUMNS];
            for (int o = 0; o < COLUMNS; o++) blk[o] = w[o] + (size_t)b * 144;
            Columns u;
            columns_q4_k(blk, &u);
            int r = 0;
            for (; r + COLUMN_ROWS <= count; r += COLUMN_ROWS) columns_rows(&u, x, b, r0 + r, COLUMN_ROWS, acc + r);
            switch (count - r) {    /* each count compiled on its own, so that its accumulators are registers */
            case 3: columns_rows(&u, x, b, r0 + r, 3, acc + r); break;
            case 2: columns_rows(&u, x, b, r0 + r, 2, acc + r); break;
            case 1: columns_rows(&u, x, b, r0 + r, 1, acc + r); break;
            default: break;
            }
        }
        for (int r = 0; r < count; r++) {
            float out[COLUMNS];
            _mm256_storeu_ps(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + o] = out[o];
        }
    }
}

static void columns_product(const uint8_t *w, size_t row_bytes, const Rows *x, int n, float *y, int ldy,
                            int N, int threads) {
    const int tiles = (N + COLUMNS - 1) / COLUMNS;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * COLUMNS, outputs = N - o0 < COLUMNS ? N - o0 : COLUMNS;
        const uint8_t *rows[COLUMNS];
        for (int o = 0; o < COLUMNS; o++) rows[o] = w + (size_t)(o0 + (o < outputs ? o : outputs - 1)) * row_bytes;
        columns_tile(rows, x, n, y, ldy, o0, outputs);
    }
}
