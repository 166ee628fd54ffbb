/* Which rows int8 rounding crushes. blocks.c and rows_kernel.c round each row of x to int8 one block of `per` values
 * at a time, on one scale a block (the largest magnitude maps to 127). The first position of a text (the attention
 * sink) carries a few values thousands of times the rest: in their blocks every other value rounds to 0 or +-1, and
 * the next token after a one-token prompt is noise. Such a row is rounded twice (its remainder x - d q rounded and
 * multiplied again): the rule below decides which, from the row alone, so a row gets the same bits alone or in a batch.
 *
 * The rule: the rounding lost more than 1 / ROUNDING_LOSS_LIMIT of the energy of the row's values other than each
 * block's largest (which rounds exactly). rounding_crushed computes it in double, in a fixed order (8 lanes, j % 8,
 * along the row; lanes added 0..7; the blocks' largest squares added in order): specviz/cpu/reference.py decides alike,
 * bit for bit. Most rows never reach it: rounding_fine proves from the int8 values alone that a row is far from the
 * limit, at a small fraction of the cost. */
#ifndef SPECVIZ_ROUNDING_H
#define SPECVIZ_ROUNDING_H
#include <stdint.h>
#include "specviz_cpu.h"

/* 1 where the row is surely not crushed; 0 where rounding_crushed must decide. q: the row's int8 values (any order
 * within a block), scale: one per block of `per` (the last block may be shorter). From integer sums alone: a value
 * rounded to q is off by at most d / 2 (0.57 d where the scale is kept as a half), and |x| >= (|q| - 1/2) d, so
 *   lost <= sum_b count_b d_b^2 / 3   and   kept >= 0.999 sum_b d_b^2 (sum q^2 - sum |q| - (127^2 - 127)),
 * the largest value of each block being the one rounded to +-127. One pass over K bytes, which the compiler
 * vectorises (integer sums keep their value in any order). */
static inline int rounding_fine(const int8_t *q, const float *scale, int K, int per) {
    float lost = 0.0f, kept = 0.0f;
    for (int b = 0; b * per < K; b++) {
        const int end = (b + 1) * per < K ? (b + 1) * per : K;
        int32_t squares = 0, sizes = 0;
        for (int j = b * per; j < end; j++) {
            squares += q[j] * q[j];
            sizes += q[j] < 0 ? -q[j] : q[j];
        }
        const float d2 = scale[b] * scale[b];
        lost += (float)(end - b * per) * d2 / 3.0f;
        kept += d2 * (float)(squares - sizes - (127 * 127 - 127));
    }
    return lost * ROUNDING_LOSS_LIMIT <= 0.999f * kept;
}

/* The rule itself. q: the row's int8 values in order; scale: one per block of `per` (the last may be shorter). */
static inline int rounding_crushed(const float *x, const int8_t *q, const float *scale, int K, int per) {
    double lost[8] = {0}, energy[8] = {0}, largest = 0.0;
    for (int b = 0; b * per < K; b++) {
        const int end = (b + 1) * per < K ? (b + 1) * per : K;
        double top = 0.0;
        for (int j = b * per; j < end; j += 8)
            for (int l = 0; l < 8; l++) {
                const double v = x[j + l], e = v - (double)scale[b] * q[j + l];
                lost[l] += e * e;
                energy[l] += v * v;
                top = v * v > top ? v * v : top;
            }
        largest += top;
    }
    double lost_sum = 0.0, energy_sum = 0.0;
    for (int l = 0; l < 8; l++) {
        lost_sum += lost[l];
        energy_sum += energy[l];
    }
    return lost_sum * ROUNDING_LOSS_LIMIT > energy_sum - largest;
}
#endif
