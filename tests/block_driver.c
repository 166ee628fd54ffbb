/* Reads type, K, N, n, then the blocks and the rows from a file; writes the products to another (a test driver). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "specviz_cpu.h"
int main(int argc, char **argv) {
    FILE *in = fopen(argv[1], "rb");
    int32_t h[4];
    if (!in || fread(h, 4, 4, in) != 4) return 1;
    const int type = h[0], K = h[1], N = h[2], n = h[3];
    const size_t rb = (size_t)(K / block_weights(type)) * block_bytes(type);
    uint8_t *w = malloc(rb * N);
    float *x = malloc(sizeof(float) * (size_t)K * n), *y = malloc(sizeof(float) * (size_t)N * n);
    if (fread(w, 1, rb * N, in) != rb * N || fread(x, 4, (size_t)K * n, in) != (size_t)K * n) return 1;
    void *scratch = malloc(block_scratch_bytes(K, n));
    const int rc = block_product(type, w, K, N, x, n, y, N, 1, scratch);
    FILE *out = fopen(argv[2], "wb");
    fwrite(y, 4, (size_t)N * n, out);
    fclose(out);
    fprintf(stderr, "%s\n", block_simd());
    return rc;
}
