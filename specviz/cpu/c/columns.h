/* blocks.c's product of many rows with K-quant blocks (Q4_K, Q6_K), from a copy of the file's blocks packed at load
 * (block_pack): on AVX2 without VNNI 8 outputs at a time, on AVX-512 with VNNI (and no AMX) 16 at a time.
 *
 * Why. The tile path multiplies 32 weights of one output into a row with one multiply-add of bytes (maddubs) and one
 * of its int16 pairs by the sub-block's scale (madd), and at each block's end sums the 8 lanes of each output's
 * accumulator across. Here a vector holds 4 consecutive weights of each of 8 (16) outputs (a "quad"), and a row's 4
 * activations at those places are broadcast to every lane: a sub-block's products of a row sum in each output's own
 * lane, one multiply applies the outputs' scales, and nothing is added across lanes. Q4_K takes 9 multiplying
 * instructions per 256 products on AVX2 (instead of 16), Q6_K 12; with VNNI one dot-product instruction per quad.
 *
 * The packed copy. Putting 16 outputs' quads side by side from the file's layout took 8 x 8 transposes and stores for
 * every block, again for every forward: at 16 rows a third of a Q4_K product's time, at 8 rows more than half
 * (AVX-512, Zen 4). So block_pack does it once, when a model loads: per 16 outputs (past the last output,
 * the last again) and per block, a record of 64-byte lines, each line one quad of the 16 outputs (4 bytes each); the
 * 16 outputs' scales, mins and d side by side after them (record_q4_K, record_q6_K below). A thread then reads one
 * stream of records, and a line is a vector: the 8-output path reads each line's half. The weights stay as the file
 * packs them, 4 bits (and Q6_K's 2 more) a byte, and are unpacked in registers (a Q6_K copy of a byte per weight, 30%
 * more to read, measured slower up to 24 rows on AVX2).
 *
 * Bits. The integer sums are the tile path's (exact whatever adds them), and the float work per block, output and row
 * is the same formula in the same order (blocks.c's header), lane by lane: a row gets the same bits as alone. */
#define PACKED_OUTPUTS 16          /* a 64-byte line: 4 bytes of each */

/* A block of 16 outputs packed: lines of quads, each line L bytes 4L .. 4L + 3 of each output's field */
typedef struct __attribute__((packed)) {
    uint8_t qs[QK_K / 8][PACKED_OUTPUTS][4];    /* low nibbles of line 8p + t: sub-block 2p, high ones: 2p + 1 */
    uint8_t scales[8][PACKED_OUTPUTS];          /* [sub-block j][output] */
    uint8_t mins[4][PACKED_OUTPUTS][2];         /* [k][output] as q4_k_scales pairs them */
    half_bits d[PACKED_OUTPUTS], dmin[PACKED_OUTPUTS];
} record_q4_K;

typedef struct __attribute__((packed)) {
    uint8_t ql[QK_K / 8][PACKED_OUTPUTS][4];
    uint8_t qh[QK_K / 16][PACKED_OUTPUTS][4];
    int8_t scales[8][PACKED_OUTPUTS][2];        /* [k][output] in pairs (s_2k, s_2k+1) */
    half_bits d[PACKED_OUTPUTS];
    uint8_t unused[32];                         /* records of whole lines */
} record_q6_K;

_Static_assert(sizeof(record_q4_K) == 37 * 64, "Q4_K: a record of 37 lines");
_Static_assert(sizeof(record_q6_K) == 53 * 64, "Q6_K: a record of 53 lines");

/* where the kernels below read a record (ints, as the byte arithmetic they join) */
#define Q4_K_SCALES ((int)offsetof(record_q4_K, scales))
#define Q4_K_MINS ((int)offsetof(record_q4_K, mins))
#define Q4_K_D ((int)offsetof(record_q4_K, d))
#define Q4_K_DMIN ((int)offsetof(record_q4_K, dmin))
#define Q6_K_HIGH ((int)offsetof(record_q6_K, qh))
#define Q6_K_SCALES ((int)offsetof(record_q6_K, scales))
#define Q6_K_D ((int)offsetof(record_q6_K, d))

static inline int record_bytes(int type) { return type == GGUF_Q4_K ? (int)sizeof(record_q4_K) : (int)sizeof(record_q6_K); }

static size_t packed_bytes(int type, int K, int N) {
    return (size_t)((N + PACKED_OUTPUTS - 1) / PACKED_OUTPUTS) * (size_t)(K / QK_K) * (size_t)record_bytes(type);
}

static void pack_q4_k(const uint8_t *const blk[PACKED_OUTPUTS], uint8_t *rec) {
    static const int paired[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    for (int o = 0; o < PACKED_OUTPUTS; o++) {
        for (int line = 0; line < Q4_K_SCALES / 64; line++) memcpy(rec + 64 * line + 4 * o, blk[o] + offsetof(block_q4_K, qs) + 4 * line, 4);
        const uint8_t *q = blk[o] + offsetof(block_q4_K, scales);  /* 12 bytes: 6-bit scales and mins (ggml's order) */
        uint8_t scale[8], min[8];
        for (int j = 0; j < 8; j++) {
            scale[j] = j < 4 ? q[j] & 63 : (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
            min[j] = j < 4 ? q[j + 4] & 63 : q[j + 4] >> 4 | (q[j] >> 6) << 4;
        }
        for (int j = 0; j < 8; j++) rec[Q4_K_SCALES + 16 * j + o] = scale[j];
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 2; i++) rec[Q4_K_MINS + 32 * k + 2 * o + i] = min[paired[k][i]];
        memcpy(rec + Q4_K_D + 2 * o, blk[o] + offsetof(block_q4_K, d), 2);
        memcpy(rec + Q4_K_DMIN + 2 * o, blk[o] + offsetof(block_q4_K, dmin), 2);
    }
}

static void pack_q6_k(const uint8_t *const blk[PACKED_OUTPUTS], uint8_t *rec) {
    memset(rec, 0, sizeof(record_q6_K));
    for (int o = 0; o < PACKED_OUTPUTS; o++) {
        for (int line = 0; line < Q6_K_SCALES / 64; line++) memcpy(rec + 64 * line + 4 * o, blk[o] + 4 * line, 4);   /* ql, then qh: all before the scales, in both */
        for (int k = 0; k < 8; k++) memcpy(rec + Q6_K_SCALES + 32 * k + 2 * o, blk[o] + offsetof(block_q6_K, scales) + 2 * k, 2);
        memcpy(rec + Q6_K_D + 2 * o, blk[o] + offsetof(block_q6_K, d), 2);
    }
}

static void pack(int type, const uint8_t *w, int K, int N, uint8_t *out, int threads) {
    const int blocks = K / QK_K, groups = (N + PACKED_OUTPUTS - 1) / PACKED_OUTPUTS, bytes = bytes_of(type);
    const size_t row_bytes = (size_t)blocks * bytes;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int g = 0; g < groups; g++)
        for (int b = 0; b < blocks; b++) {
            const uint8_t *blk[PACKED_OUTPUTS];
            for (int o = 0; o < PACKED_OUTPUTS; o++) {
                const int output = g * PACKED_OUTPUTS + o < N ? g * PACKED_OUTPUTS + o : N - 1;
                blk[o] = w + (size_t)output * row_bytes + (size_t)b * bytes;
            }
            uint8_t *rec = out + ((size_t)g * blocks + b) * record_bytes(type);
            if (type == GGUF_Q4_K) pack_q4_k(blk, rec);
            else pack_q6_k(blk, rec);
        }
}

/* Every line of the record PACKED_AHEAD records further along the thread's stream asked for (past its group's end: the
 * next group's, which the same thread takes next) */
ALWAYS void prefetch_record(const int type, const uint8_t *rec) {
    const uint8_t *ahead = rec + PACKED_AHEAD * record_bytes(type);
    for (int line = 0; line < record_bytes(type); line += 64) prefetch(ahead + line);
}

/* Quad t of the weights' 32-value group j (Q4_K: sub-block j; Q6_K: the two scales' 16 each), a byte a weight, from
 * the lines of a record, as vector type V of the outputs at `at` (a line's half, or all of it):
 * Q4_K's low nibbles of qs line 8 (j / 2) + t, or its high ones; Q6_K's weight 128h + 32k + l (j = 4h + k) is 4 bits
 * of ql[64h + 32 (k & 1) + l] (low or high: k < 2) and 2 of qh[32h + l] (bits 2k, 2k + 1) */
#define QUADS(V, LOAD, AND, OR, SHL, SHR, SET1)                                                                       \
    const V nibbles = SET1(0x0f);                                                                                    \
    if (type == GGUF_Q4_K) {                                                                                         \
        const V v = LOAD(rec + 64 * (8 * (j >> 1) + t) + at);                                                        \
        return AND(j & 1 ? SHR(v, 4) : v, nibbles);                                                                  \
    }                                                                                                                \
    const int h = j >> 2, k = j & 3;                                                                                 \
    const V low = LOAD(rec + 64 * (16 * h + 8 * (k & 1) + t) + at), high = LOAD(rec + Q6_K_HIGH + 64 * (8 * h + t) + at); \
    const V top = AND(k < 2 ? SHL(high, 4 - 2 * k) : SHR(high, 2 * k - 4), SET1(0x30));                              \
    return OR(AND(k < 2 ? low : SHR(low, 4), nibbles), top)

#if !defined(__AVX512VNNI__)
#define COLUMNS_PATH
#define COLUMNS 8                   /* outputs at a time: the 8 int32 lanes, half of a packed record */

/* A block's per-output numbers for the float work, half `half` of a record: what multiplies the rows' sums (Q4_K: the
 * mins as q4_k_scales pairs them; Q6_K: -32 times the scales, in pairs); d; Q4_K's dmin */
typedef struct {
    __m256i sums[8];
    __m256 d, m;
} Finish8;

ALWAYS void finish8(const int type, const uint8_t *rec, int half, Finish8 *f) {
    if (type == GGUF_Q4_K) {
        for (int k = 0; k < 4; k++) f->sums[k] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(rec + Q4_K_MINS + 32 * k + 16 * half)));
        f->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + Q4_K_D + 16 * half)));
        f->m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + Q4_K_DMIN + 16 * half)));
    } else {
        for (int k = 0; k < 8; k++) {
            const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + Q6_K_SCALES + 32 * k + 16 * half)));
            f->sums[k] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s, 5));
        }
        f->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + Q6_K_D + 16 * half)));
    }
}

ALWAYS __m256i load256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* quad t of group j as bytes, 8 outputs */
ALWAYS __m256i quads8(const int type, const uint8_t *rec, int half, int j, int t) {
    const int at = 32 * half;
    QUADS(__m256i, load256, _mm256_and_si256, _mm256_or_si256, _mm256_slli_epi16, _mm256_srli_epi16, _mm256_set1_epi8);
}

/* Q4_K: each lane's scale of sub-block j as an int16 pair (s, s), for madd */
ALWAYS __m256i q4_k_scales8(const uint8_t *rec, int half, int j) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + Q4_K_SCALES + 16 * j + 8 * half)));
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

/* sum[r] (+)= SCALE times the int16 sums of quads T0 .. T0 + N - 1 of sub-block j times row r's activations there. A
 * macro, so that s16 stays in registers (passed to a function, GCC keeps it in memory for the asm below). */
#define SCALED_QUADS(T0, N, SCALE, FIRST)                                                                             \
    do {                                                                                                             \
        __m256i s16[COLUMN_ROWS];                                                                                    \
        UNROLL for (int t = (T0); t < (T0) + (N); t++) {                                                              \
            const __m256i w = q ? q[j][t] : quads8(type, rec, half, j, t);                                          \
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

/* A block (half `half` of its record; q: its quads unpacked, or NULL: unpacked here as used) into rows r0 .. r0 + R - 1
 * (R <= COLUMN_ROWS; arrays of that size, not R: variable-length ones measured 1.5x slower): each sub-block's int16
 * sums scaled into sum (Q4_K: 32 values, 8 quads; Q6_K: 16 values, in halves of 2 quads, whose 4 products a lane stay
 * within int16), then the block's float work */
ALWAYS void columns_rows(const int type, const uint8_t *rec, int half, const __m256i q[8][8], const Finish8 *f,
                         const Rows *x, int b, int r0, const int R, __m256 *acc) {
    const int8_t *xb[COLUMN_ROWS];
    for (int r = 0; r < R; r++) xb[r] = x->q + (size_t)(r0 + r) * x->K + (size_t)b * QK_K;
    __m256i sum[COLUMN_ROWS];
    for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_si256();      /* (sub-block 0 sets them: for the compiler) */
    if (type == GGUF_Q4_K && !q) {
        /* Q4_K unpacked as used: sub-blocks 2p and 2p + 1 together, the low and the high nibbles of the same lines, so
         * a line is read and split once for both and no quad chooses between them. One sub-block at a time took a
         * forward's products 8-9% longer at 1-2 rows and 0-5% at 3-8; Q4_K's alone, up to 27% at 1-2 rows in a slow
         * phase of the VM (Zen 4 shown as AVX2 only, FORWARD=1 scripts/blocks_ab.py, two runs). */
        const __m256i nibbles = _mm256_set1_epi8(0x0f);
        _Pragma("GCC unroll 1") for (int p = 0; p < 4; p++) {
            __m256i low[COLUMN_ROWS], high[COLUMN_ROWS];
            UNROLL for (int t = 0; t < 8; t++) {
                const __m256i v = load256(rec + 64 * (8 * p + t) + 32 * half);
                const __m256i wl = _mm256_and_si256(v, nibbles), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibbles);
                for (int r = 0; r < R; r++) {
                    int32_t four_low, four_high;
                    memcpy(&four_low, xb[r] + 64 * p + 4 * t, 4);
                    memcpy(&four_high, xb[r] + 64 * p + 32 + 4 * t, 4);
                    const __m256i pl = _mm256_maddubs_epi16(wl, _mm256_set1_epi32(four_low));
                    const __m256i ph = _mm256_maddubs_epi16(wh, _mm256_set1_epi32(four_high));
                    low[r] = t ? _mm256_add_epi16(low[r], pl) : pl;
                    high[r] = t ? _mm256_add_epi16(high[r], ph) : ph;
                    __asm__("" : "+x"(low[r]), "+x"(high[r]));      /* as SCALED_QUADS' */
                }
            }
            const __m256i scale_low = q4_k_scales8(rec, half, 2 * p), scale_high = q4_k_scales8(rec, half, 2 * p + 1);
            for (int r = 0; r < R; r++) {
                const __m256i both = _mm256_add_epi32(_mm256_madd_epi16(low[r], scale_low), _mm256_madd_epi16(high[r], scale_high));
                sum[r] = p ? _mm256_add_epi32(sum[r], both) : both;
            }
        }
    } else _Pragma("GCC unroll 1") for (int j = 0; j < 8; j++) {
        if (type == GGUF_Q4_K) {
            const __m256i scale = q4_k_scales8(rec, half, j);
            SCALED_QUADS(0, 8, scale, j == 0);
        } else {
            const __m256i low = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
            const __m256i pairs = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + Q6_K_SCALES + 32 * j + 16 * half)));
            const __m256i first = _mm256_shuffle_epi8(pairs, low), second = _mm256_shuffle_epi8(pairs, _mm256_add_epi8(low, _mm256_set1_epi8(2)));
            SCALED_QUADS(0, 2, first, j == 0);
            SCALED_QUADS(2, 2, first, 0);
            SCALED_QUADS(4, 2, second, 0);
            SCALED_QUADS(6, 2, second, 0);
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
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(f->sums[k], _mm256_set1_epi32(pair)));
        }
        if (type == GGUF_Q6_K) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(f->d, dx), _mm256_cvtepi32_ps(sums)));
        else acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(f->d, dx), _mm256_cvtepi32_ps(sum[r])),
                                                          _mm256_mul_ps(_mm256_mul_ps(f->m, dx), _mm256_cvtepi32_ps(sums))));
    }
}

/* 8 outputs (half `half` of a group's records) into every row */
ALWAYS void columns_tile(const int type, const uint8_t *group, int half, const Rows *x, int n, float *y, int ldy, int o0,
                         int outputs) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        __m256 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < x->blocks; b++) {
            const uint8_t *rec = group + (size_t)b * record_bytes(type);
            if (r0 == 0 && half == 0) prefetch_record(type, rec);
            Finish8 f;
            finish8(type, rec, half, &f);
            if (count <= COLUMN_REGISTER_ROWS(type)) {      /* unpacked in registers for each group of rows, as used */
#define FEW8(R) columns_rows(type, rec, half, NULL, &f, x, b, r0 + r, R, acc + r)
                EVERY_ROW(count, COLUMN_ROWS, FEW8);
                continue;
            }
            __m256i q[8][8];            /* unpacked once for every group of rows: AVX2 has no cycles to spare */
            for (int j = 0; j < 8; j++)
                UNROLL for (int t = 0; t < 8; t++) q[j][t] = quads8(type, rec, half, j, t);
#define ROWS8(R) columns_rows(type, rec, half, (const __m256i (*)[8])q, &f, x, b, r0 + r, R, acc + r)
            EVERY_ROW(count, COLUMN_ROWS, ROWS8);
        }
        for (int r = 0; r < count; r++) {
            float out[COLUMNS];
            _mm256_storeu_ps(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + o] = out[o];
        }
    }
}

static void columns_product(const int type, const uint8_t *packed, const Rows *x, int n, float *y, int ldy, int N,
                            int threads) {
    const int tiles = (N + COLUMNS - 1) / COLUMNS;
    const size_t group_bytes = (size_t)x->blocks * record_bytes(type);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * COLUMNS, outputs = N - o0 < COLUMNS ? N - o0 : COLUMNS;
        const uint8_t *group = packed + (size_t)(t / 2) * group_bytes;
        if (type == GGUF_Q4_K) columns_tile(GGUF_Q4_K, group, t % 2, x, n, y, ldy, o0, outputs);
        else columns_tile(GGUF_Q6_K, group, t % 2, x, n, y, ldy, o0, outputs);
    }
}

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define COLUMNS16_PATH
/* The same with AVX-512's VNNI: 16 outputs at a time (a whole record), and a sub-block's products of a row summed in
 * int32 by one dot-product instruction per quad (vpdpbusd: 4 products and their sum a lane), its scale then applied by
 * an int32 multiply. The integers are the tile path's, and the float work per block the same formula lane by lane. */
#define COLUMNS16 16

typedef struct {
    __m512i sums[8];                /* as Finish8's, 16 lanes */
    __m512 d, m;
} Finish16;

ALWAYS void finish16(const int type, const uint8_t *rec, Finish16 *f) {
    if (type == GGUF_Q4_K) {
        for (int k = 0; k < 4; k++) f->sums[k] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + Q4_K_MINS + 32 * k)));
        f->d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + Q4_K_D)));
        f->m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + Q4_K_DMIN)));
    } else {
        for (int k = 0; k < 8; k++) {
            const __m512i s = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rec + Q6_K_SCALES + 32 * k)));
            f->sums[k] = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(s, 5));
        }
        f->d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + Q6_K_D)));
    }
}

ALWAYS __m512i load512(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

ALWAYS __m512i quads16(const int type, const uint8_t *rec, int j, int t) {
    const int at = 0;
    QUADS(__m512i, load512, _mm512_and_si512, _mm512_or_si512, _mm512_slli_epi16, _mm512_srli_epi16, _mm512_set1_epi8);
}

/* sum[r] (+)= SCALE times the int32 sum of quads T0 .. T0 + N - 1 of sub-block j times row r's activations there */
#define DOT_QUADS(T0, N, SCALE, FIRST)                                                                                \
    do {                                                                                                             \
        __m512i s32[COLUMN16_ROWS];                                                                                  \
        for (int r = 0; r < R; r++) s32[r] = _mm512_setzero_si512();                                                 \
        UNROLL for (int t = (T0); t < (T0) + (N); t++) {                                                              \
            const __m512i w = quads16(type, rec, j, t);                                                              \
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

ALWAYS void columns16_rows(const int type, const uint8_t *rec, const Finish16 *f, const Rows *x, int b, int r0,
                           const int R, __m512 *acc) {
    const int8_t *xb[COLUMN16_ROWS];
    for (int r = 0; r < R; r++) xb[r] = x->q + (size_t)(r0 + r) * x->K + (size_t)b * QK_K;
    __m512i sum[COLUMN16_ROWS];
    _Pragma("GCC unroll 1") for (int j = 0; j < 8; j++) {
        if (type == GGUF_Q4_K) {
            const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + Q4_K_SCALES + 16 * j)));
            DOT_QUADS(0, 8, scale, j == 0);
        } else {                            /* int16 pairs (s_2j, s_2j+1): each half sign-extended to int32 */
            const __m512i pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rec + Q6_K_SCALES + 32 * j)));
            DOT_QUADS(0, 4, _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16), j == 0);
            DOT_QUADS(4, 4, _mm512_srai_epi32(pairs, 16), 0);
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
            sums = _mm512_dpwssd_epi32(sums, f->sums[k], _mm512_set1_epi32(pair));
        }
        if (type == GGUF_Q6_K) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(f->d, dx), _mm512_cvtepi32_ps(sums)));
        else acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(f->d, dx), _mm512_cvtepi32_ps(sum[r])),
                                                          _mm512_mul_ps(_mm512_mul_ps(f->m, dx), _mm512_cvtepi32_ps(sums))));
    }
}

ALWAYS void columns16_tile(const int type, const uint8_t *group, const Rows *x, int n, float *y, int ldy, int o0,
                           int outputs) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        __m512 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < x->blocks; b++) {
            const uint8_t *rec = group + (size_t)b * record_bytes(type);
            if (r0 == 0) prefetch_record(type, rec);
            Finish16 f;
            finish16(type, rec, &f);
#define ROWS16(R) columns16_rows(type, rec, &f, x, b, r0 + r, R, acc + r)
            EVERY_ROW(count, COLUMN16_ROWS, ROWS16);
        }
        for (int r = 0; r < count; r++) {
            float out[COLUMNS16];
            _mm512_storeu_ps(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + o] = out[o];
        }
    }
}

static void columns16_product(const int type, const uint8_t *packed, const Rows *x, int n, float *y, int ldy, int N,
                              int threads) {
    const int tiles = (N + COLUMNS16 - 1) / COLUMNS16;
    const size_t group_bytes = (size_t)x->blocks * record_bytes(type);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * COLUMNS16, outputs = N - o0 < COLUMNS16 ? N - o0 : COLUMNS16;
        if (type == GGUF_Q4_K) columns16_tile(GGUF_Q4_K, packed + (size_t)t * group_bytes, x, n, y, ldy, o0, outputs);
        else columns16_tile(GGUF_Q6_K, packed + (size_t)t * group_bytes, x, n, y, ldy, o0, outputs);
    }
}
#endif
