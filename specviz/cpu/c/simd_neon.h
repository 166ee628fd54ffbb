/* simd.h's operations on ARM64 NEON (Apple Silicon, Graviton, a Raspberry Pi), with the dot-product extension
 * (`vdotq_s32`) where the build has it (__ARM_FEATURE_DOTPROD) and widening multiplies where it has not. A V is two
 * 16-byte registers: bytes 0-15, then 16-31, so int32 lane l is still the sum over bytes 4l..4l+3, as on x86, and
 * every integer and every float operation is the one the other instruction sets compute. Included by simd.h. */
#include <arm_neon.h>

#define SIMD_NEON 1
#if defined(__ARM_FEATURE_DOTPROD)
#define SIMD_NAME "NEON + dot product"
#else
#define SIMD_NAME "NEON"
#endif
typedef struct { int8x16_t lo, hi; } V;
typedef int32x4_t I4;
typedef float32x4_t F4;
typedef struct { int32x4_t lo, hi; } S;
typedef struct { int8_t s[8]; } T;

ALWAYS V v_pair(int8x16_t lo, int8x16_t hi) { V v = {lo, hi}; return v; }
ALWAYS V v_load(const void *p) { return v_pair(vld1q_s8((const int8_t *)p), vld1q_s8((const int8_t *)p + 16)); }
ALWAYS V v_zero(void) { return v_pair(vdupq_n_s8(0), vdupq_n_s8(0)); }
ALWAYS V v_or(V a, V b) { return v_pair(vorrq_s8(a.lo, b.lo), vorrq_s8(a.hi, b.hi)); }
ALWAYS int8x16_t low4(int8x16_t b) { return vandq_s8(b, vdupq_n_s8(0x0f)); }
ALWAYS int8x16_t high4(int8x16_t b) { return vreinterpretq_s8_u8(vshrq_n_u8(vreinterpretq_u8_s8(b), 4)); }
ALWAYS V v_low_nibbles(V b) { return v_pair(low4(b.lo), low4(b.hi)); }
ALWAYS V v_high_nibbles(V b) { return v_pair(high4(b.lo), high4(b.hi)); }
ALWAYS int8x16_t bits_at4(int8x16_t b, int s) {
    const uint8x16_t shifted = vshlq_u8(vreinterpretq_u8_s8(b), vdupq_n_s8((int8_t)-s));
    return vreinterpretq_s8_u8(vshlq_n_u8(vandq_u8(shifted, vdupq_n_u8(3)), 4));
}
ALWAYS V v_two_bits_at4(V b, int s) { return v_pair(bits_at4(b.lo, s), bits_at4(b.hi, s)); }
ALWAYS V v_nibbles16(const uint8_t *p) { const int8x16_t b = vld1q_s8((const int8_t *)p); return v_pair(low4(b), high4(b)); }
ALWAYS V v_bits16(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const uint8x16_t word = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    static const uint8_t first[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t masks[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t index = vld1q_u8(first), mask = vld1q_u8(masks), sixteen = vdupq_n_u8(16);
    const uint8x16_t lo = vandq_u8(vtstq_u8(vqtbl1q_u8(word, index), mask), sixteen);
    const uint8x16_t hi = vandq_u8(vtstq_u8(vqtbl1q_u8(word, vaddq_u8(index, vdupq_n_u8(2))), mask), sixteen);
    return v_pair(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
}
/* per int32 lane the sum of four products of int8 w and x (w unsigned values up to 127 are the same as int8) */
ALWAYS int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    const int16x8_t low = vmull_s8(vget_low_s8(w), vget_low_s8(x)), high = vmull_high_s8(w, x);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(low), vpaddlq_s16(high)));
#endif
}
ALWAYS V v_dot_lanes(V w, V x) {           /* the 8 int32 lanes, as the bytes of a V */
    return v_pair(vreinterpretq_s8_s32(dot16(vdupq_n_s32(0), w.lo, x.lo)), vreinterpretq_s8_s32(dot16(vdupq_n_s32(0), w.hi, x.hi)));
}
ALWAYS V v_add32(V a, V b) {
    return v_pair(vreinterpretq_s8_s32(vaddq_s32(vreinterpretq_s32_s8(a.lo), vreinterpretq_s32_s8(b.lo))),
                  vreinterpretq_s8_s32(vaddq_s32(vreinterpretq_s32_s8(a.hi), vreinterpretq_s32_s8(b.hi))));
}
ALWAYS V v_dot(V acc, V w, V x) { return v_add32(acc, v_dot_lanes(w, x)); }
ALWAYS V v_dot_signed(V acc, V w, V x) { return v_dot(acc, w, x); }
ALWAYS S s_make(int s0, int s1) { S s = {vdupq_n_s32(s0), vdupq_n_s32(s1)}; return s; }
ALWAYS T t_load(const int8_t *s8) { T t; memcpy(t.s, s8, 8); return t; }
ALWAYS S t_pair(T t, int i, int j) { return s_make(t.s[i], t.s[j]); }
ALWAYS V v_dot_scaled(V acc, V w, V x, S s) {
    const V d = v_dot_lanes(w, x);
    return v_pair(vreinterpretq_s8_s32(vmlaq_s32(vreinterpretq_s32_s8(acc.lo), vreinterpretq_s32_s8(d.lo), s.lo)),
                  vreinterpretq_s8_s32(vmlaq_s32(vreinterpretq_s32_s8(acc.hi), vreinterpretq_s32_s8(d.hi), s.hi)));
}
ALWAYS V v_widen16(const int8_t *s, int shift) {
    const int8x16_t b = vld1q_s8(s);
    const int16x8_t n = vdupq_n_s16((int16_t)shift);
    return v_pair(vreinterpretq_s8_s16(vshlq_s16(vmovl_s8(vget_low_s8(b)), n)), vreinterpretq_s8_s16(vshlq_s16(vmovl_high_s8(b), n)));
}
ALWAYS V v_neg16(V a) {
    return v_pair(vreinterpretq_s8_s16(vnegq_s16(vreinterpretq_s16_s8(a.lo))), vreinterpretq_s8_s16(vnegq_s16(vreinterpretq_s16_s8(a.hi))));
}
ALWAYS V v_scaled(V w, V x, S s) { return v_dot_scaled(v_zero(), w, x, s); }
ALWAYS int32x4_t madd8(int32x4_t acc, int16x8_t a, int16x8_t b) {     /* lane l += a[2l] b[2l] + a[2l+1] b[2l+1] */
    return vaddq_s32(acc, vpaddq_s32(vmull_s16(vget_low_s16(a), vget_low_s16(b)), vmull_high_s16(a, b)));
}
ALWAYS V v_madd16(V acc, V a, V b) {
    return v_pair(vreinterpretq_s8_s32(madd8(vreinterpretq_s32_s8(acc.lo), vreinterpretq_s16_s8(a.lo), vreinterpretq_s16_s8(b.lo))),
                  vreinterpretq_s8_s32(madd8(vreinterpretq_s32_s8(acc.hi), vreinterpretq_s16_s8(a.hi), vreinterpretq_s16_s8(b.hi))));
}
ALWAYS int32x4_t halves(V a) { return vaddq_s32(vreinterpretq_s32_s8(a.lo), vreinterpretq_s32_s8(a.hi)); }
ALWAYS I4 v_sum4(V a, V b, V c, V d) {
    return vpaddq_s32(vpaddq_s32(halves(a), halves(b)), vpaddq_s32(halves(c), halves(d)));
}
ALWAYS I4 i4_madd16(I4 acc, I4 a, I4 b) { return madd8(acc, vreinterpretq_s16_s32(a), vreinterpretq_s16_s32(b)); }
ALWAYS I4 i4_sub(I4 a, I4 b) { return vsubq_s32(a, b); }
ALWAYS I4 i4_dup(int a) { return vdupq_n_s32(a); }
ALWAYS I4 i4_load(const void *p) { return vld1q_s32((const int32_t *)p); }
ALWAYS void i4_store(void *p, I4 a) { vst1q_s32((int32_t *)p, a); }
ALWAYS I4 i4_and(I4 a, I4 b) { return vandq_s32(a, b); }
ALWAYS I4 i4_or(I4 a, I4 b) { return vorrq_s32(a, b); }
ALWAYS I4 i4_shr(I4 a, int s) { return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a), vdupq_n_s32(-s))); }
ALWAYS I4 i4_shl(I4 a, int s) { return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a), vdupq_n_s32(s))); }
ALWAYS void i4_zip(I4 a, I4 b, I4 out[2]) {       /* a0 b0 a1 b1, then a2 b2 a3 b3 */
    out[0] = vzip1q_s32(a, b);
    out[1] = vzip2q_s32(a, b);
}
ALWAYS void i4_transpose(const I4 in[4], I4 out[4]) {
    const int64x2_t t0 = vreinterpretq_s64_s32(vzip1q_s32(in[0], in[1])), t1 = vreinterpretq_s64_s32(vzip1q_s32(in[2], in[3]));
    const int64x2_t t2 = vreinterpretq_s64_s32(vzip2q_s32(in[0], in[1])), t3 = vreinterpretq_s64_s32(vzip2q_s32(in[2], in[3]));
    out[0] = vreinterpretq_s32_s64(vzip1q_s64(t0, t1));
    out[1] = vreinterpretq_s32_s64(vzip2q_s64(t0, t1));
    out[2] = vreinterpretq_s32_s64(vzip1q_s64(t2, t3));
    out[3] = vreinterpretq_s32_s64(vzip2q_s64(t2, t3));
}
ALWAYS F4 f4_from(I4 a) { return vcvtq_f32_s32(a); }
ALWAYS F4 f4_zero(void) { return vdupq_n_f32(0.0f); }
ALWAYS F4 f4_dup(float a) { return vdupq_n_f32(a); }
ALWAYS F4 f4_add(F4 a, F4 b) { return vaddq_f32(a, b); }
ALWAYS F4 f4_sub(F4 a, F4 b) { return vsubq_f32(a, b); }
ALWAYS F4 f4_mul(F4 a, F4 b) { return vmulq_f32(a, b); }
ALWAYS void f4_store(float *p, F4 a) { vst1q_f32(p, a); }
ALWAYS F4 f4_halves(uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
    const uint16_t h[4] = {a, b, c, d};
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}
ALWAYS F4 f4_low_halves(I4 a) { return vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(vreinterpretq_u32_s32(a)))); }
ALWAYS F4 f4_high_halves(I4 a) { return vcvt_f32_f16(vreinterpret_f16_u16(vshrn_n_u32(vreinterpretq_u32_s32(a), 16))); }
typedef struct { float32x4_t lo, hi; } F8;
ALWAYS F8 f8_pair(float32x4_t lo, float32x4_t hi) { F8 a = {lo, hi}; return a; }
ALWAYS F8 f8_load(const float *p) { return f8_pair(vld1q_f32(p), vld1q_f32(p + 4)); }
ALWAYS void f8_store(float *p, F8 a) { vst1q_f32(p, a.lo); vst1q_f32(p + 4, a.hi); }
ALWAYS F8 f8_zero(void) { return f8_pair(vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)); }
ALWAYS F8 f8_dup(float x) { return f8_pair(vdupq_n_f32(x), vdupq_n_f32(x)); }
ALWAYS F8 f8_add(F8 a, F8 b) { return f8_pair(vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_mul(F8 a, F8 b) { return f8_pair(vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_fma(F8 a, F8 b, F8 c) { return f8_pair(vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)); }
ALWAYS F8 f8_sub(F8 a, F8 b) { return f8_pair(vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_div(F8 a, F8 b) { return f8_pair(vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_max(F8 a, F8 b) { return f8_pair(vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_min(F8 a, F8 b) { return f8_pair(vminq_f32(a.lo, b.lo), vminq_f32(a.hi, b.hi)); }
ALWAYS F8 f8_round(F8 a) { return f8_pair(vrndnq_f32(a.lo), vrndnq_f32(a.hi)); }      /* ties to even */
ALWAYS float32x4_t pow2_4(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
ALWAYS F8 f8_pow2(F8 n) { return f8_pair(pow2_4(n.lo), pow2_4(n.hi)); }     /* 2^n for whole n in [-126, 127] */
ALWAYS float f8_sum(F8 v) {                /* the order of the x86 helper */
    const float32x4_t s = vaddq_f32(v.lo, v.hi), t = vaddq_f32(s, vextq_f32(s, s, 2));
    return vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 1);
}
#define prefetch(p) __builtin_prefetch(p, 0, 1)
