"""A case's id: readable, stable, used by pytest, records and the dashboard, and its
inverse (records that only carry the id).

"b2h4-113x203-d64-fp16-causal_br": batch, heads (kv heads only when they differ:
"b2h8k2-..."), Nq x Nk, head dim, dtype, mask. Then, each only when not at its default: a
V head dim of its own right after the head dim ("-d192v128"); a window "-wl64r0" (a side
left out is unbounded); a layout "-varlen" or "-paged64" ("f" after it: full lengths);
score modifiers "-sc30" (softcap), "-alibi", "-sink"; an input distribution "-outliers"
or "-large"; FP8 inputs "-fp8_qkv_tensor", "-fp8_qkv_head", "-fp8_kv_head" or
"-fp8_kv_token" (harness.core.fp8); the seed "-s3".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.core.cases import Case

DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}
_ID_RE = re.compile(
    r"b(\d+)h(\d+)(?:k(\d+))?-(\d+)x(\d+)-d(\d+)(?:v(\d+))?-(fp16|bf16)-([a-z_]+?)"
    r"(?:-w(?:l(\d+))?(?:r(\d+))?)?(?:-(varlen|paged)(\d+)?(f)?)?"
    r"(?:-sc(\d+(?:\.\d+)?(?:e[-+]?\d+)?))?(-alibi)?(-sink)?(?:-(outliers|large))?"
    r"(?:-fp8_(qkv_tensor|qkv_head|kv_head|kv_token))?(?:-s(\d+))?")


def format_id(c: Case) -> str:
    kv = f"k{c.kv_heads}" if c.kv_heads != c.heads else ""
    dv = f"v{c.head_dim_v}" if c.head_dim_v else ""
    window = ""
    if c.has_window:
        window = "-w" + (f"l{c.window_left}" if c.window_left >= 0 else "") + (
            f"r{c.window_right}" if c.window_right >= 0 else "")
    layout = ""
    if c.layout.value != "dense":
        layout = f"-{c.layout.value}" + (str(c.page_size) if c.page_size else "")
        layout += "f" if c.full_lengths else ""
    mods = (f"-sc{c.softcap:g}" if c.softcap else "") + ("-alibi" if c.alibi else "") + (
        "-sink" if c.sinks else "") + (f"-{c.dist.value}" if c.dist.value != "normal" else "")
    mods += f"-fp8_{c.fp8.value}" if c.fp8.value != "none" else ""
    seed = f"-s{c.seed}" if c.seed else ""
    return (f"b{c.batch}h{c.heads}{kv}-{c.seqlen_q}x{c.seqlen_k}-d{c.head_dim}{dv}"
            f"-{DTYPE_SHORT[c.dtype]}-{c.mask.value}{window}{layout}{mods}{seed}")


def parse_id(case_id: str) -> dict[str, Any]:
    """The fields of the case `case_id` names (ValueError if it names none)."""
    m = _ID_RE.fullmatch(case_id)
    if not m:
        raise ValueError(f"not a case id: {case_id!r}")
    (b, h, k, nq, nk, d, dv, dt, mask, wl, wr, layout, ps, full, cap, alibi, sink, dist,
     fp8, seed) = m.groups()
    return {"batch": int(b), "heads": int(h), "kv_heads": int(k or h), "seqlen_q": int(nq),
            "seqlen_k": int(nk), "head_dim": int(d),
            "dtype": {v: key for key, v in DTYPE_SHORT.items()}[dt], "mask": mask,
            "seed": int(seed or 0), "window_left": int(wl) if wl else -1,
            "window_right": int(wr) if wr else -1, "layout": layout or "dense",
            "page_size": int(ps or 0), "full_lengths": bool(full),
            "softcap": float(cap) if cap else 0.0, "alibi": bool(alibi), "sinks": bool(sink),
            "head_dim_v": int(dv or 0), "dist": dist or "normal", "fp8": fp8 or "none"}
