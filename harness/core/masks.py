"""The mask tensors of a case's mask kinds (key padding, random) and its visibility.

`harness.core.cases` draws them with the inputs and re-exports these functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from harness.core.cases import Case, Inputs


def key_lengths_for(case: Case, gen: torch.Generator) -> list[int]:
    """Valid key count per batch entry for KEY_PADDING: the last entry has zero keys (so a
    fully masked batch exists whenever batch > 1), the first keeps all, the rest random."""
    import torch

    lengths = []
    for b in range(case.batch):
        if b == 0:
            lengths.append(case.seqlen_k)
        elif b == case.batch - 1:
            lengths.append(0)
        else:
            lengths.append(int(torch.randint(1, case.seqlen_k + 1, (1,), generator=gen)))
    if case.batch == 1 and case.seqlen_k > 1:
        lengths = [max(1, case.seqlen_k // 2)]
    return lengths


def random_mask(case: Case, gen: torch.Generator) -> torch.Tensor:
    """(B, 1, Nq, Nk) boolean mask, about 70% visible, with every 7th query row fully masked
    (row 3, 10, ...) so that every grid exercises the fully-masked-row convention."""
    import torch

    m = torch.rand((case.batch, 1, case.seqlen_q, case.seqlen_k), generator=gen) < 0.7
    m[:, :, 3::7, :] = False
    return m


def visible(case: Case, inputs: Inputs, rows: slice | None = None) -> torch.Tensor | None:
    """Boolean (B|1, 1, rows, Nk) visibility of the case, or None when every pair is
    visible. `rows` restricts to a block of query rows (the oracle works in row blocks)."""
    import torch

    rows = rows or slice(0, case.seqlen_q)
    r0, r1 = rows.start, min(rows.stop, case.seqlen_q)
    device = inputs.q.device
    vis = None
    if case.mask.is_causal:
        i = torch.arange(r0, r1, device=device)[:, None]
        j = torch.arange(case.seqlen_k, device=device)[None, :]
        vis = (j <= i + case.causal_offset)[None, None]
    if inputs.mask is not None:
        m = inputs.mask.to(device)
        m = m[:, :, r0:r1, :] if m.shape[2] != 1 else m.expand(-1, -1, r1 - r0, -1)
        vis = m if vis is None else (vis & m)
    return vis
