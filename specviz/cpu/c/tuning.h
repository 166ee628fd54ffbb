/* The numbers specviz's kernels are tuned by, each instruction set's together, and why each is what it is. Each moves
 * speed only: whichever rows go together and whichever path they take, a row's results are the same bits (the kernels'
 * headers say why). What a layout or an instruction fixes is not here but where it is used: the formats Python shares
 * (specviz_cpu.h), a file's blocks (blocks.h), columns.h's packed records, an F4's 4 outputs (blocks.c's BLOCK_TILE),
 * an AMX tile's 16 x 16 (AMX_OUT, AMX_GROUP).
 * After simd.h, which picks the instruction set. */
#ifndef SPECVIZ_TUNING_H
#define SPECVIZ_TUNING_H
#if !defined(SPECVIZ_SIMD_H)
#error "tuning.h needs simd.h first: it picks the instruction set"
#endif

/* ---------------------------------------------------------------- every instruction set: blocks.c's tiles */
/* While a tile reads block b of each of its rows, it asks for the block PREFETCH_AHEAD further along (past the row's
 * end, in the next row: the next tile's): every block is asked for once, well before it is read. The hardware's
 * prefetcher alone left a one-row product far short of the memory's speed on a Zen 4, when a tile's rows were
 * neighbours; a quarter of the outputs apart, with or without these requests the 1.5B's one-row products took 55-58 ms
 * on a 2-core Ice Lake held to AVX2 (62 ms with neighbours, where the distance moved nothing from 8 to 96 blocks). */
#define PREFETCH_AHEAD 24
#define ROWS_AT_ONCE 32             /* rows whose results a tile keeps (more: the blocks are unpacked again) */

#if defined(SIMD_X86)
/* ---------------------------------------------------------------- x86: AVX2, AVX-512, VNNI, AMX */
/* Rows at a time over an unpacked block (blocks.c's KBlock), as measured: AVX-512's accumulators are twice as wide.
 * FEW_ROWS: the most rows multiplied straight from the registers a block is unpacked into; GROUPS_OF_FEW: how many
 * such groups, each unpacking the block again, before a KBlock pays. Measured on a Qwen2-1.5B layer's products (one
 * process, the builds' calls interleaved): on AVX2, 5-8 rows took 10-22% less time with 8 than with 4
 * and a KBlock, 12-16 rows in two groups of 8 within 3% of a KBlock, 24-32 rows 5-8% more; with AVX-512, 8 rows beat 4
 * by 2-5%, but groups lost 20% at 12-16 rows. */
#define FEW_ROWS 8
#if defined(__AVX512VL__)
#define ROW_GROUP 2
#define GROUPS_OF_FEW 1
#else
#define ROW_GROUP 4
#define GROUPS_OF_FEW 2
#endif

/* columns.h (many rows of K-quants, from the packed records) */
#define PACKED_AHEAD 4              /* records ahead of the one read that a thread asks for (prefetch_record) */
/* AVX2 without VNNI, 8 outputs at a time */
#define COLUMN_ROWS 4               /* rows per pass over a block: their accumulators stay in registers */
/* Fewer rows take the tile path (until prepare sets this machine's own count: blocks.c's columns_from); up to
 * COLUMN_REGISTER_ROWS a block is unpacked in registers for each group of rows (COLUMN_ROWS), more unpack it once into
 * a buffer. As measured with the weights coming from memory (FLUSH=1 scripts/blocks_ab.py, Zen 4 held to AVX2): Q4_K's
 * registers took 10-26% less time than the tiles at one row, 3-12% at 2, and 0-9% less than the buffer at 3-8; Q6_K,
 * whose unpacking costs more, 12-13% less at 4 rows only (slower than the tiles at 2-3, than the buffer at 5-8, where a
 * record would be unpacked twice) */
#define COLUMN_MIN_ROWS(type) ((type) == GGUF_Q4_K ? 1 : 4)
#define COLUMN_REGISTER_ROWS(type) ((type) == GGUF_Q4_K ? 2 * COLUMN_ROWS : COLUMN_ROWS)
/* AVX-512 with VNNI (and no AMX), 16 outputs at a time */
#define COLUMN16_ROWS 8             /* rows per pass over a block, as COLUMN_ROWS */
/* fewer rows take the tiles (until prepare sets this machine's own count), as measured with the weights coming from
 * memory (FLUSH=1 scripts/blocks_ab.py, Zen 4):
 * none of Q4_K (one row 1.5x sooner here); Q6_K below 5 (its packed copy is 30% more bytes to read) */
#define COLUMN16_MIN_ROWS(type) ((type) == GGUF_Q4_K ? 1 : 5)

/* blocks.c's AMX tiles */
#define AMX_CHUNK 128               /* rows whose results a 16-output tile keeps (more: its blocks are unpacked again) */
/* fewer rows stay on the VNNI path (measured on the 1.5B model: Q6_K's four planes pay later than Q4_K's two) */
#define AMX_MIN_ROWS(type) ((type) == GGUF_Q4_K ? 5 : 10)

/* rows_kernel.c's 4-bit products. Weights are asked for this many bytes ahead of their use: with the hardware
 * prefetcher alone one token's products through the Qwen2.5-Coder-1.5B's layers took 28-33 ms on 2 cores, with this
 * 24 ms (and 15% less at 4 and 8 rows). */
#define Q4_PREFETCH_BYTES 2048
/* a draft's prompt read (rows_matmul_q4_columns) */
#define READ_ROWS_AT_ONCE 4         /* rows per pass over a block: their sums stay in registers */
#define READ_ROWS_KEPT 256          /* rows whose results a pass over the weights keeps (more: unpacked again) */
#define READ16_ROWS_AT_ONCE 8       /* the same, 16 outputs at a time (AVX-512 with VNNI) */

#elif defined(SIMD_NEON)
/* ---------------------------------------------------------------- ARM64: NEON */
#define ROW_GROUP 2                 /* 32 registers, each V and each accumulator two of them */
#define FEW_ROWS 4
#define GROUPS_OF_FEW 1

#else
/* ---------------------------------------------------------------- portable C */
#define ROW_GROUP 2
/* one row straight from the unpacked block, more through many_rows: with 4 (each count compiled on its own) blocks.c
 * took 58 s to compile here against 15 s with 1, and its products were nowhere faster, up to 58% slower
 * (scripts/blocks_ab.py, portable, 1-8 rows) */
#define FEW_ROWS 1
#define GROUPS_OF_FEW 1
#endif
#endif
