"""The block products of specviz/cpu/c/blocks.c, written again in numpy: the definition its kernels are tested
against, bit for bit, on every instruction set.

Each row of x is rounded to int8 as llama.cpp rounds activations for the weight type (Q8_K for the K-quants, Q8_0
or Q8_1 for the 32-weight formats); a block's dot product is then an exact integer, and the float work per block,
per output and row, is the formula in blocks.c's header, in float32, over the blocks in order. The weights' integer
codes are unpacked from the file's bytes here independently of the C code, by a map of the blocks of its own (FIELDS),
and checked against the `gguf` package's own de-quantisation in the tests.
"""
from __future__ import annotations

import numpy as np

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 2, 3, 6, 8, 12, 14
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
WEIGHTS = {Q4_0: 32, Q4_1: 32, Q5_0: 32, Q8_0: 32, Q4_K: 256, Q6_K: 256}
# Each format's block as ggml lays it out (ggml-common.h): its fields in order, and their bytes. Written here apart
# from the C code's map (c/blocks.h), so that a field misplaced in either shows: tests/test_block_map.py compares them.
FIELDS = {Q4_0: {"d": 2, "qs": 16},
          Q4_1: {"d": 2, "m": 2, "qs": 16},
          Q5_0: {"d": 2, "qh": 4, "qs": 16},
          Q8_0: {"d": 2, "qs": 32},
          Q4_K: {"d": 2, "dmin": 2, "scales": 12, "qs": 128},
          Q6_K: {"ql": 128, "qh": 64, "scales": 16, "d": 2}}
F32 = np.float32
ROUNDING_LOSS_LIMIT = 300           # specviz_cpu.h's: tests/test_blocks.py checks that the two agree


def _places(fields: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Each field's first byte and end, from the fields' bytes in order."""
    places, at = {}, 0
    for name, size in fields.items():
        places[name], at = (at, at + size), at + size
    return places


PLACES = {qtype: _places(fields) for qtype, fields in FIELDS.items()}
BLOCK = {qtype: (WEIGHTS[qtype], sum(fields.values())) for qtype, fields in FIELDS.items()}     # weights, bytes


def _half(raw: np.ndarray) -> np.ndarray:
    """Two bytes per value (little-endian IEEE half) -> float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(F32)


def unpack(qtype: int, w: np.ndarray) -> dict:
    """The file's bytes [N, blocks * bytes] -> integer codes and scales per block: q [N, B, weights] and, by type,
    d, dmin / m (float32 [N, B]), sc (int [N, B, sub-blocks]) and mins (int [N, B, 8])."""
    per, size = BLOCK[qtype]
    blocks = w.reshape(w.shape[0], -1, size)

    def field(name: str) -> np.ndarray:
        start, end = PLACES[qtype][name]
        return blocks[..., start:end]

    if qtype == Q4_K:
        s = field("scales").astype(np.int64)
        sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
        mins = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
        qs = field("qs").reshape(*blocks.shape[:2], 4, 32).astype(np.int64)
        q = np.stack([qs & 15, qs >> 4], 3).reshape(*blocks.shape[:2], 256)   # chunk c: 64c + l low, 64c + 32 + l high
        return {"q": q, "d": _half(field("d")), "dmin": _half(field("dmin")), "sc": sc, "mins": mins}
    if qtype == Q6_K:
        ql = field("ql").reshape(*blocks.shape[:2], 2, 2, 32).astype(np.int64)          # [half, k & 1, l]
        qh = field("qh").reshape(*blocks.shape[:2], 2, 32).astype(np.int64)
        parts = [((ql[..., k & 1, :] >> (4 * (k >> 1))) & 15) | (((qh >> (2 * k)) & 3) << 4) for k in range(4)]
        q = np.stack(parts, -2).reshape(*blocks.shape[:2], 256)                  # weight 128 h + 32 k + l
        sc = field("scales").view(np.int8).astype(np.int64)
        return {"q": q, "d": _half(field("d")), "sc": sc}
    d = _half(field("d"))
    if qtype == Q8_0:
        return {"q": field("qs").view(np.int8).astype(np.int64), "d": d}
    qs = field("qs").astype(np.int64)
    q = np.concatenate([qs & 15, qs >> 4], -1)
    if qtype == Q5_0:
        bits = np.ascontiguousarray(field("qh")).view(np.uint32)[..., 0].astype(np.int64)
        q = q | (((bits[..., None] >> np.arange(32)) & 1) << 4)
    out = {"q": q, "d": d}
    if qtype == Q4_1:
        out["m"] = _half(field("m"))
    return out


def dequantize(qtype: int, w: np.ndarray) -> np.ndarray:
    """The weights [N, K] in float64, from the unpacked codes (for tolerance checks against a float product)."""
    u = unpack(qtype, w)
    q = u["q"].astype(np.float64)
    if qtype == Q4_K:
        scale = np.repeat(u["d"][..., None].astype(np.float64) * u["sc"], 32, -1)
        low = np.repeat(u["dmin"][..., None].astype(np.float64) * u["mins"], 32, -1)
        return (scale * q - low).reshape(len(w), -1)
    if qtype == Q6_K:
        return (np.repeat(u["d"][..., None].astype(np.float64) * u["sc"], 16, -1) * (q - 32)).reshape(len(w), -1)
    offset = {Q4_0: 8, Q5_0: 16}.get(qtype, 0)
    out = u["d"][..., None].astype(np.float64) * (q - offset)
    if qtype == Q4_1:
        out = out + u["m"][..., None]
    return out.reshape(len(w), -1)


def _round_half_even(v: np.ndarray) -> np.ndarray:
    return np.rint(v).astype(np.int64)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    t = np.trunc(v)
    rest = v - t
    return (t + (rest >= 0.5) - (rest <= -0.5)).astype(np.int64)


def quantize_rows(qtype: int, x: np.ndarray) -> dict:
    """x [n, K] float32 rounded as blocks.c rounds it for `qtype`'s dot products."""
    n, K = x.shape
    x = x.astype(F32)
    if qtype in (Q4_K, Q6_K):                       # Q8_K
        xb = x.reshape(n, K // 256, 256)
        first = np.abs(xb).argmax(-1)[..., None]    # the first value of largest magnitude
        peak = np.take_along_axis(xb, first, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = (F32(-127.0) / peak).astype(F32)
            q = np.minimum(_round_half_even((iscale * xb).astype(F32)), 127)
            d = (F32(1.0) / iscale)[..., 0].astype(F32)
        zero = (peak == 0)[..., 0]
        q[zero] = 0
        d[zero] = 0
        return {"q": q.reshape(n, K), "d": d, "bsum": q.reshape(n, K // 16, 16).sum(-1)}
    xb = x.reshape(n, K // 32, 32)
    scale = (np.abs(xb).max(-1) / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale != 0, F32(1.0) / scale, F32(0.0)).astype(F32)
    q = _round_half_away((xb * inverse[..., None]).astype(F32))
    total = q.sum(-1)
    return {"q": q.reshape(n, K), "d": scale.astype(np.float16).astype(F32), "sum": total,
            "sx": (total.astype(F32) * scale).astype(F32).astype(np.float16).astype(F32)}


def coarse_rows(qtype: int, x: np.ndarray, a: dict) -> np.ndarray:
    """Which rows [n] of x (float32 [n, K]) their rounding `a` (quantize_rows) crushed: it lost more than
    1 / ROUNDING_LOSS_LIMIT of the energy of the values other than each block's largest. blocks.c's coarse_row, in
    its order: 8 lanes (j % 8) summed along the row, lanes added 0..7, the blocks' largest squares added in order."""
    n, K = x.shape
    per = BLOCK[qtype][0]
    v = x.astype(np.float64)
    e = v - np.repeat(a["d"].astype(np.float64), per, -1) * a["q"].astype(np.float64)
    lost_lanes = np.cumsum((e * e).reshape(n, K // 8, 8), 1)[:, -1]            # cumsum: one value after another
    energy_lanes = np.cumsum((v * v).reshape(n, K // 8, 8), 1)[:, -1]
    largest = np.cumsum((v * v).reshape(n, K // per, per).max(-1), 1)[:, -1]
    lost, energy = np.zeros(n), np.zeros(n)
    for lane in range(8):
        lost, energy = lost + lost_lanes[:, lane], energy + energy_lanes[:, lane]
    return lost * ROUNDING_LOSS_LIMIT > energy - largest


def product(qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x [n, K] float32 times the file's blocks w [N, bytes] -> [n, N] float32, as blocks.c computes it: each row
    rounded to int8; a row that rounding crushed (coarse_rows) rounded twice, its remainder's product added."""
    x = x.astype(F32)
    a = quantize_rows(qtype, x)
    y = _rounded_product(qtype, w, x, a)
    coarse = coarse_rows(qtype, x, a)
    if coarse.any():
        per = BLOCK[qtype][0]
        first = (np.repeat(a["d"][coarse], per, -1) * a["q"][coarse].astype(F32)).astype(F32)
        rest = (x[coarse] - first).astype(F32)
        y[coarse] = (y[coarse] + _rounded_product(qtype, w, rest, quantize_rows(qtype, rest))).astype(F32)
    return y


def _rounded_product(qtype: int, w: np.ndarray, x: np.ndarray, a: dict) -> np.ndarray:
    """x [n, K] rounded as `a` (quantize_rows) times the blocks w [N, bytes]: the integer sums and float formula."""
    u = unpack(qtype, w)
    per = BLOCK[qtype][0]
    n, K = x.shape
    blocks = K // per
    xq = a["q"].reshape(n, blocks, per)
    y = np.zeros((n, len(w)), F32)
    for b in range(blocks):
        dx = a["d"][:, b][:, None]
        dd = (u["d"][:, b][None, :] * dx).astype(F32)
        if qtype == Q4_K:
            dots = np.einsum("rjk,ojk->roj", xq[:, b].reshape(n, 8, 32), u["q"][:, b].reshape(-1, 8, 32))
            sumi = (dots * u["sc"][:, b][None]).sum(-1)
            pair_sums = a["bsum"][:, 16 * b:16 * b + 16].reshape(n, 8, 2).sum(-1)
            summ = pair_sums @ u["mins"][:, b].T
            dm = (u["dmin"][:, b][None, :] * dx).astype(F32)
            t = (dd * sumi.astype(F32)).astype(F32) - (dm * summ.astype(F32)).astype(F32)
        elif qtype == Q6_K:
            dots = np.einsum("rgk,ogk->rog", xq[:, b].reshape(n, 16, 16), u["q"][:, b].reshape(-1, 16, 16) - 32)
            t = dd * (dots * u["sc"][:, b][None]).sum(-1).astype(F32)
        else:
            offset = {Q4_0: 8, Q5_0: 16}.get(qtype, 0)
            sumi = xq[:, b] @ (u["q"][:, b] - offset).T
            t = (dd * sumi.astype(F32)).astype(F32)
            if qtype == Q4_1:
                t = t + (u["m"][:, b][None, :] * a["sx"][:, b][:, None]).astype(F32)
        y = (y + t.astype(F32)).astype(F32)
    return y


def random_blocks(qtype: int, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in a file's layout, with finite, small half scales (as a real file holds)."""
    per, size = BLOCK[qtype]
    w = rng.integers(0, 256, (rows, K // per, size), dtype=np.uint8)
    halves = [PLACES[qtype][name][0] for name in ("d", "dmin", "m") if name in PLACES[qtype]]
    for at in halves:
        value = (rng.random((rows, K // per)) * 0.02 + 0.001).astype(np.float16)
        w[..., at:at + 2] = value[..., None].view(np.uint8)
    return w.reshape(rows, -1)
