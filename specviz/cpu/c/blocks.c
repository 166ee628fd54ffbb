/* Products of a few rows with a GGUF file's own quantized blocks: y[n, N] = x[n, K] @ W[N, K].T, W as the file
 * stores it (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), read in place.
 *
 * As llama.cpp does, each row of x is first rounded to int8 in the format its weight type's dot product takes
 * (quantize_rows: Q8_K, one float scale per 256 values with sums per 16, for the K-quants; Q8_0, one half scale
 * per 32 values, for Q4_0, Q5_0 and Q8_0; Q8_1, which adds the half of scale * sum, for Q4_1). Then each block's
 * dot product is an exact integer, and the float work per block, per output and row, is one fixed formula:
 *
 *   Q4_K:              y += (d * dx) * sumi - (dmin * dx) * summ    sumi = sum_j sc_j (q_j . x_j), summ = sum_j m_j S_j
 *   Q6_K:              y += (d * dx) * sumi                         sumi = sum_g sc_g ((q_g - 32) . x_g)
 *   Q4_0, Q5_0, Q8_0:  y += (d * dx) * sumi                         sumi = (q - offset) . x
 *   Q4_1:              y += (d * dx) * sumi + m * sx                sumi = q . x
 *
 * over the blocks in order, from 0, every product and sum rounded to float32 as written (no fused multiply-add:
 * specviz/cpu/reference.py computes the same in numpy, bit for bit). Integer sums are exact whichever instructions
 * add them, and the float work is element-wise: so a row's outputs are the same bits whether it comes alone or with
 * other rows, and on every instruction set (simd.h). That is what lets a quantized target verify a tree exactly.
 *
 * The work is cut in tiles of BLOCK_TILE outputs, a quarter of the outputs apart (tile t of T: outputs t, t + T, t + 2T,
 * t + 3T), so that each thread reads four long runs of consecutive rows, which the hardware's prefetchers follow: tiles
 * of four neighbouring rows read them side by side within a page or two, and the one-row products of the 1.5B coder's
 * forward took 8% longer with AVX2, 11% with AVX-512 (2-core Ice Lake, FORWARD=1 scripts/blocks_ab.py). Up to FEW_ROWS
 * rows at once, 64 weights at a time of a tile's block are unpacked into registers and multiplied into every row:
 * nothing goes through memory. With more rows, a tile's block is unpacked once into a KBlock, and the rows taken from
 * there in groups of ROW_GROUP; but up to GROUPS_OF_FEW times FEW_ROWS rows (AVX2) go FEW_ROWS at a time through the
 * registers' path, each block unpacked again per group.
 * On AVX2 without VNNI, COLUMN_MIN_ROWS rows or more of Q4_K and Q6_K blocks take columns.h's path instead, on a copy of
 * the blocks packed at load (block_pack): 8 outputs at a time, the same integers and float formula; on AVX-512 with
 * VNNI and no AMX, 16 at a time from COLUMN16_MIN_ROWS rows (Q4_K: from one). These counts, and why each is what it
 * is: tuning.h.
 *
 * One rule departs from llama.cpp's arithmetic, decided by each row alone (rounding.h): a row that int8 rounding
 * crushes, as the first position's attention sink does, is rounded twice (round_again). llama.cpp's next token after
 * a one-token prompt is noise there (`def` -> `00000000`); here it is the file's model's. */
#include "simd.h"
#include "tuning.h"
#include "specviz_cpu.h"
#include "blocks.h"
#include "rounding.h"
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#if defined(SIMD_AMX) && defined(__linux__)
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define BLOCK_TILE 4                /* outputs per tile: one I4 / F4 of results */

/* ---------------------------------------------------------------- rows rounded to int8 */

/* llama.cpp's nearest_int: round half to even, exact for |f| < 2^22 */
static inline int nearest_int(float f) {
    const float shifted = f + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &shifted, 4);
    return (bits & 0x007fffff) - 0x00400000;
}

/* C's roundf (half away from zero), exactly, without a library call */
static inline int round_away(float f) {
    int i = (int)f;                   /* toward zero */
    const float rest = f - (float)i;  /* exact */
    return i + (rest >= 0.5f) - (rest <= -0.5f);
}

/* |f| as an integer: ordered as the magnitudes are, and above 0x7f7fffff (FLT_MAX) for infinities and NaN */
static inline uint32_t magnitude(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffff;
}

/* Q8_K (quantize_row_q8_K_ref), one block of 256 values: the one of largest magnitude (the first such) maps to -127.
 * sums: those of its 16-value groups; for Q4_K (by32) those of its 32-value sub-blocks S0..S7 instead, ordered
 * S0 S2 S1 S3 S4 S6 S5 S7 to meet the mins as q4_k_scales pairs them. Written for the compiler to vectorise. */
static int quantize_q8_k(const float *v, int8_t *out, float *d, int16_t *sums, int by32) {
    uint32_t top = 0;
    for (int j = 0; j < QK_K; j++) top = magnitude(v[j]) > top ? magnitude(v[j]) : top;
    if (top > 0x7f7fffff) return 1;
    if (top == 0) {
        memset(out, 0, QK_K);
        memset(sums, 0, 16 * sizeof(int16_t));
        *d = 0.0f;
        return 0;
    }
    int first = 0;
    while (magnitude(v[first]) != top) first++;
    const float iscale = -127.0f / v[first];
    for (int j = 0; j < QK_K; j++) {
        const int t = nearest_int(iscale * v[j]);
        out[j] = (int8_t)(t < 127 ? t : 127);
    }
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += out[16 * g + j];
        sums[g] = (int16_t)s;
    }
    if (by32) {
        static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        int16_t s32[8];
        for (int k = 0; k < 8; k++) s32[k] = (int16_t)(sums[2 * order[k]] + sums[2 * order[k] + 1]);
        memcpy(sums, s32, sizeof s32);
    }
    *d = 1.0f / iscale;
    return 0;
}

/* Q8_0 / Q8_1 (quantize_row_q8_0_ref, _q8_1_ref): per 32 values d = max |x| / 127 kept as a half; sx = half(d * sum) */
static int quantize_q8_0(const float *x, int K, int8_t *q, float *d, int32_t *sum, float *sx) {
    int bad = 0;
    for (int b = 0; b < K / QK_LEGACY; b++) {
        const float *v = x + (size_t)b * QK_LEGACY;
        float amax = 0.0f;
        for (int j = 0; j < QK_LEGACY; j++) {
            const float a = fabsf(v[j]);
            bad |= !(a <= FLT_MAX);
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int s = 0;
        for (int j = 0; j < QK_LEGACY; j++) {
            const int t = round_away(v[j] * inverse);
            q[(size_t)b * QK_LEGACY + j] = (int8_t)t;
            s += t;
        }
        d[b] = half_to_float(float_to_half(scale));
        sum[b] = s;
        sx[b] = half_to_float(float_to_half((float)s * scale));
    }
    return bad;
}

static inline int k_quant(int type) { return type == GGUF_Q4_K || type == GGUF_Q6_K; }
/* a K-quant block's bytes (bytes_of's) as one expression: GCC weighs a call to bytes_of before it folds the type, and
 * inlines the tile paths otherwise */
#define K_BYTES(type) ((type) == GGUF_Q4_K ? (int)sizeof(block_q4_K) : (int)sizeof(block_q6_K))

int block_weights(int type) { return k_quant(type) ? QK_K : QK_LEGACY; }

int block_bytes(int type) { return bytes_of(type); }

/* The rows in int8, in scratch: values [n, K], then per row per block the scale, the int sums (per 16 values for
 * the K-quants, per 32 else) and Q8_1's sx. */
typedef struct {
    const int8_t *q;
    const float *d, *sx;
    const int16_t *bsum;
    const int32_t *sum;
    const uint8_t *coarse;          /* per row: 1 where rounding crushed it (rounding.h) */
    int K, blocks, coarse_rows;
} Rows;

static size_t rows_bytes(int K, int n) { return (size_t)n * (2 * (size_t)K + 64) + 64; }
static size_t amx_bytes(int K, int n);

size_t block_scratch_bytes(int K, int n) { return rows_bytes(K, n) + amx_bytes(K, n); }

static int quantize_rows(int type, const float *x, int n, int K, void *scratch, Rows *rows, int threads) {
    const int blocks = K / block_weights(type);
    int8_t *q = scratch;
    float *d = (float *)(q + (((size_t)n * K + 63) & ~(size_t)63)), *sx = d + (size_t)n * blocks;
    int32_t *sum = (int32_t *)(sx + (size_t)n * blocks);
    int16_t *bsum = (int16_t *)(sum + (size_t)n * blocks);
    uint8_t *coarse = (uint8_t *)(bsum + (size_t)n * K / 16);
    int bad = 0, count = 0;
    _Pragma("omp parallel for schedule(static) num_threads(threads) reduction(|:bad) reduction(+:count) if (n >= 4)")
    for (int r = 0; r < n; r++) {                                                                   /* each row alone */
        if (k_quant(type))
            for (int b = 0; b < blocks; b++)
                bad |= quantize_q8_k(x + (size_t)r * K + (size_t)b * QK_K, q + (size_t)r * K + (size_t)b * QK_K,
                                     d + (size_t)r * blocks + b, bsum + (size_t)r * K / 16 + (size_t)b * 16, type == GGUF_Q4_K);
        else
            bad |= quantize_q8_0(x + (size_t)r * K, K, q + (size_t)r * K, d + (size_t)r * blocks, sum + (size_t)r * blocks,
                                 sx + (size_t)r * blocks);
        const float *row = x + (size_t)r * K, *scales = d + (size_t)r * blocks;
        const int per = block_weights(type);
        coarse[r] = (uint8_t)(!rounding_fine(q + (size_t)r * K, scales, K, per) && rounding_crushed(row, q + (size_t)r * K, scales, K, per));
        count += coarse[r];
    }
    *rows = (Rows){q, d, sx, bsum, sum, coarse, K, blocks, count};
    return bad;
}

/* ---------------------------------------------------------------- one block of a tile into a group of rows */

static inline uint16_t read16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return h; }

/* The first 16 bytes of a tile's Q4_K blocks (d and dmin, then 12 bytes of 6-bit scales and mins) -> per block its
 * 8 scales, a byte each; the mins as int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7), a block per lane, for
 * i4_madd16 with the rows' sums per 32 (quantize_q8_k's order); and the d, dmin of each block. */
ALWAYS void q4_k_scales(const uint8_t *const blk[BLOCK_TILE], uint8_t scales[BLOCK_TILE][8], I4 mins[4], F4 *d, F4 *dmin) {
    I4 in[4], u[4], r[4];
    for (int o = 0; o < BLOCK_TILE; o++) in[o] = i4_load(blk[o]);
    i4_transpose(in, u);                     /* u[0]: d | dmin << 16, u[1..3]: the scale bytes 0-3, 4-7, 8-11 */
    const I4 low4 = i4_dup(0x0f0f0f0f), low6 = i4_dup(0x3f3f3f3f), low2 = i4_dup(0x03030303), even = i4_dup(0x00ff00ff);
    r[0] = i4_and(u[1], low6);                                                           /* scales 0-3 */
    r[1] = i4_or(i4_and(u[3], low4), i4_shl(i4_and(i4_shr(u[1], 6), low2), 4));          /* scales 4-7 */
    r[2] = i4_and(u[2], low6);                                                           /* mins 0-3 */
    r[3] = i4_or(i4_and(i4_shr(u[3], 4), low4), i4_shl(i4_and(i4_shr(u[2], 6), low2), 4)); /* mins 4-7 */
    for (int k = 0; k < 2; k++) {
        mins[2 * k] = i4_and(r[2 + k], even);
        mins[2 * k + 1] = i4_and(i4_shr(r[2 + k], 8), even);
    }
    i4_zip(r[0], r[1], in);                  /* each block's 8 scales together: blocks 0 and 1, then 2 and 3 */
    i4_store(scales[0], in[0]);
    i4_store(scales[2], in[1]);
    *d = f4_low_halves(u[0]);
    *dmin = f4_high_halves(u[0]);
}

/* Block b of BLOCK_TILE outputs (w[o]: their rows): the per-block part of the unpacking (scales, mins, d), and pointers
 * to the blocks for pair() */
typedef struct {
    const uint8_t *blk[BLOCK_TILE];
    T table[BLOCK_TILE][2];     /* Q4_K: its 8 scales; Q6_K: its scales 0-7, then 8-15 */
    V extra[BLOCK_TILE];        /* Q6_K: -32 times the scales, int16 per 16 values */
    I4 mins[4];                 /* Q4_K: the mins, as q4_k_scales pairs them */
    F4 d, m;                    /* d; Q4_K's dmin */
} KScales;

ALWAYS void k_scales(const int type, const uint8_t *const w[BLOCK_TILE], int b, KScales *k) {
    const int bytes = K_BYTES(type);
    for (int o = 0; o < BLOCK_TILE; o++) k->blk[o] = w[o] + (size_t)b * bytes;
    if (type == GGUF_Q4_K) {
        uint8_t scales[BLOCK_TILE][8];
        q4_k_scales(k->blk, scales, k->mins, &k->d, &k->m);
        for (int o = 0; o < BLOCK_TILE; o++) k->table[o][0] = t_load((const int8_t *)scales[o]);
    } else {
        for (int o = 0; o < BLOCK_TILE; o++) {
            const int8_t *sc = (const int8_t *)(k->blk[o] + offsetof(block_q6_K, scales));
            k->table[o][0] = t_load(sc);
            k->table[o][1] = t_load(sc + 8);
            k->extra[o] = v_neg16(v_widen16(sc, 5));
        }
        const size_t at = offsetof(block_q6_K, d);
        k->d = f4_halves(read16(k->blk[0] + at), read16(k->blk[1] + at), read16(k->blk[2] + at), read16(k->blk[3] + at));
    }
}

/* Weights 64p .. 64p + 63 of a block (sub-blocks 2p and 2p + 1) as bytes */
ALWAYS W k_weights(const int type, const uint8_t *blk, int p) {
    if (type == GGUF_Q4_K) return w_nibbles32(blk + offsetof(block_q4_K, qs) + 32 * p);   /* qs byte 32p + l: weight 64p + l (low nibble), 64p + 32 + l (high) */
    const int h = p >> 1, half = 2 * (p & 1);  /* weight 128h + 32k + l: 4 bits of ql[64h + 32 (k & 1) + l], 2 of qh[32h + l] */
    const W ql = w_load(blk + offsetof(block_q6_K, ql) + 64 * h);
    return w_or(half ? w_high_nibbles(ql) : w_low_nibbles(ql), w_two_bits(blk + offsetof(block_q6_K, qh) + 32 * h, 2 * half));
}

/* Weights 64p .. 64p + 63 of output o's block, and their scales per lane */
ALWAYS void pair(const int type, const KScales *k, int o, int p, W *w, SW *s) {
    *w = k_weights(type, k->blk[o], p);
    if (type == GGUF_Q4_K) *s = sw_pick(k->table[o][0], 2 * p, 2 * p, 2 * p + 1, 2 * p + 1);
    else {
        const int h = p >> 1, half = 2 * (p & 1);
        *s = sw_pick(k->table[o][h], 2 * half, 2 * half + 1, 2 * half + 2, 2 * half + 3);
    }
}

/* A block's whole unpacking, kept for every group of rows when there are more than FEW_ROWS */
typedef struct {
    KScales k;
    W w[BLOCK_TILE][4];
    SW s[BLOCK_TILE][4];
} KBlock;

ALWAYS void unpack_k_quant(const int type, const uint8_t *const w[BLOCK_TILE], int b, KBlock *u) {
    k_scales(type, w, b, &u->k);
    UNROLL for (int p = 0; p < 4; p++)
        UNROLL for (int o = 0; o < BLOCK_TILE; o++) pair(type, &u->k, o, p, &u->w[o][p], &u->s[o][p]);
}

/* A group's accumulators before a block: Q6_K's start at -32 times the scaled sums of the rows' 16-value groups
 * (its weights are stored + 32); Q4_K's start with the first products (dot_k_quant) */
ALWAYS void start_k_quant(const int type, const KScales *k, const int R, A wide[BLOCK_TILE][R], const Rows *x, int b, int r0) {
    if (type == GGUF_Q6_K)
        for (int r = 0; r < R; r++) {
            const V bsum = v_load(x->bsum + (size_t)(r0 + r) * (x->K / 16) + (size_t)b * 16);
            for (int o = 0; o < BLOCK_TILE; o++) wide[o][r] = a_widen(v_madd16(v_zero(), k->extra[o], bsum));
        }
}

/* acc + the scaled products of weights w and activations x, of pair p of a block (Q4_K's pair 0: no acc yet) */
ALWAYS A dot_k_quant(const int type, int p, A acc, W w, W x, SW s) {
    return type == GGUF_Q4_K && p == 0 ? a_scaled(w, x, s) : a_dot_scaled(acc, w, x, s);
}

/* The integer sums of a block and rows r0 .. r0 + R - 1 into the float results acc[r] */
ALWAYS void finish_k_quant(const int type, const KScales *k, const int R, A wide[BLOCK_TILE][R], const Rows *x, int b, int r0,
                           F4 *acc) {
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(r0 + r);
        const I4 sumi = a_sum4(wide[0][r], wide[1][r], wide[2][r], wide[3][r]);
        const F4 dx = f4_dup(x->d[row * x->blocks + b]);
        if (type == GGUF_Q6_K) {
            acc[r] = f4_add(acc[r], f4_mul(f4_mul(k->d, dx), f4_from(sumi)));
        } else {
            const int16_t *s32 = x->bsum + row * (x->K / 16) + (size_t)b * 16;   /* quantize_q8_k's pairs of sums */
            I4 summ = i4_dup(0);
            for (int j = 0; j < 4; j++) {
                int32_t pair;
                memcpy(&pair, s32 + 2 * j, 4);
                summ = i4_madd16(summ, k->mins[j], i4_dup(pair));
            }
            acc[r] = f4_add(acc[r], f4_sub(f4_mul(f4_mul(k->d, dx), f4_from(sumi)), f4_mul(f4_mul(k->m, dx), f4_from(summ))));
        }
    }
}

ALWAYS const int8_t *x_at(const Rows *x, int row, int b, int p) { return x->q + (size_t)row * x->K + (size_t)b * QK_K + 64 * p; }

/* An unpacked block into rows r0 .. r0 + R - 1 */
ALWAYS void rows_k_quant(const int type, const KBlock *u, const Rows *x, int b, int r0, const int R, F4 *acc) {
    A wide[BLOCK_TILE][R];
    start_k_quant(type, &u->k, R, wide, x, b, r0);
    UNROLL for (int p = 0; p < 4; p++)
        UNROLL for (int o = 0; o < BLOCK_TILE; o++)
            for (int r = 0; r < R; r++) wide[o][r] = dot_k_quant(type, p, wide[o][r], u->w[o][p], w_load(x_at(x, r0 + r, b, p)), u->s[o][p]);
    finish_k_quant(type, &u->k, R, wide, x, b, r0, acc);
}

/* A block into rows r0 .. r0 + R - 1 (one group), unpacked 64 weights at a time in registers: no memory in between */
ALWAYS void block_k_quant(const int type, const uint8_t *const w[BLOCK_TILE], const Rows *x, int b, int r0, const int R, F4 *acc) {
    KScales k;
    k_scales(type, w, b, &k);
    A wide[BLOCK_TILE][R];
    start_k_quant(type, &k, R, wide, x, b, r0);
    UNROLL for (int p = 0; p < 4; p++)
        UNROLL for (int o = 0; o < BLOCK_TILE; o++) {
            W wv;
            SW sv;
            pair(type, &k, o, p, &wv, &sv);
            for (int r = 0; r < R; r++) wide[o][r] = dot_k_quant(type, p, wide[o][r], wv, w_load(x_at(x, r0 + r, b, p)), sv);
        }
    finish_k_quant(type, &k, R, wide, x, b, r0, acc);
}

typedef struct {
    V w[BLOCK_TILE];            /* the weights as bytes (unsigned, but Q8_0's signed) */
    F4 d, m;                    /* d; Q4_1's m */
} LBlock;

ALWAYS void unpack_legacy(const int type, const uint8_t *const w[BLOCK_TILE], int b, LBlock *u) {
    const int bytes = bytes_of(type);
    uint16_t d[BLOCK_TILE], m[BLOCK_TILE];
    for (int o = 0; o < BLOCK_TILE; o++) {
        const uint8_t *blk = w[o] + (size_t)b * bytes;
        d[o] = read16(blk);                                       /* every legacy block starts with d */
        m[o] = type == GGUF_Q4_1 ? read16(blk + offsetof(block_q4_1, m)) : 0;
        switch (type) {
        case GGUF_Q4_0: u->w[o] = v_nibbles16(blk + offsetof(block_q4_0, qs)); break;
        case GGUF_Q4_1: u->w[o] = v_nibbles16(blk + offsetof(block_q4_1, qs)); break;
        case GGUF_Q5_0: u->w[o] = v_or(v_nibbles16(blk + offsetof(block_q5_0, qs)), v_bits16(blk + offsetof(block_q5_0, qh))); break;
        default: u->w[o] = v_load(blk + offsetof(block_q8_0, qs)); break;                /* Q8_0: signed */
        }
    }
    u->d = f4_halves(d[0], d[1], d[2], d[3]);
    u->m = f4_halves(m[0], m[1], m[2], m[3]);
}

ALWAYS void rows_legacy(const int type, const LBlock *u, const Rows *x, int b, int r0, const int R, F4 *acc) {
    const int offset = type == GGUF_Q4_0 ? 8 : type == GGUF_Q5_0 ? 16 : 0;
    for (int r = 0; r < R; r++) {
        const size_t row = (size_t)(r0 + r), at = row * x->blocks + b;
        const V xv = v_load(x->q + row * x->K + (size_t)b * QK_LEGACY);
        V sums[BLOCK_TILE];
        for (int o = 0; o < BLOCK_TILE; o++)
            sums[o] = type == GGUF_Q8_0 ? v_dot_signed(v_zero(), u->w[o], xv) : v_dot(v_zero(), u->w[o], xv);
        I4 sumi = v_sum4(sums[0], sums[1], sums[2], sums[3]);
        if (offset) sumi = i4_sub(sumi, i4_dup(offset * x->sum[at]));
        F4 t = f4_mul(f4_mul(u->d, f4_dup(x->d[at])), f4_from(sumi));
        if (type == GGUF_Q4_1) t = f4_add(t, f4_mul(u->m, f4_dup(x->sx[at])));
        acc[r] = f4_add(acc[r], t);
    }
}

/* Block b into rows r0 .. r0 + count - 1 (count <= ROWS_AT_ONCE), in groups of ROW_GROUP: each group size a constant,
 * so that its accumulators are registers */
ALWAYS void rows(const int type, const void *u, const Rows *x, int b, int r0, int count, F4 *acc) {
    int r = 0;
#define ROWS(R) (k_quant(type) ? rows_k_quant(type, u, x, b, r0 + r, R, acc + r) : rows_legacy(type, u, x, b, r0 + r, R, acc + r))
    for (; r + ROW_GROUP <= count; r += ROW_GROUP) ROWS(ROW_GROUP);
    switch (count - r) {
#if ROW_GROUP > 3
    case 3: ROWS(3); break;
#endif
#if ROW_GROUP > 2
    case 2: ROWS(2); break;
#endif
    case 1: ROWS(1); break;
    default: break;
    }
#undef ROWS
}

/* The cache lines of block `at` from `row`: its last byte's and every 64 bytes back from there (its first line, if not
 * among them, holds the block before's last byte) */
ALWAYS void prefetch_block(const int type, const uint8_t *row, size_t at) {
    const int bytes = bytes_of(type);
    for (int k = bytes - 1; k >= 0; k -= 64) prefetch(row + at * bytes + k);
}

/* The block PREFETCH_AHEAD past block b of each of an AMX tile's rows (neighbouring outputs): past a row's end, in the
 * rows of the tiles after */
ALWAYS void prefetch_ahead(const int type, const uint8_t *const *w, const int outputs, int blocks, int b) {
    const size_t at = b + PREFETCH_AHEAD < blocks ? (size_t)(b + PREFETCH_AHEAD) : (size_t)(b + PREFETCH_AHEAD + (outputs - 1) * blocks);
    for (int o = 0; o < outputs; o++) prefetch_block(type, w[o], at);
}

/* The same for a tile's rows, a quarter of the outputs apart: past a row's end, the next row is the next tile's */
ALWAYS void prefetch_rows_ahead(const int type, const uint8_t *const w[BLOCK_TILE], int b) {
    for (int o = 0; o < BLOCK_TILE; o++) prefetch_block(type, w[o], (size_t)b + PREFETCH_AHEAD);
}

/* All blocks of a tile into at most one group of rows (R of them), each block unpacked in registers (block_k_quant) */
ALWAYS void few_rows(const int type, const uint8_t *const w[BLOCK_TILE], const Rows *x, int r0, const int R, F4 *acc) {
    for (int b = 0; b < x->blocks; b++) {
        if (r0 == 0) prefetch_rows_ahead(type, w, b);
        block_k_quant(type, w, x, b, r0, R, acc);
    }
}

/* few_rows for a count known at run time (count <= FEW_ROWS): each count compiled on its own */
ALWAYS void few_rows_of(const int type, const uint8_t *const w[BLOCK_TILE], const Rows *x, int r0, int count, F4 *acc) {
    switch (count) {
#if FEW_ROWS > 4
    case 8: few_rows(type, w, x, r0, 8, acc); break;
    case 7: few_rows(type, w, x, r0, 7, acc); break;
    case 6: few_rows(type, w, x, r0, 6, acc); break;
    case 5: few_rows(type, w, x, r0, 5, acc); break;
#endif
    case 4: few_rows(type, w, x, r0, 4, acc); break;
    case 3: few_rows(type, w, x, r0, 3, acc); break;
    case 2: few_rows(type, w, x, r0, 2, acc); break;
    default: few_rows(type, w, x, r0, 1, acc); break;
    }
}

/* All blocks of a tile into count rows, each block unpacked once for them all */
ALWAYS void many_rows(const int type, const uint8_t *const w[BLOCK_TILE], const Rows *x, int r0, int count, F4 *acc) {
    for (int b = 0; b < x->blocks; b++) {
        if (r0 == 0) prefetch_rows_ahead(type, w, b);
        if (k_quant(type)) {
            KBlock u;
            unpack_k_quant(type, w, b, &u);
            rows(type, &u, x, b, r0, count, acc);
        } else {
            LBlock u;
            unpack_legacy(type, w, b, &u);
            rows(type, &u, x, b, r0, count, acc);
        }
    }
}

/* BLOCK_TILE outputs o0, o0 + stride, ... (w[o]: their rows; past the last output, the last again) for every row: each
 * block is unpacked once per ROWS_AT_ONCE rows. The choice of a loop comes before the blocks, so that each is compiled on
 * its own. */
ALWAYS void tile(const int type, const uint8_t *const w[BLOCK_TILE], const Rows *x, int n, float *y, int ldy, int o0, int outputs,
                 int stride) {
    for (int r0 = 0; r0 < n; r0 += ROWS_AT_ONCE) {
        const int count = n - r0 < ROWS_AT_ONCE ? n - r0 : ROWS_AT_ONCE;
        F4 acc[ROWS_AT_ONCE];
        for (int r = 0; r < count; r++) acc[r] = f4_zero();
        if (k_quant(type) && count <= FEW_ROWS) few_rows_of(type, w, x, r0, count, acc);
        else if (k_quant(type) && count <= GROUPS_OF_FEW * FEW_ROWS) {
            for (int r = 0; r < count; r += FEW_ROWS) few_rows_of(type, w, x, r0 + r, count - r < FEW_ROWS ? count - r : FEW_ROWS, acc + r);
        } else many_rows(type, w, x, r0, count, acc);
        for (int r = 0; r < count; r++) {
            float out[BLOCK_TILE];
            f4_store(out, acc[r]);
            for (int o = 0; o < outputs; o++) y[(size_t)(r0 + r) * ldy + o0 + (size_t)o * stride] = out[o];
        }
    }
}

#define PRODUCT_OF(TYPE, NAME)                                                                              \
    static void NAME(const uint8_t *w, size_t row_bytes, const Rows *x, int n, float *y, int ldy, int N,      \
                     int threads) {                                                                          \
        const int tiles = (N + BLOCK_TILE - 1) / BLOCK_TILE;                                                 \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                                    \
        for (int t = 0; t < tiles; t++) {                                                                    \
            int outputs = 0;                                                                                 \
            while (outputs < BLOCK_TILE && t + outputs * tiles < N) outputs++;                               \
            const uint8_t *rows[BLOCK_TILE];                                                                 \
            for (int o = 0; o < BLOCK_TILE; o++)                                                             \
                rows[o] = w + (size_t)(t + (o < outputs ? o : outputs - 1) * tiles) * row_bytes;             \
            tile(TYPE, rows, x, n, y, ldy, t, outputs, tiles);                                               \
        }                                                                                                    \
    }
PRODUCT_OF(GGUF_Q4_0, product_q4_0)
PRODUCT_OF(GGUF_Q4_1, product_q4_1)
PRODUCT_OF(GGUF_Q5_0, product_q5_0)
PRODUCT_OF(GGUF_Q8_0, product_q8_0)
PRODUCT_OF(GGUF_Q4_K, product_q4_k)
PRODUCT_OF(GGUF_Q6_K, product_q6_k)

/* Many rows of K-quant blocks, their outputs side by side, transposed (columns.h): 8 at a time on AVX2 without VNNI,
 * 16 on AVX-512 with VNNI. With AVX-VNNI's 256-bit dot products alone the tiles above measured faster; AMX has its own. */
#if defined(SIMD_NAME_BASE) && (!defined(SIMD_DOT_INSTRUCTION) || (defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(SIMD_AMX)))
#include "columns.h"
#endif


#if defined(SIMD_AMX) && defined(__linux__)
/* ---------------------------------------------------------------- many rows of a K-quant on AMX tiles
 * A tile product (TDPBUSD) adds to 16 x 16 int32 the products of 16 rows of 64 unsigned bytes and 16 columns of 64
 * signed ones: here 16 outputs' weights (A, 64 of a block's at a time) and 16 rows of x (B, in the layout the tiles
 * take: 4 consecutive values of each row side by side). A tile knows no sub-block scales, so the scales go into the
 * weights, split into digits small enough that weight times digit is still a byte: Q4_K's 6-bit scales as two 3-bit
 * digits (15 * 7 < 256), Q6_K's int8 scales as four 2-bit ones (63 * 3 < 256; the top one signed, -2..1, taken with
 * TDPBSSD). Each digit's plane of weights sums into a tile of its own over the block, and the planes' tiles shifted by
 * their digits' places add up to exactly the VNNI path's sumi: so the same float formula gives the same bits. */
#define AMX_OUT 16                  /* outputs per tile of weights (A's rows) */
#define AMX_GROUP 16                /* rows of x per tile (B's and C's columns) */

/* A block of 256 values of a group of 16 rows, packed for the tiles (rows past n: zeros) */
typedef struct {
    int8_t tile[4][16][64];         /* values 64c + 4j + i of row r: tile[c][j][4r + i] */
    int32_t sums[8][AMX_GROUP];     /* per row int16 pairs of its sums: Q4_K's 4 pairs per 32 (quantize_q8_k's order), Q6_K's 8 per 16 */
    float d[AMX_GROUP];             /* the rows' scales */
} XBlock;

/* A block of 16 outputs unpacked into digit planes */
typedef struct {
    uint8_t plane[4][AMX_OUT][QK_K]; /* the weights times digit i of their sub-block's scale (Q4_K: 2 planes, Q6_K: 4) */
    int32_t pairs[AMX_OUT][8];      /* int16 pairs per output: Q4_K the mins, as q4_k_scales pairs them; Q6_K -32 times its scales */
    float d[AMX_OUT], m[AMX_OUT];   /* d; Q4_K's dmin */
} WBlock;

static size_t amx_bytes(int K, int n) { return 64 + (size_t)((n + AMX_GROUP - 1) / AMX_GROUP) * ((K + QK_K - 1) / QK_K) * sizeof(XBlock); }

/* Block b of rows 16g .. 16g + 15 into the tiles' layout */
static void pack_block(const int type, const Rows *x, int n, int g, int b, XBlock *p) {
    memset(p, 0, sizeof *p);
    const int pairs = type == GGUF_Q4_K ? 4 : 8;
    for (int r = 0; r < AMX_GROUP && AMX_GROUP * g + r < n; r++) {
        const size_t row = (size_t)(AMX_GROUP * g + r);
        const int8_t *q = x->q + row * x->K + (size_t)b * QK_K;
        for (int c = 0; c < 4; c++)
            for (int j = 0; j < 16; j++) memcpy(&p->tile[c][j][4 * r], q + 64 * c + 4 * j, 4);
        for (int j = 0; j < pairs; j++) memcpy(&p->sums[j][r], x->bsum + row * (x->K / 16) + (size_t)b * 16 + 2 * j, 4);
        p->d[r] = x->d[row * x->blocks + b];
    }
}

/* Block b of outputs o0 .. o0 + 3 (of w[0..15]) into digit planes, and their scales */
ALWAYS void unpack_planes(const int type, const uint8_t *const w[AMX_OUT], int b, int o0, WBlock *u) {
    const int bytes = K_BYTES(type);
    const uint8_t *blk[4];
    for (int o = 0; o < 4; o++) blk[o] = w[o0 + o] + (size_t)b * bytes;
    uint8_t scales[4][8];
    F4 d, m = f4_zero();
    if (type == GGUF_Q4_K) {
        I4 mins[4], pairs[4];
        q4_k_scales(blk, scales, mins, &d, &m);
        i4_transpose(mins, pairs);
        for (int o = 0; o < 4; o++) i4_store(u->pairs[o0 + o], pairs[o]);
    } else {
        const size_t at = offsetof(block_q6_K, d);
        d = f4_halves(read16(blk[0] + at), read16(blk[1] + at), read16(blk[2] + at), read16(blk[3] + at));
        for (int o = 0; o < 4; o++) {
            const V extra = v_neg16(v_widen16((const int8_t *)blk[o] + offsetof(block_q6_K, scales), 5));
            memcpy(u->pairs[o0 + o], &extra, 32);
        }
    }
    f4_store(u->d + o0, d);
    f4_store(u->m + o0, m);
    for (int o = 0; o < 4; o++) {
        uint8_t(*const plane)[AMX_OUT][QK_K] = u->plane;
        if (type == GGUF_Q4_K) {                           /* scale = lo + 8 hi; sub-blocks 2p, 2p + 1 in pair p's halves */
            const W sc = w_bcast8(scales[o]), lo = w_bits(sc, 0, 7), hi = w_bits(sc, 3, 7);
            UNROLL for (int p = 0; p < 4; p++) {
                const W q = k_weights(type, blk[o], p);
                w_store(&plane[0][o0 + o][64 * p], w_times(q, w_pick_bytes(lo, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1)));
                w_store(&plane[1][o0 + o][64 * p], w_times(q, w_pick_bytes(hi, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1)));
            }
        } else {                                           /* scale = d0 + 4 d1 + 16 d2 + 64 d3; sub-blocks 4p .. 4p + 3 in pair p's quarters */
            const W sc = w_bcast16(blk[o] + offsetof(block_q6_K, scales));
            const W digit[4] = {w_bits(sc, 0, 3), w_bits(sc, 2, 3), w_bits(sc, 4, 3), w_bits(w_offset(sc), 6, 3)}; /* the last: d3 + 2 */
            UNROLL for (int p = 0; p < 4; p++) {
                const W q = k_weights(type, blk[o], p);
                UNROLL for (int i = 0; i < 4; i++) {
                    const W t = w_times(q, w_pick_bytes(digit[i], 4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3));
                    w_store(&plane[i][o0 + o][64 * p], i < 3 ? t : w_sub8(t, w_add8(q, q)));   /* q d3 = q (d3 + 2) - 2q, as int8 */
                }
            }
        }
    }
}

/* Values 64k .. 64k + 63 of a block of 16 outputs times a group of 16 rows, into a tile of sums per plane (C: 0-1 or
 * 0-3). Q4_K's quarters take turns with two sets of A and B tiles: a tile load waits for the products still reading
 * its tile, and holds up every instruction behind it meanwhile. */
ALWAYS void tiles_quarter(const int type, const WBlock *u, const XBlock *x, int k) {
    if (k == 0) {
        _tile_zero(0);
        _tile_zero(1);
        if (type == GGUF_Q6_K) {
            _tile_zero(2);
            _tile_zero(3);
        }
    }
    if (type == GGUF_Q4_K) {
        if (k & 1) {
            _tile_loadd(6, x->tile[k], 64);
            _tile_loadd(4, &u->plane[0][0][64 * k], QK_K);
            _tile_loadd(5, &u->plane[1][0][64 * k], QK_K);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 5, 6);
        } else {
            _tile_loadd(7, x->tile[k], 64);
            _tile_loadd(2, &u->plane[0][0][64 * k], QK_K);
            _tile_loadd(3, &u->plane[1][0][64 * k], QK_K);
            _tile_dpbusd(0, 2, 7);
            _tile_dpbusd(1, 3, 7);
        }
    } else {
        _tile_loadd(6, x->tile[k], 64);
        _tile_loadd(4, &u->plane[0][0][64 * k], QK_K);
        _tile_loadd(5, &u->plane[1][0][64 * k], QK_K);
        _tile_loadd(7, &u->plane[2][0][64 * k], QK_K);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 5, 6);
        _tile_dpbusd(2, 7, 6);
        _tile_loadd(4, &u->plane[3][0][64 * k], QK_K);
        _tile_dpbssd(3, 4, 6);                             /* the signed top digit */
    }
}

ALWAYS void store_tiles(const int type, int32_t c[4][AMX_OUT][AMX_GROUP]) {
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    if (type == GGUF_Q6_K) {
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
    }
}

/* Outputs o0 .. o0 + 3: the planes' sums into sumi, and blocks.c's formula into acc[o][r] (the 16 rows in a vector) */
ALWAYS void finish_tiles(const int type, const WBlock *u, const XBlock *x, int32_t c[4][AMX_OUT][AMX_GROUP], int o0,
                         float acc[AMX_OUT][AMX_GROUP]) {
    const FZ dx = fz_load(x->d);
    for (int o = o0; o < o0 + 4; o++) {
        FZ t;
        if (type == GGUF_Q4_K) {
            const Z sumi = z_add(z_load(c[0][o]), z_shl(z_load(c[1][o]), 3));
            Z summ = z_zero();
            for (int j = 0; j < 4; j++) summ = z_madd16(summ, z_dup(u->pairs[o][j]), z_load(x->sums[j]));
            t = fz_sub(fz_mul(fz_mul(fz_dup(u->d[o]), dx), fz_from(sumi)), fz_mul(fz_mul(fz_dup(u->m[o]), dx), fz_from(summ)));
        } else {
            Z sumi = z_add(z_add(z_load(c[0][o]), z_shl(z_load(c[1][o]), 2)), z_add(z_shl(z_load(c[2][o]), 4), z_shl(z_load(c[3][o]), 6)));
            for (int j = 0; j < 8; j++) sumi = z_madd16(sumi, z_dup(u->pairs[o][j]), z_load(x->sums[j]));   /* the -32 */
            t = fz_mul(fz_mul(fz_dup(u->d[o]), dx), fz_from(sumi));
        }
        fz_store(acc[o], fz_add(fz_load(acc[o]), t));
    }
}

/* 16 outputs (w[o]: their rows; past the last output, the last again) for every row, AMX_CHUNK rows at a time: each
 * block unpacked once for them all. (Interleaving the tiles' products with the vector work gains nothing measurable:
 * a product keeps a vector port busy while it runs.) */
ALWAYS void amx_tile(const int type, const uint8_t *const w[AMX_OUT], const Rows *x, const XBlock *packed, int n,
                     float *y, int ldy, int o0, int outputs) {
    WBlock u __attribute__((aligned(64)));
    int32_t c[4][AMX_OUT][AMX_GROUP] __attribute__((aligned(64)));
    float acc[AMX_CHUNK / AMX_GROUP][AMX_OUT][AMX_GROUP] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < n; r0 += AMX_CHUNK) {
        const int g0 = r0 / AMX_GROUP, groups = ((n - r0 < AMX_CHUNK ? n - r0 : AMX_CHUNK) + AMX_GROUP - 1) / AMX_GROUP;
        for (int g = 0; g < groups; g++)
            for (int o = 0; o < AMX_OUT; o++) fz_store(acc[g][o], fz_zero());
        for (int b = 0; b < x->blocks; b++) {
            if (r0 == 0) prefetch_ahead(type, w, AMX_OUT, x->blocks, b);
            for (int o = 0; o < AMX_OUT; o += 4) unpack_planes(type, w, b, o, &u);
            for (int g = 0; g < groups; g++) {
                const XBlock *p = packed + (size_t)(g0 + g) * x->blocks + b;
                for (int k = 0; k < 4; k++) tiles_quarter(type, &u, p, k);
                store_tiles(type, c);
                for (int o = 0; o < AMX_OUT; o += 4) finish_tiles(type, &u, p, c, o, acc[g]);
            }
        }
        for (int g = 0; g < groups; g++)
            for (int r = 0; r < AMX_GROUP && r0 + AMX_GROUP * g + r < n; r++)
                for (int o = 0; o < outputs; o++) y[(size_t)(r0 + AMX_GROUP * g + r) * ldy + o0 + o] = acc[g][o][r];
    }
}

/* The rows packed (in parallel), then tiles of 16 outputs; each thread loads its tile configuration, and gives the
 * tiles back at the end (so that its state saves stay small) */
static void amx_product(const int type, const uint8_t *w, size_t row_bytes, const Rows *x, int n, float *y, int ldy,
                        int N, int threads, void *at) {
    XBlock *packed = (XBlock *)(((uintptr_t)at + 63) & ~(uintptr_t)63);
    const int groups = (n + AMX_GROUP - 1) / AMX_GROUP, tiles = (N + AMX_OUT - 1) / AMX_OUT;
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int k = 0; k < groups * x->blocks; k++) pack_block(type, x, n, k / x->blocks, k % x->blocks, packed + k);
        amx_configure();
        #pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const int o0 = t * AMX_OUT, outputs = N - o0 < AMX_OUT ? N - o0 : AMX_OUT;
            const uint8_t *rows[AMX_OUT];
            for (int o = 0; o < AMX_OUT; o++) rows[o] = w + (size_t)(o0 + (o < outputs ? o : outputs - 1)) * row_bytes;
            if (type == GGUF_Q4_K) amx_tile(GGUF_Q4_K, rows, x, packed, n, y, ldy, o0, outputs);
            else amx_tile(GGUF_Q6_K, rows, x, packed, n, y, ldy, o0, outputs);
        }
        _tile_release();
    }
}

/* AMX asked for once: the CPU has it, the OS saves its state (XCR0 bits 17, 18), and Linux lets this process use it */
static int amx_state;
static void amx_ask(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return;   /* AMX-TILE, AMX-INT8 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return;                                  /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#else
static size_t amx_bytes(int K, int n) { (void)K; (void)n; return 0; }
#endif

int block_amx(void) {
#if defined(SIMD_AMX) && defined(__linux__)
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_ask);
    return amx_state;
#else
    return 0;
#endif
}

size_t block_packed_bytes(int type, int K, int N) {
#if defined(COLUMNS_PATH) || defined(COLUMNS16_PATH)
    if (k_quant(type) && K > 0 && K % QK_K == 0 && N > 0) return packed_bytes(type, K, N);
#endif
    (void)type, (void)K, (void)N;
    return 0;
}

int block_pack(int type, const uint8_t *w, int K, int N, uint8_t *out, int threads) {
    if (!block_packed_bytes(type, K, N)) return BLOCKS_BAD_TYPE;
#if defined(COLUMNS_PATH) || defined(COLUMNS16_PATH)
    pack(type, w, K, N, out, threads);
#endif
    (void)w, (void)out, (void)threads;
    return 0;
}

/* The fewest rows of each K-quant that take the columns' path: tuning.h's counts, measured on one CPU, until this
 * machine's own are set (block_set_columns_from; specviz/models/block_paths.py times them). The crossover differs
 * between CPUs of one instruction set: held to AVX2, a Zen 4 ran a Q4_K row through the columns 10-26% sooner than
 * through the tiles, an Ice Lake 15-25% later. Either path gives the same bits. */
#if defined(COLUMNS_PATH)
static int columns_from[2] = {COLUMN_MIN_ROWS(GGUF_Q4_K), COLUMN_MIN_ROWS(GGUF_Q6_K)};
#elif defined(COLUMNS16_PATH)
static int columns_from[2] = {COLUMN16_MIN_ROWS(GGUF_Q4_K), COLUMN16_MIN_ROWS(GGUF_Q6_K)};
#endif

int block_columns_from(int type) {
#if defined(COLUMNS_PATH) || defined(COLUMNS16_PATH)
    if (k_quant(type)) return columns_from[type == GGUF_Q6_K];
#endif
    (void)type;
    return 0;
}

int block_set_columns_from(int type, int rows) {
    if (!block_columns_from(type)) return BLOCKS_BAD_TYPE;
    if (rows < 1) return BLOCKS_BAD_SHAPE;
#if defined(COLUMNS_PATH) || defined(COLUMNS16_PATH)
    columns_from[type == GGUF_Q6_K] = rows;
#endif
    return 0;
}

/* y = the rounded rows times W, by the path their count and this build take */
static void multiply(int type, const uint8_t *w, const uint8_t *packed, int K, int N, const Rows *rows, int n, float *y,
                     int ldy, int threads, void *amx_scratch) {
    const size_t row_bytes = (size_t)(K / block_weights(type)) * block_bytes(type);
#if defined(SIMD_AMX) && defined(__linux__)
    if (k_quant(type) && n >= AMX_MIN_ROWS(type) && block_amx()) {
        amx_product(type, w, row_bytes, rows, n, y, ldy, N, threads, amx_scratch);
        return;
    }
#else
    (void)amx_scratch;
#endif
#if defined(COLUMNS_PATH)
    if (packed && k_quant(type) && n >= columns_from[type == GGUF_Q6_K]) {
        columns_product(type, packed, rows, n, y, ldy, N, threads);
        return;
    }
#elif defined(COLUMNS16_PATH)
    if (packed && k_quant(type) && n >= columns_from[type == GGUF_Q6_K]) {
        columns16_product(type, packed, rows, n, y, ldy, N, threads);
        return;
    }
#else
    (void)packed;
#endif
    switch (type) {
    case GGUF_Q4_0: product_q4_0(w, row_bytes, rows, n, y, ldy, N, threads); break;
    case GGUF_Q4_1: product_q4_1(w, row_bytes, rows, n, y, ldy, N, threads); break;
    case GGUF_Q5_0: product_q5_0(w, row_bytes, rows, n, y, ldy, N, threads); break;
    case GGUF_Q8_0: product_q8_0(w, row_bytes, rows, n, y, ldy, N, threads); break;
    case GGUF_Q4_K: product_q4_k(w, row_bytes, rows, n, y, ldy, N, threads); break;
    default: product_q6_k(w, row_bytes, rows, n, y, ldy, N, threads); break;
    }
}

/* The rows that rounding crushed (rows->coarse): each one's remainder x - d q rounded to int8 in turn and multiplied,
 * and added to its first product. Each row alone, in float32 as written: reference.py's product() does the same. */
static int round_again(int type, const uint8_t *w, const uint8_t *packed, int K, int N, const float *x, const Rows *rows,
                       int n, float *y, int ldy, int threads) {
    const int m = rows->coarse_rows, per = block_weights(type);
    float *rest = malloc(((size_t)m * K + (size_t)m * N) * sizeof(float));
    void *scratch = malloc(block_scratch_bytes(K, m));
    if (!rest || !scratch) {
        free(rest);
        free(scratch);
        return BLOCKS_NO_MEMORY;
    }
    float *extra = rest + (size_t)m * K;
    for (int r = 0, i = 0; r < n; r++) {
        if (!rows->coarse[r]) continue;
        for (int j = 0; j < K; j++)
            rest[(size_t)i * K + j] = x[(size_t)r * K + j] - rows->d[(size_t)r * rows->blocks + j / per] * (float)rows->q[(size_t)r * K + j];
        i++;
    }
    Rows again;
    quantize_rows(type, rest, m, K, scratch, &again, threads);
    multiply(type, w, packed, K, N, &again, m, extra, N, threads, (uint8_t *)scratch + rows_bytes(K, m));
    for (int r = 0, i = 0; r < n; r++) {
        if (!rows->coarse[r]) continue;
        for (int o = 0; o < N; o++) y[(size_t)r * ldy + o] += extra[(size_t)i * N + o];
        i++;
    }
    free(rest);
    free(scratch);
    return 0;
}

int block_product(int type, const uint8_t *w, const uint8_t *packed, int K, int N, const float *x, int n, float *y,
                  int ldy, int threads, void *scratch) {
    if (!block_bytes(type)) return BLOCKS_BAD_TYPE;
    if (K <= 0 || K % block_weights(type) || N <= 0 || n < 0 || ldy < N) return BLOCKS_BAD_SHAPE;
    Rows rows;
    if (quantize_rows(type, x, n, K, scratch, &rows, threads)) return BLOCKS_NOT_FINITE;
    multiply(type, w, packed, K, N, &rows, n, y, ldy, threads, (uint8_t *)scratch + rows_bytes(K, n));
    return rows.coarse_rows ? round_again(type, w, packed, K, N, x, &rows, n, y, ldy, threads) : 0;
}

const char *block_simd(void) { return SIMD_NAME; }
