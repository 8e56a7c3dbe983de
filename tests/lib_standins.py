"""Stand-ins for attention libraries (tests/test_lib_peers*.py): an importable module that
holds what the library's documentation says its functions do."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import torch


def stand_in(monkeypatch, name: str, **attrs) -> None:  # noqa: ANN001
    """Module `name`, importable (find_spec sees it), holding `attrs`."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attr, value in attrs.items():
        setattr(mod, attr, value)
    monkeypatch.setitem(sys.modules, name, mod)


def attend(q, k, v, scale, causal, left, right, softcap, sink=None,  # noqa: ANN001
           empty_lse=float("-inf"), alibi_slopes=None):
    """Attention on (B, N, H, d) tensors as the libraries' interfaces describe it, in
    float32: causal and windows bottom-right aligned, softcap on the scaled score, ALiBi
    -slope |i + Nk - Nq - j|, a sink logit in the denominator only; `empty_lse` for a row
    that sees no key (without a sink). Returns (out float32 (B, N, H, d_v), lse (B, H, N))."""
    b, nq, h, d = q.shape
    nk, hk = k.shape[1], k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    off = nk - nq
    if alibi_slopes is not None:
        s = s - alibi_slopes.float()[None, :, None, None] * (i + off - j).abs()
    if causal:
        right = 0
    vis = torch.ones(nq, nk, dtype=torch.bool)
    if left is not None and left >= 0:
        vis &= j >= i + off - left
    if right is not None and right >= 0:
        vis &= j <= i + off + right
    s = s.masked_fill(~vis, float("-inf"))
    if sink is not None:   # a key with no value, in the denominator only
        z = sink.float()[None, :, None, None].expand(b, h, nq, 1)
        lse = torch.logsumexp(torch.cat([s, z], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = (p @ vf).transpose(1, 2)
    if sink is None:
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, empty_lse), lse)
    return out, lse
