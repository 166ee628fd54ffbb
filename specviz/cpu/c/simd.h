/* The few vector operations specviz's block products are written in, once per instruction set (x86 AVX2, with
 * VNNI where the build has it; ARM64 NEON, with the dot-product extension where the build has it, in simd_neon.h;
 * portable C).
 *
 * A V is 32 bytes: 32 int8 (weights or activations), 16 int16, or 8 int32 lanes, int32 lane l holding the sum over
 * bytes 4l..4l+3. Every instruction set computes the same integers in the same lanes, and an I4 (4 int32) or F4
 * (4 floats) is plain element-wise arithmetic: so a kernel written on these helpers gives the same bits on every
 * CPU (integer sums are exact whatever instructions add them, and float work is element-wise, never reordered). */
#ifndef SPECVIZ_SIMD_H
#define SPECVIZ_SIMD_H
#include <stdint.h>
#include <string.h>

#define ALWAYS static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
/* BLOCK(R) (reading r) for rows 0 .. ROWS - 1, AT_ONCE (at most 8) at a time, then the rest: each count compiled on its
 * own, so that a pass's sums stay in registers (columns.h, rows_kernel.c's prompt reads) */
#define EVERY_ROW(ROWS, AT_ONCE, BLOCK)                                                                               \
    do {                                                                                                             \
        int r = 0;                                                                                                   \
        for (; r + (AT_ONCE) <= (ROWS); r += (AT_ONCE)) BLOCK(AT_ONCE);                                               \
        switch ((ROWS) - r) {                                                                                        \
        case 7: if (7 < (AT_ONCE)) BLOCK(7); break;                                                                  \
        case 6: if (6 < (AT_ONCE)) BLOCK(6); break;                                                                  \
        case 5: if (5 < (AT_ONCE)) BLOCK(5); break;                                                                  \
        case 4: if (4 < (AT_ONCE)) BLOCK(4); break;                                                                  \
        case 3: BLOCK(3); break;                                                                                     \
        case 2: BLOCK(2); break;                                                                                     \
        case 1: BLOCK(1); break;                                                                                     \
        default: break;                                                                                              \
        }                                                                                                            \
    } while (0)

#if defined(__AVX2__) && defined(__FMA__) && !defined(SPECVIZ_PORTABLE)
/* ---------------------------------------------------------------- x86: AVX2, VNNI where built with it */
#include <immintrin.h>
#define SIMD_X86 1
#define SIMD_NAME_BASE "AVX2"
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SIMD_VNNI " + AVX512-VNNI"
#define SIMD_DOT_INSTRUCTION        /* 8-bit dot products in one instruction */
#elif defined(__AVXVNNI__)
#define SIMD_VNNI " + AVX-VNNI"
#define SIMD_DOT_INSTRUCTION
#else
#define SIMD_VNNI ""
#endif
/* blocks.c's many-rows K-quant products on AMX tiles (the 512-bit build with -mamx-tile -mamx-int8) */
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SIMD_AMX_NAME " + AMX"
#else
#define SIMD_AMX_NAME ""
#endif
#define SIMD_NAME SIMD_NAME_BASE SIMD_VNNI SIMD_AMX_NAME
typedef __m256i V;
typedef __m128i I4;
typedef __m128 F4;

ALWAYS V v_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS V v_zero(void) { return _mm256_setzero_si256(); }
ALWAYS V v_or(V a, V b) { return _mm256_or_si256(a, b); }
ALWAYS V v_low_nibbles(V b) { return _mm256_and_si256(b, _mm256_set1_epi8(0x0f)); }
ALWAYS V v_high_nibbles(V b) { return _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0f)); }
/* bits s and s+1 of each byte, moved to bits 4 and 5 (s <= 6) */
ALWAYS V v_two_bits_at4(V b, int s) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(b, s), _mm256_set1_epi8(3)), 4);
}
/* 16 bytes of 4-bit pairs -> 32 bytes: the low nibbles, then the high nibbles */
ALWAYS V v_nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}
/* 32 bits (little-endian) -> 32 bytes, byte i = 16 where bit i is set, else 0 */
ALWAYS V v_bits16(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(16));
}
/* acc + per lane the sum of four products of unsigned w (0..127) and signed x (-127..127) */
ALWAYS V v_dot(V acc, V w, V x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, w, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}
/* the same for signed w: |w| times x with w's sign */
ALWAYS V v_dot_signed(V acc, V w, V x) { return v_dot(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }
/* A scale per int32 lane, for v_dot_scaled: the int16 pair (s, s), so that one multiply-add of the pair sums of
 * weights times activations gives s times their sum */
typedef V S;
/* A table of 8 int8 scales as int16: in both 128-bit halves for t_pair's shuffles, in the low one for sw_pick's */
typedef __m256i T;
ALWAYS T t_load(const int8_t *s8) {
    const __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)s8));
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
    return _mm256_castsi128_si256(h);
#else
    return _mm256_set_m128i(h, h);
#endif
}
/* lanes 0-3 take scale i, lanes 4-7 scale j (i, j constants) */
ALWAYS S t_pair(T t, int i, int j) {
    return _mm256_shuffle_epi8(t, _mm256_setr_epi8(2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1,
        2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1,
        2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1));
}
/* 16 int8 -> 16 int16 (times 2^shift) */
ALWAYS V v_widen16(const int8_t *s, int shift) { return _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s)), shift); }
ALWAYS V v_neg16(V a) { return _mm256_sub_epi16(_mm256_setzero_si256(), a); }
/* four halves -> floats */
ALWAYS F4 f4_halves(uint16_t a, uint16_t b, uint16_t c, uint16_t d) { return _mm_cvtph_ps(_mm_setr_epi16(a, b, c, d, 0, 0, 0, 0)); }
/* per lane s times the sum of four products of unsigned w (0..63) and signed x (the pair sums fit int16) */
ALWAYS V v_scaled(V w, V x, S s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), s); }
/* acc + v_scaled(w, x, s) */
ALWAYS V v_dot_scaled(V acc, V w, V x, S s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(w, x), s);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, _mm256_maddubs_epi16(w, x), s);
#else
    return _mm256_add_epi32(acc, v_scaled(w, x, s));
#endif
}
/* acc + per lane a[2l] b[2l] + a[2l+1] b[2l+1] over int16 pairs */
ALWAYS V v_madd16(V acc, V a, V b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
/* the four vectors' lane sums, in one I4 (interleaving halves, then adding: cheaper than hadd) */
ALWAYS I4 v_sum4(V a, V b, V c, V d) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    const __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
/* acc + per lane a[2l] b[2l] + a[2l+1] b[2l+1] over int16 pairs */
ALWAYS I4 i4_madd16(I4 acc, I4 a, I4 b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm_add_epi32(acc, _mm_madd_epi16(a, b));
#endif
}
ALWAYS I4 i4_sub(I4 a, I4 b) { return _mm_sub_epi32(a, b); }
ALWAYS I4 i4_dup(int a) { return _mm_set1_epi32(a); }
ALWAYS I4 i4_load(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
ALWAYS void i4_store(void *p, I4 a) { _mm_storeu_si128((__m128i *)p, a); }
ALWAYS I4 i4_and(I4 a, I4 b) { return _mm_and_si128(a, b); }
ALWAYS I4 i4_or(I4 a, I4 b) { return _mm_or_si128(a, b); }
ALWAYS I4 i4_shr(I4 a, int s) { return _mm_srli_epi32(a, s); }
ALWAYS I4 i4_shl(I4 a, int s) { return _mm_slli_epi32(a, s); }
/* rows to columns: out[k] holds word k of in[0..3] */
/* words a0 b0 a1 b1, then a2 b2 a3 b3 */
ALWAYS void i4_zip(I4 a, I4 b, I4 out[2]) {
    out[0] = _mm_unpacklo_epi32(a, b);
    out[1] = _mm_unpackhi_epi32(a, b);
}
ALWAYS void i4_transpose(const I4 in[4], I4 out[4]) {
    const __m128i t0 = _mm_unpacklo_epi32(in[0], in[1]), t1 = _mm_unpacklo_epi32(in[2], in[3]);
    const __m128i t2 = _mm_unpackhi_epi32(in[0], in[1]), t3 = _mm_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm_unpacklo_epi64(t0, t1);
    out[1] = _mm_unpackhi_epi64(t0, t1);
    out[2] = _mm_unpacklo_epi64(t2, t3);
    out[3] = _mm_unpackhi_epi64(t2, t3);
}
/* the halves in the low (high) 16 bits of each word, as floats */
ALWAYS F4 f4_low_halves(I4 a) { return _mm_cvtph_ps(_mm_packus_epi32(_mm_and_si128(a, _mm_set1_epi32(0xffff)), a)); }
ALWAYS F4 f4_high_halves(I4 a) { return _mm_cvtph_ps(_mm_packus_epi32(_mm_srli_epi32(a, 16), a)); }
ALWAYS F4 f4_from(I4 a) { return _mm_cvtepi32_ps(a); }
ALWAYS F4 f4_zero(void) { return _mm_setzero_ps(); }
ALWAYS F4 f4_dup(float a) { return _mm_set1_ps(a); }
ALWAYS F4 f4_set(float a, float b, float c, float d) { return _mm_setr_ps(a, b, c, d); }
ALWAYS F4 f4_add(F4 a, F4 b) { return _mm_add_ps(a, b); }
ALWAYS F4 f4_sub(F4 a, F4 b) { return _mm_sub_ps(a, b); }
ALWAYS F4 f4_mul(F4 a, F4 b) { return _mm_mul_ps(a, b); }
ALWAYS void f4_store(float *p, F4 a) { _mm_storeu_ps(p, a); }
/* 8 x 8 int32: out lane o of v[t] = in lane t of v[o] (blocks.c's columns, rows_kernel.c's prompt reads) */
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

#if defined(__AVX512F__)
/* two 256-bit halves as one 512-bit vector (the 16-output paths: columns.h, rows_kernel.c) */
ALWAYS __m512i join_halves(__m256i low, __m256i high) { return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1); }

ALWAYS __m512 join_float_halves(__m256 low, __m256 high) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(low)), _mm256_castps_pd(high), 1));
}
#endif

/* 64 bytes: W (two chunks of 32 weights), A (their int32 sums), SW (their scales: a quarter of the lanes each) */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SIMD_WIDE 1
typedef __m512i W;
typedef __m512i A;
typedef __m512i SW;
ALWAYS W w_load(const void *p) { return _mm512_loadu_si512(p); }
ALWAYS W w_or(W a, W b) { return _mm512_or_si512(a, b); }
ALWAYS W w_low_nibbles(W b) { return _mm512_and_si512(b, _mm512_set1_epi8(0x0f)); }
ALWAYS W w_high_nibbles(W b) { return _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0f)); }
/* 32 bytes of 4-bit pairs -> their low nibbles, then their high nibbles */
ALWAYS W w_nibbles32(const uint8_t *p) {
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_and_si512(_mm512_srlv_epi16(b, _mm512_setr_epi64(0, 0, 0, 0, 0x0004000400040004, 0x0004000400040004,
                                                                   0x0004000400040004, 0x0004000400040004)), _mm512_set1_epi8(0x0f));
}
/* 32 bytes -> bits s, s+1 of each at bits 4, 5; then bits s+2, s+3 (s <= 4) */
ALWAYS W w_two_bits(const uint8_t *p, int s) {
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const long long lo = 0x0001000100010001LL * s, hi = 0x0001000100010001LL * (s + 2);
    return _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(b, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi)),
                                              _mm512_set1_epi8(3)), 4);
}
/* int32 lanes 0-3 scale i0, 4-7 i1, 8-11 i2, 12-15 i3 of the table (constants) */
ALWAYS SW sw_pick(T t, int i0, int i1, int i2, int i3) {
    return _mm512_permutexvar_epi16(_mm512_set_epi64(0x0001000100010001LL * i3, 0x0001000100010001LL * i3, 0x0001000100010001LL * i2,
        0x0001000100010001LL * i2, 0x0001000100010001LL * i1, 0x0001000100010001LL * i1, 0x0001000100010001LL * i0,
        0x0001000100010001LL * i0), _mm512_castsi256_si512(t));
}
ALWAYS A a_widen(V v) { return _mm512_zextsi256_si512(v); }    /* upper lanes 0 */
ALWAYS A a_scaled(W w, W x, SW s) { return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), s); }
ALWAYS A a_dot_scaled(A acc, W w, W x, SW s) { return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w, x), s); }
/* the four accumulators' lane sums, in one I4 */
ALWAYS I4 a_sum4(A a, A b, A c, A d) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(SIMD_WIDE)
/* ---------------------------------------------------------------- AMX int8 tiles (blocks.c's many-rows K-quants) */
#define SIMD_AMX 1
/* this thread's tile registers: all eight 16 rows of 64 bytes (a thread must load its own before any tile work) */
ALWAYS void amx_configure(void) {
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((aligned(64))) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}
/* 8 bytes in every 64-bit lane; 16 bytes in every 128-bit lane */
ALWAYS W w_bcast8(const void *p) { uint64_t v; memcpy(&v, p, 8); return _mm512_set1_epi64((long long)v); }
ALWAYS W w_bcast16(const void *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }
/* per byte (b >> s) & mask (mask < 2^(8 - s)); b ^ 0x80 (an int8 as its unsigned offset by 128) */
ALWAYS W w_bits(W b, int s, int mask) { return _mm512_and_si512(_mm512_srli_epi16(b, s), _mm512_set1_epi8((char)mask)); }
ALWAYS W w_offset(W b) { return _mm512_xor_si512(b, _mm512_set1_epi8((char)0x80)); }
/* int16 lanes of 128-bit lane L: byte i_L of t's lane L (constants) */
ALWAYS W w_pick_bytes(W t, int i0, int i1, int i2, int i3) {
    return _mm512_shuffle_epi8(t, _mm512_set_epi64(0x8000800080008000LL | 0x0001000100010001LL * i3, 0x8000800080008000LL | 0x0001000100010001LL * i3,
        0x8000800080008000LL | 0x0001000100010001LL * i2, 0x8000800080008000LL | 0x0001000100010001LL * i2,
        0x8000800080008000LL | 0x0001000100010001LL * i1, 0x8000800080008000LL | 0x0001000100010001LL * i1,
        0x8000800080008000LL | 0x0001000100010001LL * i0, 0x8000800080008000LL | 0x0001000100010001LL * i0));
}
/* each byte of w times the int16 of its lane in s: exact where every product is below 256 (nothing carries over) */
ALWAYS W w_times(W w, W s) { return _mm512_mullo_epi16(w, s); }
ALWAYS W w_add8(W a, W b) { return _mm512_add_epi8(a, b); }
ALWAYS W w_sub8(W a, W b) { return _mm512_sub_epi8(a, b); }
ALWAYS void w_store(void *p, W a) { _mm512_storeu_si512(p, a); }
/* 16 int32 and 16 floats: a tile's row of results, one lane per row of x */
typedef __m512i Z;
typedef __m512 FZ;
ALWAYS Z z_load(const void *p) { return _mm512_loadu_si512(p); }
ALWAYS Z z_zero(void) { return _mm512_setzero_si512(); }
ALWAYS Z z_dup(int32_t a) { return _mm512_set1_epi32(a); }
ALWAYS Z z_add(Z a, Z b) { return _mm512_add_epi32(a, b); }
ALWAYS Z z_shl(Z a, int s) { return _mm512_slli_epi32(a, s); }
/* acc + per lane a[2l] b[2l] + a[2l+1] b[2l+1] over int16 pairs */
ALWAYS Z z_madd16(Z acc, Z a, Z b) { return _mm512_dpwssd_epi32(acc, a, b); }
ALWAYS FZ fz_load(const float *p) { return _mm512_loadu_ps(p); }
ALWAYS void fz_store(float *p, FZ a) { _mm512_storeu_ps(p, a); }
ALWAYS FZ fz_zero(void) { return _mm512_setzero_ps(); }
ALWAYS FZ fz_dup(float a) { return _mm512_set1_ps(a); }
ALWAYS FZ fz_from(Z a) { return _mm512_cvtepi32_ps(a); }
ALWAYS FZ fz_add(FZ a, FZ b) { return _mm512_add_ps(a, b); }
ALWAYS FZ fz_sub(FZ a, FZ b) { return _mm512_sub_ps(a, b); }
ALWAYS FZ fz_mul(FZ a, FZ b) { return _mm512_mul_ps(a, b); }
#endif
/* 8 floats: F8 (attention and norms), fused multiply-adds, and one order of summing the lanes */
typedef __m256 F8;
ALWAYS F8 f8_load(const float *p) { return _mm256_loadu_ps(p); }
ALWAYS void f8_store(float *p, F8 a) { _mm256_storeu_ps(p, a); }
ALWAYS F8 f8_zero(void) { return _mm256_setzero_ps(); }
ALWAYS F8 f8_dup(float a) { return _mm256_set1_ps(a); }
ALWAYS F8 f8_add(F8 a, F8 b) { return _mm256_add_ps(a, b); }
ALWAYS F8 f8_mul(F8 a, F8 b) { return _mm256_mul_ps(a, b); }
ALWAYS F8 f8_fma(F8 a, F8 b, F8 c) { return _mm256_fmadd_ps(a, b, c); }     /* a b + c, rounded once */
ALWAYS F8 f8_sub(F8 a, F8 b) { return _mm256_sub_ps(a, b); }
ALWAYS F8 f8_div(F8 a, F8 b) { return _mm256_div_ps(a, b); }
ALWAYS F8 f8_max(F8 a, F8 b) { return _mm256_max_ps(a, b); }
ALWAYS F8 f8_min(F8 a, F8 b) { return _mm256_min_ps(a, b); }
ALWAYS F8 f8_round(F8 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }  /* ties to even */
ALWAYS F8 f8_pow2(F8 n) {                  /* 2^n for whole n in [-126, 127] */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
ALWAYS float f8_sum(F8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* out[k] = f8_sum(v[k]), the same additions, for eight vectors at once (fewer shuffles than eight f8_sums) */
#define F8_SUMS 1
ALWAYS void f8_sums(const F8 v[8], float out[8]) {
    F8 half[4], pair[2];
    for (int k = 0; k < 4; k++)     /* lanes l + l4 of v[k] (low half) and of v[k + 4] (high half) */
        half[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[k], v[k + 4], 0x20), _mm256_permute2f128_ps(v[k], v[k + 4], 0x31));
    for (int k = 0; k < 2; k++)     /* (l0 + l4) + (l2 + l6) and (l1 + l5) + (l3 + l7) of half[2k], then of half[2k + 1] */
        pair[k] = _mm256_add_ps(_mm256_shuffle_ps(half[2 * k], half[2 * k + 1], 0x44), _mm256_shuffle_ps(half[2 * k], half[2 * k + 1], 0xee));
    /* the two sums of each vector added: v[0], v[1], v[2], v[3] in the low half, v[4] .. v[7] in the high one */
    f8_store(out, _mm256_add_ps(_mm256_shuffle_ps(pair[0], pair[1], 0x88), _mm256_shuffle_ps(pair[0], pair[1], 0xdd)));
}
/* into the L2 cache (L1 requests are fewer and busy with the loads) */
#define prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T2)

#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(SPECVIZ_PORTABLE)
/* ---------------------------------------------------------------- ARM64: NEON, the dot product where built with it */
#include "simd_neon.h"

#else
/* ---------------------------------------------------------------- portable C: the same lanes, one at a time */
#define SIMD_NAME "portable C"
#define SIMD_SOFT_HALVES 1              /* f4_halves and friends below, from half_to_float */
#include <math.h>
typedef struct { float f[8]; } F8;
ALWAYS F8 f8_load(const float *p) { F8 a; memcpy(a.f, p, 32); return a; }
ALWAYS void f8_store(float *p, F8 a) { memcpy(p, a.f, 32); }
ALWAYS F8 f8_zero(void) { F8 a; memset(a.f, 0, 32); return a; }
ALWAYS F8 f8_dup(float x) { F8 a; for (int l = 0; l < 8; l++) a.f[l] = x; return a; }
ALWAYS F8 f8_add(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] + b.f[l]; return a; }
ALWAYS F8 f8_mul(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] * b.f[l]; return a; }
ALWAYS F8 f8_fma(F8 a, F8 b, F8 c) { for (int l = 0; l < 8; l++) c.f[l] = fmaf(a.f[l], b.f[l], c.f[l]); return c; }
ALWAYS F8 f8_sub(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] - b.f[l]; return a; }
ALWAYS F8 f8_div(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] / b.f[l]; return a; }
ALWAYS F8 f8_max(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] > b.f[l] ? a.f[l] : b.f[l]; return a; }
ALWAYS F8 f8_min(F8 a, F8 b) { for (int l = 0; l < 8; l++) a.f[l] = a.f[l] < b.f[l] ? a.f[l] : b.f[l]; return a; }
ALWAYS F8 f8_round(F8 a) { for (int l = 0; l < 8; l++) a.f[l] = rintf(a.f[l]); return a; }    /* ties to even */
ALWAYS F8 f8_pow2(F8 n) {
    for (int l = 0; l < 8; l++) {
        const uint32_t bits = (uint32_t)((int32_t)n.f[l] + 127) << 23;
        memcpy(&n.f[l], &bits, 4);
    }
    return n;
}
ALWAYS float f8_sum(F8 v) {
    const float s0 = v.f[0] + v.f[4], s1 = v.f[1] + v.f[5], s2 = v.f[2] + v.f[6], s3 = v.f[3] + v.f[7];
    return (s0 + s2) + (s1 + s3);
}
typedef union { int8_t b[32]; uint8_t u[32]; int16_t h[16]; int32_t i[8]; } V;
typedef struct { int32_t i[4]; } I4;
typedef struct { float f[4]; } F4;
typedef V S;

ALWAYS V v_load(const void *p) { V v; memcpy(&v, p, 32); return v; }
ALWAYS V v_zero(void) { V v; memset(&v, 0, 32); return v; }
ALWAYS V v_or(V a, V b) { for (int j = 0; j < 32; j++) a.u[j] |= b.u[j]; return a; }
ALWAYS V v_low_nibbles(V b) { for (int j = 0; j < 32; j++) b.u[j] &= 15; return b; }
ALWAYS V v_high_nibbles(V b) { for (int j = 0; j < 32; j++) b.u[j] >>= 4; return b; }
ALWAYS V v_two_bits_at4(V b, int s) { for (int j = 0; j < 32; j++) b.u[j] = (uint8_t)(((b.u[j] >> s) & 3) << 4); return b; }
ALWAYS V v_nibbles16(const uint8_t *p) {
    V v;
    for (int j = 0; j < 16; j++) { v.u[j] = p[j] & 15; v.u[j + 16] = p[j] >> 4; }
    return v;
}
ALWAYS V v_bits16(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    V v;
    for (int j = 0; j < 32; j++) v.u[j] = (bits >> j & 1) ? 16 : 0;
    return v;
}
ALWAYS V v_dot(V acc, V w, V x) {
    for (int l = 0; l < 8; l++)
        for (int j = 4 * l; j < 4 * l + 4; j++) acc.i[l] += (int32_t)w.u[j] * x.b[j];
    return acc;
}
ALWAYS V v_dot_signed(V acc, V w, V x) {
    for (int l = 0; l < 8; l++)
        for (int j = 4 * l; j < 4 * l + 4; j++) acc.i[l] += (int32_t)w.b[j] * x.b[j];
    return acc;
}
typedef struct { int8_t s[8]; } T;
ALWAYS T t_load(const int8_t *s8) { T t; memcpy(t.s, s8, 8); return t; }
ALWAYS S t_pair(T t, int i, int j) { S s; for (int l = 0; l < 8; l++) s.i[l] = l < 4 ? t.s[i] : t.s[j]; return s; }
ALWAYS V v_widen16(const int8_t *s, int shift) { V v; for (int k = 0; k < 16; k++) v.h[k] = (int16_t)(s[k] * (1 << shift)); return v; }
ALWAYS V v_neg16(V a) { for (int k = 0; k < 16; k++) a.h[k] = (int16_t)-a.h[k]; return a; }
ALWAYS V v_dot_scaled(V acc, V w, V x, S s) {
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++) t += (int32_t)w.u[j] * x.b[j];
        acc.i[l] += t * s.i[l];
    }
    return acc;
}
ALWAYS V v_scaled(V w, V x, S s) { return v_dot_scaled(v_zero(), w, x, s); }
ALWAYS V v_madd16(V acc, V a, V b) {
    for (int l = 0; l < 8; l++) acc.i[l] += (int32_t)a.h[2 * l] * b.h[2 * l] + (int32_t)a.h[2 * l + 1] * b.h[2 * l + 1];
    return acc;
}
ALWAYS I4 v_sum4(V a, V b, V c, V d) {
    I4 s = {{0, 0, 0, 0}};
    for (int l = 0; l < 8; l++) { s.i[0] += a.i[l]; s.i[1] += b.i[l]; s.i[2] += c.i[l]; s.i[3] += d.i[l]; }
    return s;
}
ALWAYS I4 i4_madd16(I4 acc, I4 a, I4 b) {
    int16_t x[8], y[8];
    memcpy(x, &a, 16);
    memcpy(y, &b, 16);
    for (int k = 0; k < 4; k++) acc.i[k] += (int32_t)x[2 * k] * y[2 * k] + (int32_t)x[2 * k + 1] * y[2 * k + 1];
    return acc;
}
ALWAYS I4 i4_sub(I4 a, I4 b) { for (int k = 0; k < 4; k++) a.i[k] -= b.i[k]; return a; }
ALWAYS I4 i4_load(const void *p) { I4 a; memcpy(&a, p, 16); return a; }
ALWAYS void i4_store(void *p, I4 a) { memcpy(p, &a, 16); }
ALWAYS I4 i4_and(I4 a, I4 b) { for (int k = 0; k < 4; k++) a.i[k] &= b.i[k]; return a; }
ALWAYS I4 i4_or(I4 a, I4 b) { for (int k = 0; k < 4; k++) a.i[k] |= b.i[k]; return a; }
ALWAYS I4 i4_shr(I4 a, int s) { for (int k = 0; k < 4; k++) a.i[k] = (int32_t)((uint32_t)a.i[k] >> s); return a; }
ALWAYS I4 i4_shl(I4 a, int s) { for (int k = 0; k < 4; k++) a.i[k] = (int32_t)((uint32_t)a.i[k] << s); return a; }
ALWAYS void i4_zip(I4 a, I4 b, I4 out[2]) {
    for (int k = 0; k < 2; k++) {
        out[0].i[2 * k] = a.i[k];
        out[0].i[2 * k + 1] = b.i[k];
        out[1].i[2 * k] = a.i[2 + k];
        out[1].i[2 * k + 1] = b.i[2 + k];
    }
}
ALWAYS void i4_transpose(const I4 in[4], I4 out[4]) {
    for (int k = 0; k < 4; k++)
        for (int o = 0; o < 4; o++) out[k].i[o] = in[o].i[k];
}
ALWAYS I4 i4_dup(int a) { I4 s = {{a, a, a, a}}; return s; }
ALWAYS F4 f4_from(I4 a) { F4 f; for (int k = 0; k < 4; k++) f.f[k] = (float)a.i[k]; return f; }
ALWAYS F4 f4_zero(void) { F4 f = {{0, 0, 0, 0}}; return f; }
ALWAYS F4 f4_dup(float a) { F4 f = {{a, a, a, a}}; return f; }
ALWAYS F4 f4_set(float a, float b, float c, float d) { F4 f = {{a, b, c, d}}; return f; }
ALWAYS F4 f4_add(F4 a, F4 b) { for (int k = 0; k < 4; k++) a.f[k] = a.f[k] + b.f[k]; return a; }
ALWAYS F4 f4_sub(F4 a, F4 b) { for (int k = 0; k < 4; k++) a.f[k] = a.f[k] - b.f[k]; return a; }
ALWAYS F4 f4_mul(F4 a, F4 b) { for (int k = 0; k < 4; k++) a.f[k] = a.f[k] * b.f[k]; return a; }
ALWAYS void f4_store(float *p, F4 a) { memcpy(p, &a, 16); }
#define prefetch(p) __builtin_prefetch(p, 0, 1)
#endif

/* e^x lane by lane (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-5 polynomial for e^r, then 2^n), within
 * about 2 ulp for x in [-87, 88], clamped there: the same operations in this order on every instruction set. */
ALWAYS F8 f8_exp(F8 x) {
    x = f8_min(f8_max(x, f8_dup(-87.0f)), f8_dup(88.0f));
    const F8 n = f8_round(f8_mul(x, f8_dup(1.44269504088896341f)));
    F8 r = f8_fma(n, f8_dup(-0.693359375f), x);
    r = f8_fma(n, f8_dup(2.12194440e-4f), r);
    F8 p = f8_dup(1.9875691500e-4f);
    p = f8_fma(p, r, f8_dup(1.3981999507e-3f));
    p = f8_fma(p, r, f8_dup(8.3334519073e-3f));
    p = f8_fma(p, r, f8_dup(4.1665795894e-2f));
    p = f8_fma(p, r, f8_dup(1.6666665459e-1f));
    p = f8_fma(p, r, f8_dup(5.0000001201e-1f));
    const F8 y = f8_add(f8_fma(f8_mul(p, r), r, r), f8_dup(1.0f));
    return f8_mul(y, f8_pow2(n));
}
#if !defined(F8_SUMS)
ALWAYS void f8_sums(const F8 v[8], float out[8]) { for (int k = 0; k < 8; k++) out[k] = f8_sum(v[k]); }
#endif

/* IEEE half -> float, exactly */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
    uint32_t bits;
    if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13);
    else if (exponent) bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (!mantissa) bits = sign;
    else {                                   /* subnormal: normalise */
        int e = -1;
        uint32_t m = mantissa;
        do { e++; m <<= 1; } while (!(m & 1024));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 1023) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> IEEE half, rounded to nearest even (as the F16C and NEON conversions do) */
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (abs >= 0x477ff000u) return sign | 0x7c00;             /* rounds past the largest half */
    if (abs < 0x38800000u) {                                  /* a subnormal half (or zero) */
        if (abs < 0x33000000u) return sign;
        const uint32_t e = abs >> 23, m = (abs & 0x7fffff) | 0x800000, shift = 126 - e;
        uint32_t h = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((abs >> 13) - (112u << 10));
    const uint32_t rest = abs & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

#if defined(SIMD_SOFT_HALVES)
ALWAYS F4 f4_halves(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
    return f4_set(half_to_float(a), half_to_float(b), half_to_float(c), half_to_float(d));
}
ALWAYS F4 f4_low_halves(I4 a) {
    return f4_halves((uint16_t)a.i[0], (uint16_t)a.i[1], (uint16_t)a.i[2], (uint16_t)a.i[3]);
}
ALWAYS F4 f4_high_halves(I4 a) {
    return f4_halves((uint16_t)((uint32_t)a.i[0] >> 16), (uint16_t)((uint32_t)a.i[1] >> 16), (uint16_t)((uint32_t)a.i[2] >> 16),
                     (uint16_t)((uint32_t)a.i[3] >> 16));
}
#endif

#if !defined(SIMD_WIDE)
/* 64 bytes as two V: the same helpers on the 32-byte ones */
typedef struct { V lo, hi; } W;
typedef V A;
typedef struct { S lo, hi; } SW;
ALWAYS W w_load(const void *p) { W w = {v_load(p), v_load((const uint8_t *)p + 32)}; return w; }
ALWAYS W w_or(W a, W b) { W w = {v_or(a.lo, b.lo), v_or(a.hi, b.hi)}; return w; }
ALWAYS W w_low_nibbles(W b) { W w = {v_low_nibbles(b.lo), v_low_nibbles(b.hi)}; return w; }
ALWAYS W w_high_nibbles(W b) { W w = {v_high_nibbles(b.lo), v_high_nibbles(b.hi)}; return w; }
ALWAYS W w_nibbles32(const uint8_t *p) { const V b = v_load(p); W w = {v_low_nibbles(b), v_high_nibbles(b)}; return w; }
ALWAYS W w_two_bits(const uint8_t *p, int s) { const V b = v_load(p); W w = {v_two_bits_at4(b, s), v_two_bits_at4(b, s + 2)}; return w; }
ALWAYS SW sw_pick(T t, int i0, int i1, int i2, int i3) { SW s = {t_pair(t, i0, i1), t_pair(t, i2, i3)}; return s; }
ALWAYS A a_widen(V v) { return v; }
ALWAYS A a_scaled(W w, W x, SW s) { return v_dot_scaled(v_scaled(w.lo, x.lo, s.lo), w.hi, x.hi, s.hi); }
ALWAYS A a_dot_scaled(A acc, W w, W x, SW s) { return v_dot_scaled(v_dot_scaled(acc, w.lo, x.lo, s.lo), w.hi, x.hi, s.hi); }
ALWAYS I4 a_sum4(A a, A b, A c, A d) { return v_sum4(a, b, c, d); }
#endif
#endif
