/* specviz's CPU kernels: their layout constants and entry points, in one place (Python reads the constants from
 * here and from blocks.h: specviz/cpu/build.py's CONSTANTS). */
#ifndef SPECVIZ_CPU_H
#define SPECVIZ_CPU_H
#include <stddef.h>
#include <stdint.h>

/* GGUF block formats (ggml's type ids) and their weights per block (their fields and bytes: blocks.h) */
#define GGUF_Q4_0 2
#define GGUF_Q4_1 3
#define GGUF_Q5_0 6
#define GGUF_Q8_0 8
#define GGUF_Q4_K 12
#define GGUF_Q6_K 14
#define QK_K 256                    /* weights in a K-quant block */
#define QK_LEGACY 32                /* weights in a Q4_0 / Q4_1 / Q5_0 / Q8_0 block */

/* A row whose int8 rounding loses more than 1 / ROUNDING_LOSS_LIMIT of its energy (apart from each block's largest
 * value, which rounds exactly) is rounded twice (rounding.h). 300: the first position's rows (3 to 4.4 nats of KL at
 * the next token when rounded once) all pass it, and in decoding it doubles about 0.3% of the products' work. */
#define ROUNDING_LOSS_LIMIT 300

/* block_product's answers */
#define BLOCKS_BAD_TYPE -1
#define BLOCKS_BAD_SHAPE -2
#define BLOCKS_NOT_FINITE -3
#define BLOCKS_NO_MEMORY -4          /* a crushed row's second rounding found no memory (y holds the first product) */

/* y[r * ldy + o] = x[r, :K] . W[o, :K] for o < N, r < n: W the file's blocks as it stores them, N rows of
 * K / block_weights(type) blocks each; packed: block_pack's copy of them, or NULL (many rows then take the slower
 * tiles). scratch: block_scratch_bytes(K, n). Returns 0, or one of BLOCKS_* (y untouched but for BLOCKS_NO_MEMORY). */
int block_product(int type, const uint8_t *w, const uint8_t *packed, int K, int N, const float *x, int n, float *y,
                  int ldy, int threads, void *scratch);
/* The bytes of a packed copy of W (columns.h: what products of many rows read on AVX2 and AVX-512 without AMX), or 0
 * where this build's products read none (then block_pack answers BLOCKS_BAD_TYPE). */
size_t block_packed_bytes(int type, int K, int N);
int block_pack(int type, const uint8_t *w, int K, int N, uint8_t *out, int threads);
size_t block_scratch_bytes(int K, int n);
int block_weights(int type);
int block_bytes(int type);
int block_columns_from(int type);        /* the fewest rows of a K-quant that take the columns' path (0: no such path) */
int block_set_columns_from(int type, int rows);
const char *block_simd(void);       /* the instruction set the products were built for */
int block_amx(void);                /* 1 where the products may use AMX tiles (built with them, and the CPU and OS allow them:
                                     * asks Linux once for the permission), else 0 */

/* row_attention.c: each query row over exactly the cache entries it sees; RMS norm of each row alone */
void attend_rows(const float *q, const float *k, const float *v, const uint8_t *visible, float *out,
                 int n, int heads, int kv_heads, int D, int capacity, int committed, int cols, float scale,
                 int threads, void *scratch);
void rms_norm_rows(const float *x, const float *w, float *y, int n, int K, float eps);

/* rows_kernel.c (x86 with AVX2 only: builds with SPECVIZ_ROWS_KERNEL defined): float32, int8 and specviz's 4-bit
 * weights. 4-bit weights come in tiles of Q4_TILE output rows, blocks of Q4_GROUP inputs, one scale and offset per
 * block (group 32) or per two (Q4_WIDE_GROUP, a draft's), their scales read Q4_CHUNK blocks at a time (specviz/cpu/int4.py's
 * tiled()). */
#define Q4_TILE 4
#define Q4_GROUP 32
#define Q4_WIDE_GROUP 64
#define Q4_CHUNK 8
#define Q4_COLUMNS -4                /* layer_loop.c: a product of 4-bit tiles summed by rows_matmul_q4_columns */
void rows_matmul_f32(const float *x, const void *w, const float *scale, float *y, int n, int K, int N, int threads);
void rows_matmul_q8(const float *x, const void *w, const float *scale, float *y, int n, int K, int N, int threads);
void rows_matmul_q4(const float *x, const uint8_t *w, const uint16_t *d, const uint16_t *z, int group, float *y,
                    int n, int K, int N, int threads, void *scratch);
/* the same weights summed in another order, for many rows of a draft's prompt read (N a multiple of 8) */
void rows_matmul_q4_columns(const float *x, const uint8_t *w, const uint16_t *d, const uint16_t *z, int group, float *y,
                            int n, int K, int N, int threads, void *scratch);

/* layer_loop.c's decode_layers: its answer where its scratch could not be allocated */
#define LAYERS_NO_MEMORY -100
#endif
