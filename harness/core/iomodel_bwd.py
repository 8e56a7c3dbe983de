"""How many HBM bytes the attention backward moves (the exercise of the chapter the
project grew from: FlashAttention's backward traffic against a naive backward that
materialises the N x N gradient matrices).

Per (batch, head), with e the input element size and float32 for LSE, D and the dQ
accumulator:

- naive_bwd: an eager backward with the forward's P stored (as autograd keeps it):
  dV = P^T dO reads P and dO; dP = dO V^T writes dP; D = rowsum(dO * O) reads dO and O;
  dS = P * (dP - D) reads P and dP and writes dS; dQ = dS K and dK = dS^T Q read dS
  twice. Seven passes over Nq x Nk score elements (stored at `tiles["score_bytes"]`,
  default e), plus the Nq x d and Nk x d vectors.
- fa2_bwd: FlashAttention-2's backward, outer loop over K/V blocks of B_k, inner over the
  Q blocks of B_q that see the K/V block (causal tiles above the diagonal skipped, as in
  the forward model): a preprocessing pass reads dO and O and writes D; each K/V block
  reads K_j and V_j once and writes dK_j and dV_j once; every (K/V block, Q block) visit
  reads Q_i, dO_i, LSE_i, D_i and adds into dQ_i in a float32 accumulator in HBM (read
  and write: the atomics); an epilogue reads the accumulator and writes dQ. S and P are
  recomputed in SRAM from Q, K and the LSE, never stored. With GQA (G > 1) each query
  head writes float32 dK/dV partials that a reduction reads back and sums per K/V head.
- ideal_bwd: Q, K, V, O, dO and the LSE read once, dQ, dK, dV written once (K/V heads
  once each): the floor no exact backward beats.

Key padding and arbitrary masks are not modelled (every tile assumed loaded), as in the
forward's model (harness.core.iomodel).

What the formulas say: FA2's backward moves Theta(Nq Nk / B_k) bytes, like the forward a
constant factor (here about 2 (2 + 4) d / (7 e B_k), the accumulator dominating) away from
the naive backward's seven score passes; at d = 64 with B_k = 128 it moves less than half
the naive backward's bytes, at d = 128 with B_k = 64 more (tests/test_planted_bwd.py). Its
decisive gain is memory: nothing of size Nq x Nk is ever stored. On a GPU the
accumulator's atomics largely hit L2, which this HBM model does not credit.
"""

from __future__ import annotations

from harness.core.cases import Case
from harness.core.iomodel import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    F32,
    elem_bytes,
    q_rows_per_kv_block,
    tile_param,
)

ALGORITHMS_BWD = ("naive_bwd", "fa2_bwd", "ideal_bwd")


def hbm_breakdown_bwd(algorithm: str, case: Case, tiles: dict | None = None
                      ) -> dict[str, int]:
    """Bytes per term ("read Q", "write dS", ...), summed over batch and heads."""
    if algorithm not in ALGORITHMS_BWD:
        raise ValueError(f"unknown backward algorithm {algorithm!r}; known: "
                         f"{', '.join(ALGORITHMS_BWD)}")
    e = elem_bytes(case)
    nq, nk, d = case.seqlen_q, case.seqlen_k, case.head_dim
    bh, bhkv = case.batch * case.heads, case.batch * case.kv_heads
    qv, kvv = nq * d * e, nk * d * e  # one Nq x d / Nk x d tensor
    if algorithm == "ideal_bwd":
        return {"read Q": bh * qv, "read O": bh * qv, "read dO": bh * qv,
                "read LSE": bh * nq * F32, "read K": bhkv * kvv, "read V": bhkv * kvv,
                "write dQ": bh * qv, "write dK": bhkv * kvv, "write dV": bhkv * kvv}
    if algorithm == "naive_bwd":
        sb = tile_param(tiles, "score_bytes", e)
        score = nq * nk * sb
        terms = {"read P": 2 * score, "write dP": score, "read dP": score,
                 "write dS": score, "read dS": 2 * score,
                 "read dO": 3 * qv, "read O": qv, "read V": kvv, "read K": kvv, "read Q": qv,
                 "write D": nq * F32, "read D": nq * F32,
                 "write dQ": qv, "write dK": kvv, "write dV": kvv}
        return {k: bh * v for k, v in terms.items()}
    bq = tile_param(tiles, "block_q", DEFAULT_BLOCK_Q)
    bk = tile_param(tiles, "block_k", DEFAULT_BLOCK_K)
    visits = q_rows_per_kv_block(case, bq, bk)  # Q rows read over all K/V blocks
    terms = {
        "read dO (D)": qv, "read O": qv, "write D": nq * F32,
        "read K": kvv, "read V": kvv,
        "read Q": visits * d * e, "read dO": visits * d * e,
        "read LSE": visits * F32, "read D": visits * F32,
        "read dQ acc": visits * d * F32, "write dQ acc": visits * d * F32,
        "read dQ acc (epilogue)": nq * d * F32, "write dQ": qv,
    }
    group = case.heads // case.kv_heads
    if group > 1:
        terms["write dK, dV partials"] = 2 * nk * d * F32
        terms["read dK, dV partials"] = 2 * nk * d * F32
        out = {k: bh * v for k, v in terms.items()}
        out["write dK"] = bhkv * kvv
        out["write dV"] = bhkv * kvv
        return out
    terms["write dK"] = kvv
    terms["write dV"] = kvv
    return {k: bh * v for k, v in terms.items()}


def hbm_bytes_bwd(algorithm: str, case: Case, tiles: dict | None = None) -> int:
    """Total HBM bytes the backward `algorithm` moves for `case`."""
    return sum(hbm_breakdown_bwd(algorithm, case, tiles).values())


def ideal_bytes_bwd(case: Case) -> int:
    return hbm_bytes_bwd("ideal_bwd", case)
