"""What one test case is, and how its inputs are drawn.

A case fixes the shapes, the dtype, the mask kind and a seed. Inputs are drawn from the
seed (mixed with an optional secret, so that a scored submission cannot know them in
advance) on whatever device the caller asks for. Layout is (batch, heads, seq, head_dim),
K/V may have fewer heads than Q (GQA/MQA).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from harness.core.case_ids import DTYPE_SHORT, format_id, parse_id
from harness.core.distributions import Dist
from harness.core.fp8 import Fp8, fp8_problems, quantize_inputs
from harness.core.masks import key_lengths_for, random_mask, visible
from harness.core.seeds import derive_seed
from harness.core.serving import Layout

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_SHORT", "Case", "Dist", "Fp8", "GradInputs", "Inputs", "Layout", "MaskKind",
           "derive_seed", "key_lengths_for", "make_inputs", "random_mask", "visible"]

# torch is imported on first use, not with this module: records, the database and the
# dashboard describe cases without it (`fa-harness db current` must not pay torch's start).
DTYPE_NAMES = ("float16", "bfloat16")


def __getattr__(name: str) -> Any:
    if name == "DTYPES":  # {"float16": torch.float16, ...}, built when asked for
        import torch

        return {"float16": torch.float16, "bfloat16": torch.bfloat16}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
SERVING_DEFAULTS = {"window_left": -1, "window_right": -1, "layout": "dense", "page_size": 0,
                    "full_lengths": False}
# Case fields with a default: records written before a field existed still load.
# The score modifiers (harness.core.reference's doc has their semantics): a case without
# them is written, named and drawn as before they existed.
MOD_DEFAULTS = {"softcap": 0.0, "alibi": False, "sinks": False}
# V's head dim when it differs from Q's and K's (0: the same), and the inputs'
# distribution (harness.core.distributions), and FP8 inputs (harness.core.fp8).
AXIS_DEFAULTS = {"head_dim_v": 0, "dist": "normal", "fp8": "none"}
OPTIONAL_FIELDS = frozenset({"dtype", "mask", "seed", "window_left", "window_right", "layout",
                             "page_size", "full_lengths", *MOD_DEFAULTS, *AXIS_DEFAULTS})
# Draw index of a case's ALiBi slopes and sink logits, and of what an input distribution
# adds to the N(0, 1) draw: never one of q/k/v's draws.
MODS_DRAW = 1 << 43
DIST_DRAW = 1 << 44


class MaskKind(StrEnum):
    NONE = "none"
    CAUSAL_BR = "causal_br"  # bottom-right aligned (FlashAttention): j <= i + Nk - Nq
    CAUSAL_TL = "causal_tl"  # top-left aligned (PyTorch is_causal): j <= i
    KEY_PADDING = "key_padding"  # per-batch valid key length; one batch entry may have none
    RANDOM = "random"  # arbitrary boolean mask, with some rows fully masked

    @property
    def is_causal(self) -> bool:
        return self in (MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL)


# Mask kinds a serving layout combines with: per-sequence lengths replace key padding, and
# an arbitrary mask over packed or paged keys is not a serving shape.
SERVING_MASKS = (MaskKind.NONE, MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL)


@dataclass(frozen=True, order=True)
class Case:
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "float16"
    mask: MaskKind = MaskKind.NONE
    seed: int = 0
    # Sliding window (FlashAttention's window_size): query row i sees keys j with
    # i + o - window_left <= j <= i + o + window_right, o the alignment offset
    # (`window_offset`); -1 leaves that side unbounded.
    window_left: int = -1
    window_right: int = -1
    layout: Layout = Layout.DENSE
    page_size: int = 0  # keys per page (paged layout only)
    # Varlen and paged: every sequence at the full Nq x Nk (throughput cases, comparable
    # with the dense case of the same shape) instead of the mixed lengths drawn per case.
    full_lengths: bool = False
    # Score modifiers: logit soft-capping (0: none), ALiBi biases with per-head slopes,
    # and a learnable per-head sink logit in the softmax denominator. The slopes and sink
    # logits are inputs the harness draws from the case's seed (`Inputs.alibi_slopes`,
    # `Inputs.sinks`).
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    # d_v, V's (and the output's) head dim, where it differs from d_qk = head_dim (an MLA
    # prefill's 192 / 128); 0 (or head_dim itself, stored as 0): the same.
    head_dim_v: int = 0
    # What q, k and v are drawn from: normal, outliers, large (harness.core.distributions).
    dist: Dist = Dist.NORMAL
    # FP8 e4m3 inputs with harness-owned descales: Q, K and V (qkv_tensor, qkv_head) or
    # the KV cache (kv_head, kv_token); none: the case dtype (harness.core.fp8).
    fp8: Fp8 = Fp8.NONE

    def __post_init__(self) -> None:
        problems = []
        for name in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1")
        if self.kv_heads >= 1 and self.heads % self.kv_heads:
            problems.append(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.dtype not in DTYPE_NAMES:
            problems.append(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_NAMES)}")
        object.__setattr__(self, "mask", MaskKind(self.mask))
        object.__setattr__(self, "layout", Layout(self.layout))
        problems += self._serving_problems()
        problems += self._mod_problems()
        if int(self.head_dim_v) == int(self.head_dim):
            object.__setattr__(self, "head_dim_v", 0)
        if int(self.head_dim_v) < 0:
            problems.append("head_dim_v must be >= 1 (0: head_dim)")
        if self.head_dim_v and self.layout is not Layout.DENSE:
            problems.append("head_dim_v is for the dense layout only")
        try:
            object.__setattr__(self, "dist", Dist(self.dist))
        except ValueError:
            problems.append(f"dist {self.dist!r} is not one of {[d.value for d in Dist]}")
        else:
            if self.dist is not Dist.NORMAL and self.layout is not Layout.DENSE:
                problems.append("an input distribution other than normal is for the dense "
                                "layout only")
        problems += fp8_problems(self)
        if problems:
            raise ValueError("invalid case: " + "; ".join(problems))

    def _serving_problems(self) -> list[str]:
        problems = []
        for name in ("window_left", "window_right"):
            if int(getattr(self, name)) < -1:
                problems.append(f"{name} must be >= -1 (-1: unbounded)")
        if self.layout is not Layout.DENSE and self.mask not in SERVING_MASKS:
            problems.append(f"mask {self.mask.value} does not combine with the "
                            f"{self.layout.value} layout")
        if self.layout is Layout.PAGED and self.page_size < 1:
            problems.append("a paged case needs page_size >= 1")
        if self.layout is not Layout.PAGED and self.page_size:
            problems.append("page_size is for the paged layout only")
        if self.full_lengths and self.layout is Layout.DENSE:
            problems.append("full_lengths is for the varlen and paged layouts only")
        return problems

    def _mod_problems(self) -> list[str]:
        problems = []
        cap = float(self.softcap)
        object.__setattr__(self, "softcap", cap)
        if not (cap >= 0.0 and cap != float("inf")):
            problems.append("softcap must be a finite number >= 0 (0: none)")
        if self.has_score_mods and self.layout is not Layout.DENSE:
            problems.append("score modifiers (softcap, alibi, sinks) are for the dense "
                            "layout only")
        return problems

    @property
    def id(self) -> str:
        """The readable, stable id pytest, records and the dashboard use
        ("b2h4-113x203-d64-fp16-causal_br"; harness.core.case_ids says how it is made)."""
        return format_id(self)

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def dv(self) -> int:
        """d_v: the head dim of V and of the output (head_dim unless head_dim_v says)."""
        return self.head_dim_v or self.head_dim

    @property
    def has_score_mods(self) -> bool:
        """Softcap, ALiBi or sinks: a score modifier a candidate must declare."""
        return bool(self.softcap) or self.alibi or self.sinks

    @property
    def diagonal_offset(self) -> int:
        """The offset o of the alignment windows and ALiBi use: query row i sits at key
        position i + o; 0 under CAUSAL_TL, else Nk - Nq (FlashAttention's bottom-right)."""
        return 0 if self.mask is MaskKind.CAUSAL_TL else self.seqlen_k - self.seqlen_q

    @property
    def is_serving(self) -> bool:
        """Per-sequence lengths (varlen, paged) rather than one Nq x Nk per batch entry."""
        return self.layout is not Layout.DENSE

    @property
    def window_top_left(self) -> bool:
        """The window is aligned like the causal mask: top-left under CAUSAL_TL, else
        bottom-right (FlashAttention's convention for windows)."""
        return self.mask is MaskKind.CAUSAL_TL

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    @property
    def causal_offset(self) -> int:
        """Query row i sees key j iff j <= i + causal_offset (only meaningful when causal)."""
        if self.mask is MaskKind.CAUSAL_BR:
            return self.seqlen_k - self.seqlen_q
        return 0

    @property
    def group_size(self) -> int:
        return self.heads // self.kv_heads

    def columns(self) -> dict[str, Any]:
        """Every field with a database column, the serving ones too (a database row). The
        score modifiers and head_dim_v have none: the case id, the row's key, carries them."""
        d = self._fields()
        for name in (*MOD_DEFAULTS, *AXIS_DEFAULTS):
            del d[name]
        return d

    def _fields(self) -> dict[str, Any]:
        # Every field is a scalar or an enum: no deep copy (asdict's) is needed, and the
        # comparisons of an import build this dict tens of thousands of times.
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["mask"] = self.mask.value
        d["layout"] = self.layout.value
        d["dist"] = self.dist.value
        d["fp8"] = self.fp8.value
        return d

    def to_dict(self) -> dict[str, Any]:
        """The fields, without serving fields or score modifiers at their defaults: a
        dense, windowless, unmodified case is written as it was before those fields
        existed (records stay comparable)."""
        d = self._fields()
        for name, default in (SERVING_DEFAULTS | MOD_DEFAULTS | AXIS_DEFAULTS).items():
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        missing = set(cls.__dataclass_fields__) - set(fields) - OPTIONAL_FIELDS
        if missing:
            raise ValueError(f"case is missing field(s): {', '.join(sorted(missing))}")
        return cls(**fields)

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """Inverse of `id` (used when importing records that only carry the id)."""
        return cls(**parse_id(case_id))


_FIELDS = dataclasses.fields(Case)


@dataclass
class Inputs:
    """Tensors of one case. `mask` is the boolean visibility mask for the kinds that need
    one (key padding, random), shaped (B, 1, Nq, Nk) or broadcastable to it; causal cases
    carry no mask tensor (the flag and alignment say it all). `key_lengths` is set for
    key padding (int32, one per batch). `serving` holds the index tensors of the varlen
    and paged layouts (harness.core.serving.ServingIndex); q, k and v are then packed
    (varlen) or K/V are page pools (paged)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None = None
    key_lengths: torch.Tensor | None = None
    serving: Any = None
    # Score modifiers (float32, one per query head): the ALiBi slopes of an `alibi` case
    # and the sink logits of a `sinks` case, None otherwise.
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    # FP8 cases (harness.core.fp8): float32 descales of the e4m3 tensors among q, k, v,
    # each broadcasting against its tensor's shape without the head dim; None otherwise.
    q_descale: torch.Tensor | None = None
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> Inputs:
        return dataclasses.replace(self, **_moved(self, device))


def _moved(obj: Any, device: str | torch.device) -> dict[str, Any]:
    """The tensor fields of a dataclass (and its ServingIndex) moved to `device`."""
    moved: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        t = getattr(obj, f.name)
        if t is not None and hasattr(t, "to"):
            moved[f.name] = t.to(device)
    return moved


@dataclass
class GradInputs(Inputs):
    """What a backward gets: the forward's inputs, the forward's output `out` (in the case
    dtype) and `lse` (float32, in the candidate's masked-row convention), and the output
    gradient `dout`. All of them are inputs: the backward must leave them unmodified."""

    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    dout: torch.Tensor | None = None


def make_inputs(case: Case, device: str | torch.device = "cpu", *, secret: int = 0,
                draw: int = 0) -> Inputs:
    """Draw q, k, v ~ N(0, 1) in the case dtype (and the mask) from the case's seed; a
    case's input distribution other than normal reshapes that draw
    (harness.core.distributions); an fp8 case quantizes it to e4m3 with the descales the
    harness owns (harness.core.fp8).

    The draw happens on the CPU so that the same case gives the same tensors on any device,
    then moves to `device`. Large perf cases are drawn directly on the device instead,
    where a CPU draw would cost seconds (still seeded, so reproducible on that device)."""
    import torch

    seed = derive_seed(case, secret, draw)
    scales: dict[str, Any] = {}  # an fp8 case's descales (harness.core.fp8)
    if case.is_serving:
        from harness.core.serving import make_serving_tensors

        q, k, v, index = make_serving_tensors(case, device, seed)
        if case.fp8 is not Fp8.NONE:  # an e4m3 KV cache from the drawn pool or keys
            q, k, v, scales = quantize_inputs(case, q, k, v)
        return Inputs(q, k, v, serving=index, **scales).to(device)
    dt = case.torch_dtype
    shape_q = (case.batch, case.heads, case.seqlen_q, case.head_dim)
    shape_kv = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
    shape_v = shape_kv[:3] + (case.dv,)
    big = case.batch * case.heads * max(case.seqlen_q, case.seqlen_k) * case.head_dim > (1 << 24)
    draw_dev = torch.device(device) if big else torch.device("cpu")
    gen = torch.Generator(device=draw_dev)
    gen.manual_seed(seed)
    q = torch.randn(shape_q, generator=gen, device=draw_dev, dtype=torch.float32)
    k = torch.randn(shape_kv, generator=gen, device=draw_dev, dtype=torch.float32)
    v = torch.randn(shape_v, generator=gen, device=draw_dev, dtype=torch.float32)
    if case.dist is not Dist.NORMAL:
        from harness.core.distributions import shape_inputs

        dist_gen = torch.Generator(device=draw_dev)
        dist_gen.manual_seed(derive_seed(case, secret, DIST_DRAW + draw))
        q, k, v = shape_inputs(case.dist, q, k, v, dist_gen)
    if case.fp8 is not Fp8.NONE:  # e4m3 (Q in the dtype for a KV cache), from the draw
        q, k, v, scales = quantize_inputs(case, q, k, v)
    else:
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    mask = None
    key_lengths = None
    cpu_gen = torch.Generator()
    cpu_gen.manual_seed(seed ^ 0x5EED)
    if case.mask is MaskKind.KEY_PADDING:
        lengths = key_lengths_for(case, cpu_gen)
        key_lengths = torch.tensor(lengths, dtype=torch.int32)
        mask = (torch.arange(case.seqlen_k)[None, :] < key_lengths[:, None])[:, None, None, :]
    elif case.mask is MaskKind.RANDOM:
        mask = random_mask(case, cpu_gen)
    from harness.core.score_mods import score_mod_inputs

    slopes, sinks = score_mod_inputs(case, derive_seed(case, secret, MODS_DRAW + draw))
    return Inputs(q, k, v, mask, key_lengths, alibi_slopes=slopes, sinks=sinks,
                  **scales).to(device)



# Draw index of the output gradient dO: its own seed, never one of the inputs' draws.
GRAD_OUTPUT_DRAW = 1 << 41


def make_grad_output(case: Case, device: str | torch.device = "cpu", *, secret: int = 0,
                     draw: int = 0) -> torch.Tensor:
    """The backward's dO ~ N(0, 1), (B, H, Nq, d_v) in the case dtype, from the case's seed
    (and the secret: a submission cannot know it), drawn like the inputs."""
    import torch

    seed = derive_seed(case, secret, GRAD_OUTPUT_DRAW + draw)
    shape = (case.batch, case.heads, case.seqlen_q, case.dv)
    big = case.batch * case.heads * case.seqlen_q * case.dv > (1 << 24)
    draw_dev = torch.device(device) if big else torch.device("cpu")
    gen = torch.Generator(device=draw_dev)
    gen.manual_seed(seed)
    do = torch.randn(shape, generator=gen, device=draw_dev, dtype=torch.float32)
    return do.to(case.torch_dtype).to(device)
