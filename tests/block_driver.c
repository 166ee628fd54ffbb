/* A test driver for specviz's kernels on another instruction set (tests/test_blocks.py runs it under qemu).
 *   block_driver IN OUT: reads type, K, N, n (int32), the blocks and the rows (float32) from IN; writes the
 *                        products to OUT; prints the instruction set on stderr.
 *   block_driver attend: prints, as hex, the attention of fixed rows over a fixed cache (row_attention.c). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "specviz_cpu.h"

static int attend(void) {
    enum { n = 3, heads = 4, kv_heads = 2, D = 16, capacity = 16, committed = 5, cols = 3 };
    static float q[n * heads * D], k[kv_heads * capacity * D], v[kv_heads * capacity * D], out[n * heads * D];
    static uint8_t visible[n * cols];
    uint32_t state = 12345;
    float *all[3] = {q, k, v};
    const int sizes[3] = {n * heads * D, kv_heads * capacity * D, kv_heads * capacity * D};
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < sizes[a]; i++) {
            state = state * 1664525u + 1013904223u;
            all[a][i] = (float)(int32_t)(state >> 8) / (float)(1 << 23) - 1.0f;
        }
    for (int r = 0; r < n; r++)
        for (int c = 0; c < cols; c++) visible[r * cols + c] = c <= r;
    void *scratch = malloc((size_t)(committed + cols) * (sizeof(int) + 2 * sizeof(float)));
    attend_rows(q, k, v, visible, out, n, heads, kv_heads, D, capacity, committed, cols, 0.25f, 1, scratch);
    for (int i = 0; i < n * heads * D; i++) {
        uint32_t bits;
        memcpy(&bits, &out[i], 4);
        printf("%08x\n", bits);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "attend")) return attend();
    FILE *in = fopen(argv[1], "rb");
    int32_t h[4];
    if (!in || fread(h, 4, 4, in) != 4) return 1;
    const int type = h[0], K = h[1], N = h[2], n = h[3];
    const size_t rb = (size_t)(K / block_weights(type)) * block_bytes(type);
    uint8_t *w = malloc(rb * N);
    float *x = malloc(sizeof(float) * (size_t)K * n), *y = malloc(sizeof(float) * (size_t)N * n);
    if (fread(w, 1, rb * N, in) != rb * N || fread(x, 4, (size_t)K * n, in) != (size_t)K * n) return 1;
    void *scratch = malloc(block_scratch_bytes(K, n));
    const int rc = block_product(type, w, NULL, K, N, x, n, y, N, 1, scratch);
    FILE *out = fopen(argv[2], "wb");
    fwrite(y, 4, (size_t)N * n, out);
    fclose(out);
    fprintf(stderr, "%s\n", block_simd());
    return rc;
}
