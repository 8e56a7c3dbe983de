"""Would a softcap through `tanh.approx.f32` pass the tolerance rule? Emulated on the CPU.

    python bench/softcap_tanh_error.py

fa3_wgmma computes a capped score c * tanh(s / c) from one exp2 and a reciprocal refined
by Newton's method (within 4e-7 of tanh; docs/score-mods.md), which costs the softmax's
own MUFU unit one more exponential and the FMA pipe a few steps per score. PTX's
`tanh.approx.f32` would be one MUFU operation, with a relative error the PTX manual bounds
by about 2^-11: a capped score near c then moves by up to c / 2048. This script asks the
harness's own check (harness.core.check.check_case: the oracle and the one tolerance rule)
what that error does, on the mods grid's cases with a softcap and no other modifier:
three float32 attentions that differ only in their tanh,

  exact   torch.tanh,
  round   tanh rounded to 11 significant bits (fp16's: relative error <= 2^-11, most of
          it much smaller),
  bound   tanh times (1 +- 2^-11), the sign drawn at random per score: the bound reached
          everywhere,

each with P rounded to the case dtype before P V, as the kernel does. A case that fails
under `bound` is one a kernel on tanh.approx could fail.

Exit 0; 2 when the mods grid holds no such case.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

MODES = ("exact", "round", "bound")


def emulated(mode: str) -> Any:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_kind: str, mask: Any,
           key_lengths: Any, causal_offset: int, scale: float, softcap: float = 0.0,
           **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        h, hk = q.shape[1], k.shape[1]
        kf = k.float().repeat_interleave(h // hk, 1)
        vf = v.float().repeat_interleave(h // hk, 1)
        s = q.float() @ kf.transpose(-1, -2) * scale
        if softcap > 0:
            t = torch.tanh(s / softcap)
            if mode == "round":
                t = t.half().float()
            elif mode == "bound":
                gen = torch.Generator().manual_seed(0)
                sign = torch.randint(0, 2, t.shape, generator=gen).float() * 2 - 1
                t = t * (1 + sign * 2.0 ** -11)
            s = softcap * t
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        vis = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
        if mask_kind.startswith("causal"):
            vis = j <= i + causal_offset
        vis = vis[None, None] if mask is None else vis[None, None] & mask
        s = s.masked_fill(~vis, float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        lsum = p.sum(-1, keepdim=True)
        o = (p.to(q.dtype).float() @ vf) / lsum.clamp_min(1e-30)
        lse = (m + torch.log(lsum)).squeeze(-1)
        return o.to(q.dtype), lse
    return fn


def main() -> int:
    from harness.candidates.python_candidate import PythonKernel, to_candidate
    from harness.core.check import check_case
    from harness.core.grids import get_grid

    torch.set_num_threads(2)
    cases = [c for c in get_grid("mods") if c.softcap and not c.alibi and not c.sinks
             and c.fp8.value == "none" and not c.has_window and not c.head_dim_v]
    if not cases:
        print("no softcap-only case in the mods grid", file=sys.stderr)
        return 2
    cands = {m: to_candidate(PythonKernel(name=f"tanh_{m}", fn=emulated(m), device="cpu",
                                          lse="-inf", softcap=True), "bench") for m in MODES}
    print(f"{'case':44} " + " ".join(f"{m:>8}" for m in MODES))
    failed = dict.fromkeys(MODES, 0)
    why = []
    for case in cases:
        row = []
        for m, cand in cands.items():
            res = check_case(cand, case, device="cpu")
            row.append(res.status.value)
            if res.status.value != "passed":
                failed[m] += 1
                why.append(f"  {m} {case.id}: {res.message}")
        print(f"{case.id:44} " + " ".join(f"{r:>8}" for r in row))
    print("not passed: " + ", ".join(f"{m} {failed[m]} of {len(cases)}" for m in MODES))
    print("\n".join(why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
