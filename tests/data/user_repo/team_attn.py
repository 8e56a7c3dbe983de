"""A team's Python candidate: plain softmax attention in fp32 on the CPU (the shape of
what fa-harness asks of a Python-callable kernel; see docs/python-candidates.md)."""

import torch

from harness.candidates.python_candidate import PythonKernel


def attention(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    s = (q.float() @ k.transpose(-1, -2)) * scale
    nq, nk = s.shape[-2:]
    visible = torch.ones(nq, nk, dtype=torch.bool)
    if mask_kind in ("causal_br", "causal_tl"):
        visible = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + causal_offset
    visible = visible[None, None]
    if mask is not None:
        visible = visible & mask
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a fully masked row: out = 0
    return (p @ v).to(q.dtype), lse


candidate = PythonKernel(name="team_attn", fn=attention, device="cpu", lse="-inf",
                         description="the team's reference attention (fp32, CPU)")
