/* All the decoder layers of a quantized Llama-family model in one call (specviz/cpu/decoder.py's forward, without
 * Python between its steps). Built into one library with rows_kernel.c and row_attention.c.
 *
 * A one-token forward of the Qwen2.5-Coder-0.5B made about 600 Python and torch calls around its 97 products:
 * 3 of its 12 ms. Here each layer runs the same steps as decoder.py's loop: RMS norm, the stacked q/k/v
 * product, rotary embedding, the keys and values written into the cache, attention, the output product, the
 * residual, RMS norm, the stacked gate/up product, SiLU(gate) * up, the down product, the residual. Every
 * step computes a row alone, so a tree's forward still gives each token the bits plain decoding gives it. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "simd.h"
#include "specviz_cpu.h"

/* One product: a GGUF file's blocks of ggml type `type` (blocks.c; packed: their copy for many rows, or NULL), or
 * (type 0) specviz's 4-bit tiles (int4.py's tiled(): w, d, z, their group), or (Q4_COLUMNS) the same tiles summed many
 * outputs at a time (a draft's prompt read); its N outputs and bias or NULL. N = 0: no product (its sibling's stacked
 * product made its outputs). */
typedef struct { int type, N; const uint8_t *w; const uint16_t *d, *z; int group; const float *bias; const uint8_t *packed; } Product;
/* One layer, as decoder.py's Layer: pointers into the model's own tensors. q, k, v write side by side, as gate, up do. */
typedef struct { const float *input_norm; Product q, k, v, output; const float *post_norm; Product gate, up, down; } Layer;

/* y [n, ldy], from column `at`: x [n, K] @ W.T (+ bias). Returns the columns written, or < 0 (blocks.c's error). */
static int product(const Product *p, const float *x, float *y, int ldy, int at, int n, int K, int threads, void *scratch) {
    if (!p->N) return 0;
    if (p->type > 0) {
        const int failed = block_product(p->type, p->w, p->packed, K, p->N, x, n, y + at, ldy, threads, scratch);
        if (failed) return failed;
    } else {
#ifdef SPECVIZ_ROWS_KERNEL
        if (p->type == Q4_COLUMNS) rows_matmul_q4_columns(x, p->w, p->d, p->z, p->group, y + at, n, K, p->N, threads, scratch);
        else rows_matmul_q4(x, p->w, p->d, p->z, p->group, y + at, n, K, p->N, threads, scratch);     /* stacked: ldy == N */
#else
        return BLOCKS_BAD_TYPE;                 /* no 4-bit tiles in this build (layer_loop.py never sends them) */
#endif
    }
    if (p->bias)
        for (int r = 0; r < n; r++)
            for (int o = 0; o < p->N; o++) y[(size_t)r * ldy + at + o] += p->bias[o];
    return p->N;
}

/* the siblings' products of one input, side by side in y [n, ldy] */
static int products(const Product *const parts[3], const float *x, float *y, int ldy, int n, int K, int threads, void *scratch) {
    int at = 0;
    for (int i = 0; i < 3 && parts[i]; i++) {
        const int written = product(parts[i], x, y, ldy, at, n, K, threads, scratch);
        if (written < 0) return written;
        at += written;
    }
    return at;
}

/* x * cos + rotate_half(x) * sin over one head's D values (cos, sin already scaled), as transformers computes it:
 * a product, a product, a sum (not fused: the file is built with -ffp-contract=off). */
static void rotate(const float *x, const float *cos, const float *sin, float *out, int D) {
    const int half = D / 2;
    for (int i = 0; i < D; i++) {
        const float other = i < half ? -x[i + half] : x[i - half];
        out[i] = x[i] * cos[i] + other * sin[i];
    }
}

/* act[r] = SiLU(gate[r]) * up[r] = gate / (1 + e^-gate) * up, element by element (simd.h's f8_exp), each row's
 * gate and up side by side in gate_up [n, 2 I]; the elements split between the threads in runs of 8 */
ALWAYS F8 silu_times(F8 x, F8 u) { return f8_mul(f8_div(x, f8_add(f8_dup(1.0f), f8_exp(f8_sub(f8_zero(), x)))), u); }

static void gated(const float *gate_up, float *act, int n, int I, int threads) {
    const int runs = (I + 7) / 8;
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (n * I >= 4096)")
    for (int task = 0; task < n * runs; task++) {
        const int r = task / runs, i = task % runs * 8, count = I - i < 8 ? I - i : 8;
        const float *g = gate_up + (size_t)r * 2 * I + i, *u = g + I;
        if (count == 8) {
            f8_store(act + (size_t)r * I + i, silu_times(f8_load(g), f8_load(u)));
            continue;
        }
        float gate[8] = {0}, up[8] = {0}, out[8];           /* a row's last few, I not a multiple of 8 */
        memcpy(gate, g, count * sizeof(float));
        memcpy(up, u, count * sizeof(float));
        f8_store(out, silu_times(f8_load(gate), f8_load(up)));
        memcpy(act + (size_t)r * I + i, out, count * sizeof(float));
    }
}

/* x [n, hidden]: the embeddings in, the last layer's output out. cos, sin [n, D]. keys, values: the cache,
 * [layers, kv_heads, capacity, D]; the n new entries go at `start`. visible [n, cols] bytes as attend_rows.
 * Returns 0; LAYERS_NO_MEMORY (x untouched) where the scratch could not be allocated; blocks.c's error where a product failed (x
 * then holds garbage). specviz/cpu/layer_loop.py checks the rest. */
int decode_layers(const Layer *layers, int count, float *x, int n, int hidden, int heads, int kv_heads, int D,
                   int intermediate, const float *cos, const float *sin, float *keys, float *values, int capacity,
                   int start, const uint8_t *visible, int committed, int cols, float scale, float eps, int threads) {
    const int Q = heads * D, KV = kv_heads * D, N_qkv = Q + 2 * KV;
    int widest = hidden > intermediate ? hidden : intermediate;     /* the widest input a product reads */
    if (Q > widest) widest = Q;
    const int Bp = (widest / 32 + 7) / 8 * 8, E = committed + cols, G = heads / kv_heads;
    const size_t q4_scratch = (size_t)n * (widest + 8 * Bp), block_scratch = block_scratch_bytes(widest, n);
    const size_t floats = (size_t)n * (hidden + N_qkv + Q + Q + hidden + 2 * intermediate + intermediate);
    float *h = malloc(floats * sizeof(float));
    float *qkv = h + (size_t)n * hidden, *query = qkv + (size_t)n * N_qkv, *attended = query + (size_t)n * Q;
    float *delta = attended + (size_t)n * Q, *gate_up = delta + (size_t)n * hidden, *act = gate_up + (size_t)n * 2 * intermediate;
    void *product_scratch = malloc(q4_scratch > block_scratch ? q4_scratch : block_scratch);
    void *attention_scratch = malloc((size_t)threads * ((size_t)E * sizeof(int) + (size_t)G * E * sizeof(float)));
    if (!h || !product_scratch || !attention_scratch) {
        free(h);
        free(product_scratch);
        free(attention_scratch);
        return LAYERS_NO_MEMORY;
    }
    int failed = 0;
    const size_t layer_size = (size_t)kv_heads * capacity * D;
    for (int l = 0; l < count; l++) {
        const Layer *layer = layers + l;
        float *layer_keys = keys + l * layer_size, *layer_values = values + l * layer_size;
        rms_norm_rows(x, layer->input_norm, h, n, hidden, eps);
        const Product *qkv_parts[3] = {&layer->q, &layer->k, &layer->v}, *gate_up_parts[3] = {&layer->gate, &layer->up, NULL};
        const Product *output_part[3] = {&layer->output, NULL, NULL}, *down_part[3] = {&layer->down, NULL, NULL};
        if ((failed = products(qkv_parts, h, qkv, N_qkv, n, hidden, threads, product_scratch)) < 0) break;
        for (int r = 0; r < n; r++) {
            const float *row = qkv + (size_t)r * N_qkv, *c = cos + (size_t)r * D, *s = sin + (size_t)r * D;
            for (int head = 0; head < heads; head++) rotate(row + head * D, c, s, query + ((size_t)r * heads + head) * D, D);
            for (int head = 0; head < kv_heads; head++) {
                const size_t entry = ((size_t)head * capacity + start + r) * D;
                rotate(row + Q + head * D, c, s, layer_keys + entry, D);
                memcpy(layer_values + entry, row + Q + KV + head * D, D * sizeof(float));
            }
        }
        attend_rows(query, layer_keys, layer_values, visible, attended, n, heads, kv_heads, D, capacity, committed,
                    cols, scale, threads, attention_scratch);
        if ((failed = products(output_part, attended, delta, hidden, n, Q, threads, product_scratch)) < 0) break;
        for (size_t i = 0; i < (size_t)n * hidden; i++) x[i] += delta[i];
        rms_norm_rows(x, layer->post_norm, h, n, hidden, eps);
        if ((failed = products(gate_up_parts, h, gate_up, 2 * intermediate, n, hidden, threads, product_scratch)) < 0) break;
        gated(gate_up, act, n, intermediate, threads);
        if ((failed = products(down_part, act, delta, hidden, n, intermediate, threads, product_scratch)) < 0) break;
        for (size_t i = 0; i < (size_t)n * hidden; i++) x[i] += delta[i];
    }
    free(h);
    free(product_scratch);
    free(attention_scratch);
    return failed < 0 ? failed : 0;
}
