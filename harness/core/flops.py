"""FLOPs of the attention forward and backward passes, counted from the visible (query,
key) pairs.

Each visible pair costs one dot product of length d for QK^T and one axpy of length d for
PV: 2 * d + 2 * d = 4 * d FLOPs (2 * d_qk + 2 * d_v where V's head dim d_v differs from
Q's and K's d_qk). Masked pairs cost nothing in an algorithm that skips
them, so the count follows the actual mask: exact closed forms for no mask and causal
masks (either alignment, any Nq and Nk), and a count over the mask tensor for key padding
and arbitrary masks. For Nq = Nk causal this gives the familiar "half of 4 * N^2 * d" up to
the diagonal (N(N+1)/2 pairs, not N^2/2). Sliding windows and the serving layouts count
per sequence from each row's key interval (harness.core.serving), so a packed batch
counts only its sequences' own pairs and a paged one only its keys.

The score modifiers (softcap's tanh, the ALiBi bias, a sink's one extra exp per row) are
elementwise work of O(pairs) or O(rows), not counted, like the softmax's exp: a modified
case has the FLOPs of the same case unmodified (the sink is no key: it adds no pair).
FP8 inputs and caches (harness.core.fp8) do the same products: an fp8 case has the FLOPs
of the same case in its dtype (the descales' multiplications are O(rows) or O(keys)).

The backward does five such products per visible pair: S = QK^T again (FlashAttention's
backward recomputes it from Q, K and the LSE instead of storing P), dV += P^T dO,
dP = dO V^T, dQ += dS K and dK += dS^T Q: 10 * d FLOPs, 2.5x the forward's (6 * d_qk +
4 * d_v: two of the five products run over d_v). The
elementwise softmax terms (P, dS, D = rowsum(dO * O)) are O(pairs) and not counted, as
they are not counted in the forward.
"""

from __future__ import annotations

from harness.core.cases import Case, Inputs, MaskKind

CAUSAL_KINDS = (MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL)


def _clamped_prefix(n: int, cap: int) -> int:
    """sum_{x <= n} clamp(x, 0, cap) over integers x (terms with x <= 0 are zero)."""
    if n <= 0:
        return 0
    if n <= cap:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def causal_pairs(seqlen_q: int, seqlen_k: int, offset: int) -> int:
    """Visible pairs of one (batch, head) when row i sees keys j <= i + offset:
    sum over i of clamp(i + offset + 1, 0, Nk), in closed form."""
    return _clamped_prefix(offset + seqlen_q, seqlen_k) - _clamped_prefix(offset, seqlen_k)


def visible_pairs(case: Case, inputs: Inputs | None = None) -> int:
    """Visible (query, key) pairs summed over batch and heads."""
    bh = case.batch * case.heads
    if case.is_serving or (case.has_window and case.mask in (MaskKind.NONE,
                                                            *CAUSAL_KINDS)):
        from harness.core.serving import visible_pairs as serving_pairs

        return serving_pairs(case)  # per sequence, from each row's key interval
    if case.has_window:  # a window over key padding or a random mask: count the mask
        import torch

        from harness.core.cases import make_inputs
        from harness.core.reference import block_visibility

        inputs = inputs if inputs is not None and inputs.mask is not None else \
            make_inputs(case, "cpu")
        align = "bottom_right"
        vis = block_visibility(slice(0, case.seqlen_q), case.seqlen_q, case.seqlen_k, False,
                               align, inputs.mask.cpu(), torch.device("cpu"),
                               (case.window_left, case.window_right))
        vis = vis.expand(case.batch, vis.shape[1], case.seqlen_q, case.seqlen_k)
        return int(vis.sum()) * (case.heads if vis.shape[1] == 1 else 1)
    if case.mask is MaskKind.NONE:
        return bh * case.seqlen_q * case.seqlen_k
    if case.mask.is_causal:
        return bh * causal_pairs(case.seqlen_q, case.seqlen_k, case.causal_offset)
    if inputs is None or inputs.mask is None:
        from harness.core.cases import make_inputs  # the mask comes from the case's seeded draw

        inputs = make_inputs(case, "cpu")
    m = inputs.mask.bool()
    m = m.expand(case.batch, m.shape[1], case.seqlen_q, case.seqlen_k)
    per_mask_head = int(m.sum())
    # A (B, 1, Nq, Nk) mask applies to every head; a per-head mask is counted as is.
    return per_mask_head * (case.heads if m.shape[1] == 1 else 1)


def attention_flops(case: Case, inputs: Inputs | None = None) -> int:
    """Forward FLOPs: 2 * d_qk + 2 * d_v (4 * d) per visible pair."""
    return 2 * (case.head_dim + case.dv) * visible_pairs(case, inputs)


def attention_bwd_flops(case: Case, inputs: Inputs | None = None) -> int:
    """Backward FLOPs: 6 * d_qk + 4 * d_v (10 * d) per visible pair (module doc)."""
    return (6 * case.head_dim + 4 * case.dv) * visible_pairs(case, inputs)
