/* The GGUF block formats blocks.c reads, field by field, as ggml lays them out (ggml-common.h): the C code's one map of
 * their bytes. The kernels read blocks where the file's mapping puts them, through byte pointers, so a struct here is
 * never loaded whole: its sizeof is a block's bytes and its offsetof a field's place. Each is packed (no padding, any
 * address) and must come out at the size the file format fixes, BLOCK_BYTES_*, which Python reads too
 * (specviz/cpu/build.py's CONSTANTS; tests/test_block_map.py checks them against the gguf package's sizes, and the
 * structs' fields against specviz/cpu/reference.py's own map). Halves are IEEE binary16 bits, little-endian, as the
 * file stores them. */
#ifndef SPECVIZ_BLOCKS_H
#define SPECVIZ_BLOCKS_H
#include <stddef.h>
#include <stdint.h>
#include "specviz_cpu.h"

#define BLOCK_BYTES_Q4_0 18
#define BLOCK_BYTES_Q4_1 20
#define BLOCK_BYTES_Q5_0 22
#define BLOCK_BYTES_Q8_0 34
#define BLOCK_BYTES_Q4_K 144
#define BLOCK_BYTES_Q6_K 210

typedef uint16_t half_bits;

/* weight j < 16: the low nibble of qs[j], j >= 16: the high nibble of qs[j - 16]; value d (q - 8) */
typedef struct __attribute__((packed)) {
    half_bits d;
    uint8_t qs[QK_LEGACY / 2];
} block_q4_0;

/* the same nibbles; value d q + m */
typedef struct __attribute__((packed)) {
    half_bits d, m;
    uint8_t qs[QK_LEGACY / 2];
} block_q4_1;

/* Q4_0's nibbles, and bit j of qh (32 bits, little-endian) as weight j's fifth bit; value d (q - 16) */
typedef struct __attribute__((packed)) {
    half_bits d;
    uint8_t qh[QK_LEGACY / 8];
    uint8_t qs[QK_LEGACY / 2];
} block_q5_0;

/* value d q */
typedef struct __attribute__((packed)) {
    half_bits d;
    int8_t qs[QK_LEGACY];
} block_q8_0;

/* 8 sub-blocks of 32 weights, each with a 6-bit scale and min packed in `scales` (blocks.c's q4_k_scales); qs byte
 * 32p + l: weight 64p + l in its low nibble, 64p + 32 + l in its high one; value d sc q - dmin m */
typedef struct __attribute__((packed)) {
    half_bits d, dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
} block_q4_K;

/* 16 sub-blocks of 16 weights, an int8 scale each; weight 128h + 32k + l: 4 bits of ql[64h + 32 (k & 1) + l] (low
 * nibble for k < 2), 2 of qh[32h + l] (bits 2k, 2k + 1); value d sc (q - 32) */
typedef struct __attribute__((packed)) {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    half_bits d;
} block_q6_K;

_Static_assert(sizeof(block_q4_0) == BLOCK_BYTES_Q4_0, "Q4_0: a half and 32 nibbles");
_Static_assert(sizeof(block_q4_1) == BLOCK_BYTES_Q4_1, "Q4_1: two halves and 32 nibbles");
_Static_assert(sizeof(block_q5_0) == BLOCK_BYTES_Q5_0, "Q5_0: a half, 32 high bits and 32 nibbles");
_Static_assert(sizeof(block_q8_0) == BLOCK_BYTES_Q8_0, "Q8_0: a half and 32 bytes");
_Static_assert(sizeof(block_q4_K) == BLOCK_BYTES_Q4_K, "Q4_K: two halves, 12 bytes of scales and mins, 256 nibbles");
_Static_assert(sizeof(block_q6_K) == BLOCK_BYTES_Q6_K, "Q6_K: 256 nibbles, 256 pairs of bits, 16 scales and a half");
/* q4_k_scales loads a block's halves and scales as one 16-byte vector, the weights after them */
_Static_assert(offsetof(block_q4_K, qs) == 16, "Q4_K: d, dmin and the scales fill 16 bytes");

/* A block's bytes (0: a format blocks.c does not read) */
static inline int bytes_of(int type) {
    switch (type) {
    case GGUF_Q4_0: return sizeof(block_q4_0);
    case GGUF_Q4_1: return sizeof(block_q4_1);
    case GGUF_Q5_0: return sizeof(block_q5_0);
    case GGUF_Q8_0: return sizeof(block_q8_0);
    case GGUF_Q4_K: return sizeof(block_q4_K);
    case GGUF_Q6_K: return sizeof(block_q6_K);
    default: return 0;
    }
}
#endif
