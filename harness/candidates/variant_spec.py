"""What a kernel variant is, once its manifest has been read: the spec dataclasses, the
manifest format's constants, and the values of the size-expression variables for a case.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.candidates.expr import Expr
from harness.core.candidate import Support
from harness.core.cases import DTYPE_SHORT, Case, Fp8, Layout, MaskKind

KERNELS_ROOT = Path(__file__).resolve().parents[1] / "kernels"
HEADER_NAME = "fa_harness.h"
MANIFEST_NAME = "manifest.toml"
# Folders under kernels/ that are not variants.
NOT_VARIANTS = frozenset({"include"})

ALGORITHMS = frozenset({"naive_3pass", "naive_fused", "fa1", "fa2", "splitkv", "ideal"})
WORKSPACE_DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
MAX_WORKSPACES = 4
MAX_HEAD_DIM = 256

TOP_REQUIRED = ("name", "description", "algorithm", "sources", "min_compute_capability",
                "supports", "launch")
TOP_OPTIONAL = ("arch", "compile_options", "deterministic", "num_splits", "tiles", "workspace",
                "timing", "timing_max_seqlen", "timing_min", "timing_cases", "backward",
                "tensor_map", "flavor")
BACKWARD_REQUIRED = ("launch",)
BACKWARD_OPTIONAL = ("deterministic", "workspace", "tensor_map", "masks", "head_dims")
# How the CI gate times a variant (harness.runs.plan): "full" every timing case it
# supports (as the budget allows), "smoke" its two cheapest, "none" correctness only.
TIMING_MODES = ("full", "smoke", "none")
# `[[flavor]]`: the same sources built again with more `-D` options under another name
# (a deterministic backward, another tile size), enrolled as a variant of its own.
FLAVOR_REQUIRED = ("name", "description", "compile_options")
FLAVOR_OPTIONAL = ("deterministic", "backward_deterministic")
SUPPORTS_REQUIRED = ("dtypes", "head_dims", "masks", "gqa", "writes_lse")
SUPPORTS_OPTIONAL = ("masked_lse", "max_seqlen_q", "max_seqlen_k", "decode_only", "max_head_dim",
                     "layouts", "window", "softcap", "alibi", "sinks", "head_dim_v", "fp8",
                     "fp8_kv")
# Score modifiers and a V head dim of its own (docs/score-mods.md): FaParams carries their
# values (softcap, alibi_slopes, sinks, head_dim_v), and a variant declaring one runs its
# cases. FP8 inputs (docs/fp8.md): FaParams carries the descales and their strides
# (q_descale, k_descale, v_descale, fp8), and a variant declaring fp8 / fp8_kv gets e4m3
# tensors on those cases (not yet one with [[tensor_map]]: the descriptors are encoded for
# 2-byte elements).
SCORE_MODS = ("softcap", "alibi", "sinks", "head_dim_v")
FP8_AXES = ("fp8", "fp8_kv")
WORKSPACE_KEYS = ("name", "dtype", "elements")
# `[[tensor_map]]` (and `[[backward.tensor_map]]`): a TMA descriptor of one of a pass's
# tensors (harness.candidates.tensor_map), FaParams.tensor_maps + 128 * i in declaration
# order. The backward may also map dO.
TENSOR_MAP_REQUIRED = ("tensor", "box_rows", "box_cols")
TENSOR_MAP_OPTIONAL = ("swizzle",)
TENSOR_MAP_TENSORS = ("q", "k", "v", "o")
TENSOR_MAP_TENSORS_BWD = ("q", "k", "v", "o", "dout")
MAX_TENSOR_MAPS = 4
LAUNCH_REQUIRED = ("entry", "grid", "block")
LAUNCH_OPTIONAL = ("shared_mem",)

# Compiler options a manifest may pass. A whitelist, because submissions use the same
# format: an include path, a pre-included file or an output path must not get through.
# Each is accepted by both NVRTC and nvcc.
ALLOWED_OPTIONS = re.compile(
    r"^(--use_fast_math|-use_fast_math|-lineinfo|--generate-line-info"
    r"|--?maxrregcount=\d+"
    r"|--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)"
    r"|--extra-device-vectorization"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]*)?)\Z"  # \Z: no trailing newline
)
ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)\Z")  # sm_90a -> (9, 0, "a"), sm_100 -> (10, 0)
CC_RE = re.compile(r"^(\d+)\.(\d+)\Z")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]*)[>"]')
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
ENTRY_RE = re.compile(r"^([A-Za-z0-9_]|\{dtype\}|\{head_dim\})+\Z")
SUBMISSION_RE = re.compile(r"\A\s*/\*\s*fa-harness manifest[^\n]*\n(.*?)\*/", re.S)


@dataclass(frozen=True)
class LoadError:
    """One problem with one variant: `path` is the manifest (or source) file, `where` the
    field such as `launch[0].grid[1]` or a line such as `line 12`."""

    path: str
    where: str
    message: str
    variant: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.where}: {self.message}" if self.where else \
            f"{self.path}: {self.message}"


class VariantError(ValueError):
    def __init__(self, error: LoadError):
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class WorkspaceSpec:
    name: str
    dtype: str
    elements: Expr

    @property
    def itemsize(self) -> int:
        return WORKSPACE_DTYPES[self.dtype]


@dataclass(frozen=True)
class TensorMapSpec:
    tensor: str      # q | k | v | o
    box_rows: Expr   # rows of the tensor one copy moves
    box_cols: Expr   # head_dim columns one copy moves
    swizzle: Expr    # shared-memory swizzle span in bytes: 0, 32, 64 or 128


@dataclass(frozen=True)
class LaunchSpec:
    entry: str  # may hold {dtype} and {head_dim}
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    shared_mem: Expr

    def entry_name(self, dtype: str, head_dim: int) -> str:
        return self.entry.replace("{dtype}", DTYPE_SHORT[dtype]).replace("{head_dim}",
                                                                         str(head_dim))


@dataclass(frozen=True)
class BackwardSpec:
    """A manifest's `[backward]`: the launches computing dQ, dK and dV, their workspaces
    (an fp32 dQ accumulator, the D = rowsum(dO * O) buffer, ...) and whether repeats are
    bitwise equal (dQ by atomics is not)."""

    deterministic: bool
    workspaces: tuple[WorkspaceSpec, ...]
    launches: tuple[LaunchSpec, ...]
    tensor_maps: tuple[TensorMapSpec, ...] = ()
    # The mask kinds it runs, among [supports] masks (None: all of them).
    masks: tuple[MaskKind, ...] | None = None
    # The head dims it runs, among [supports] head_dims (None: all of them); its entries
    # exist for these only.
    head_dims: tuple[int, ...] | None = None


@dataclass(frozen=True)
class FlavorSpec:
    """A manifest's `[[flavor]]`: its name (the folder's name + "_" + a suffix), the
    options added to the variant's, and what it changes in the declared determinism."""

    name: str
    description: str
    compile_options: tuple[str, ...]
    deterministic: bool | None = None           # None: the variant's
    backward_deterministic: bool | None = None  # None: the variant's


@dataclass(frozen=True)
class SupportSpec:
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...] | None  # None: any head dim up to max_head_dim
    max_head_dim: int
    masks: tuple[MaskKind, ...]
    gqa: bool
    writes_lse: bool
    masked_lse: str = "-inf"
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    decode_only: bool = False
    layouts: tuple[Layout, ...] = (Layout.DENSE,)
    window: bool = False
    softcap: bool = False
    alibi: bool = False
    sinks: bool = False
    head_dim_v: bool = False
    # The (d_qk, d_v) pairs with d_v != d_qk it runs (None: any pair of head_dims, when
    # head_dim_v is declared): `head_dim_v = [[192, 128]]` in the manifest.
    head_dim_v_pairs: tuple[tuple[int, int], ...] | None = None
    fp8: bool = False  # e4m3 Q, K, V (FaParams.fp8 == FA_FP8_QKV, docs/fp8.md)
    fp8_head_dims: tuple[int, ...] | None = None  # `fp8 = [128]`: at those head dims only
    fp8_kv: bool = False  # an e4m3 KV cache, Q in the case dtype (FA_FP8_KV)


@dataclass(frozen=True)
class VariantSpec:
    """A validated manifest plus the source text it names."""

    name: str
    description: str
    algorithm: str
    sources: tuple[str, ...]
    min_compute_capability: tuple[int, int]
    arch: str
    compile_options: tuple[str, ...]
    deterministic: bool
    num_splits: int | None
    supports: SupportSpec
    tiles: dict[str, int]
    workspaces: tuple[WorkspaceSpec, ...]
    launches: tuple[LaunchSpec, ...]
    manifest_path: Path
    source_texts: tuple[tuple[str, str], ...] = field(repr=False)  # (label, text)
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    timing: str = "full"
    timing_max_seqlen: int | None = None  # timed only on cases with seqlen_q, seqlen_k <= this
    timing_min: int | None = None  # the gate's floor of timed cases (owned variants)
    timing_cases: int | None = None  # the gate's target of timed cases (owned variants)
    backward: BackwardSpec | None = None
    tensor_maps: tuple[TensorMapSpec, ...] = ()
    flavors: tuple[FlavorSpec, ...] = ()

    def with_flavors(self) -> list[VariantSpec]:
        """This variant, then one spec per `[[flavor]]`: same sources and launches, the
        flavor's name, description and added options (so its own compiled module)."""
        out = [self]
        for f in self.flavors:
            bwd = self.backward
            if bwd is not None and f.backward_deterministic is not None:
                bwd = replace(bwd, deterministic=f.backward_deterministic)
            out.append(replace(
                self, name=f.name, description=f.description,
                compile_options=self.compile_options + f.compile_options,
                deterministic=self.deterministic if f.deterministic is None
                else f.deterministic, backward=bwd, flavors=()))
        return out

    def flavor(self, name: str) -> VariantSpec | None:
        """This variant or its flavor called `name`, else None."""
        return next((s for s in self.with_flavors() if s.name == name), None)

    def _pass(self, backward: bool) -> Any:
        """The launches' and workspaces' holder of a pass: this spec, or its backward."""
        if backward and self.backward is None:
            raise ValueError(f"{self.name} declares no backward")
        return self.backward if backward else self

    def pass_launches(self, backward: bool = False) -> tuple[LaunchSpec, ...]:
        return self._pass(backward).launches

    def pass_workspaces(self, backward: bool = False) -> tuple[WorkspaceSpec, ...]:
        return self._pass(backward).workspaces

    def pass_tensor_maps(self, backward: bool = False) -> tuple[TensorMapSpec, ...]:
        return self._pass(backward).tensor_maps

    # --- entry points -------------------------------------------------------------------
    def expansions(self) -> list[tuple[str, int | None]]:
        """(dtype, head_dim) pairs the entries are instantiated for; head_dim is None when
        no entry depends on it."""
        uses_d = any("{head_dim}" in launch.entry for launch in self.all_launches)
        dims: list[int | None] = list(self.supports.head_dims or []) if uses_d else [None]
        return [(dt, d) for dt in self.supports.dtypes for d in dims]

    @property
    def all_launches(self) -> tuple[LaunchSpec, ...]:
        """The forward's launches, then the backward's (one module holds both)."""
        return self.launches + (self.backward.launches if self.backward else ())

    def entry_names(self) -> list[str]:
        """Every entry the module must hold: the forward's for each (dtype, head_dim), the
        backward's for the head dims it declares."""
        bwd = self.backward
        names: list[str] = []
        for dt, d in self.expansions():
            launches = self.launches
            if bwd is not None and (bwd.head_dims is None or d is None or d in bwd.head_dims):
                launches += bwd.launches
            for launch in launches:
                n = launch.entry_name(dt, d if d is not None else 0)
                if n not in names:
                    names.append(n)
        return names

    # --- source -------------------------------------------------------------------------
    def full_source(self) -> str:
        """What is compiled: the header, each source (its `#include "fa_harness.h"` line
        blanked), then one FA_CHECK_ENTRY per entry. `#line` directives keep compiler
        messages pointing at the original file and line. The header is inlined rather
        than found through `-I` so that the compile caches, keyed on this text, see a
        header change."""
        header = header_path().read_text()
        header = re.sub(r"^\s*#\s*pragma\s+once\s*$", "", header, flags=re.M)
        parts = [f'#line 1 "{HEADER_NAME}"', header]
        for label, text in self.source_texts:
            parts.append(f'#line 1 "{label}"')
            parts.append(_blank_header_includes(text))
        parts.append('#line 1 "<entry point checks>"')
        parts.extend(f"FA_CHECK_ENTRY({e});" for e in self.entry_names())
        return "\n".join(parts) + "\n"

    @property
    def source_hash(self) -> str:
        h = hashlib.sha256(self.full_source().encode())
        h.update("\0".join(self.compile_options).encode())
        return h.hexdigest()[:16]

    # --- sizes --------------------------------------------------------------------------
    def to_support(self) -> Support:
        s = self.supports
        return Support(
            dtypes=frozenset(s.dtypes),
            head_dims=frozenset(s.head_dims) if s.head_dims is not None else None,
            masks=frozenset(s.masks),
            gqa=s.gqa,
            writes_lse=s.writes_lse,
            masked_lse=s.masked_lse,  # type: ignore[arg-type]
            deterministic=self.deterministic,
            max_seqlen_q=s.max_seqlen_q,
            max_seqlen_k=s.max_seqlen_k,
            decode_only=s.decode_only,
            layouts=frozenset(s.layouts),
            window=s.window,
            softcap=s.softcap, alibi=s.alibi, sinks=s.sinks, head_dim_v=s.head_dim_v,
            head_dim_v_pairs=(frozenset(s.head_dim_v_pairs) if s.head_dim_v_pairs is not None
                              else None),
            fp8=s.fp8, fp8_kv=s.fp8_kv,
            fp8_head_dims=frozenset(s.fp8_head_dims) if s.fp8_head_dims is not None else None,
            min_compute_capability=self.min_compute_capability,
            backward=self.backward is not None,
            backward_deterministic=bool(self.backward and self.backward.deterministic),
            backward_masks=(frozenset(self.backward.masks) if self.backward is not None
                            and self.backward.masks is not None else None),
            backward_head_dims=(frozenset(self.backward.head_dims) if self.backward is not None
                                and self.backward.head_dims is not None else None),
        )

    def workspace_bytes(self, env: Mapping[str, int]) -> int:
        return sum(w.elements.evaluate(env) * w.itemsize for w in self.workspaces)


def size_env(case: Case, *, num_splits: int = 1, sm_count: int = 132,
             tiles: Mapping[str, int] | None = None) -> dict[str, int]:
    """Values of every expression variable for `case`."""
    env = {
        "batch": case.batch,
        "heads": case.heads,
        "kv_heads": case.kv_heads,
        "group": case.heads // case.kv_heads,
        "seqlen_q": case.seqlen_q,
        "seqlen_k": case.seqlen_k,
        "head_dim": case.head_dim,
        "dtype_bytes": 2,
        "num_splits": num_splits,
        "sm_count": sm_count,
        "causal": int(case.mask.is_causal),
        "score_mods": int(case.has_score_mods),
        "fp8_qkv": int(Fp8(case.fp8).quantizes_q),
        "fp8_kv": int(Fp8(case.fp8).is_kv_cache),
        "head_dim_v": case.dv,
    }
    env.update(tiles or {})
    return env


def header_path() -> Path:
    return KERNELS_ROOT / "include" / HEADER_NAME


def _blank_header_includes(text: str) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = INCLUDE_RE.match(line)
        if m and m.group(2) == HEADER_NAME:
            lines[i] = "// (fa_harness.h is inlined by the harness)"
    return "\n".join(lines)
