"""Manifest validation: a parsed `manifest.toml` (or a single file's manifest comment) becomes a
`VariantSpec`, or one `VariantError` naming the file, the field and what is wrong.

Every field is checked for its type and range here, and every size expression is parsed
with the whitelist of harness.candidates.expr, so that nothing a manifest says is ever
evaluated as code. The format is documented in kernels/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.candidates.expr import FUNCTIONS, SIZE_NAMES, Expr, ExprError, parse_expr
from harness.candidates.manifest_bounds import (
    MAX_COMPILE_OPTIONS,
    MAX_EXPR_TERMS,
    MAX_FLAVORS,
    MAX_LAUNCHES,
    MAX_SOURCES,
    MAX_TILES,
    check_entry_count,
)
from harness.candidates.manifest_fields import (
    _bool,
    _bounded,
    _Ctx,
    _int,
    _keys,
    _list,
    _str,
    _tname,
)
from harness.candidates.manifest_supports import _backward_head_dims, _backward_masks, _supports
from harness.candidates.variant_spec import (
    ALGORITHMS,
    ALLOWED_OPTIONS,
    ARCH_RE,
    BACKWARD_OPTIONAL,
    BACKWARD_REQUIRED,
    CC_RE,
    ENTRY_RE,
    FLAVOR_OPTIONAL,
    FLAVOR_REQUIRED,
    HEADER_NAME,
    IDENT_RE,
    INCLUDE_RE,
    LAUNCH_OPTIONAL,
    LAUNCH_REQUIRED,
    MAX_TENSOR_MAPS,
    MAX_WORKSPACES,
    TENSOR_MAP_OPTIONAL,
    TENSOR_MAP_REQUIRED,
    TENSOR_MAP_TENSORS,
    TENSOR_MAP_TENSORS_BWD,
    TIMING_MODES,
    TOP_OPTIONAL,
    TOP_REQUIRED,
    WORKSPACE_DTYPES,
    WORKSPACE_KEYS,
    BackwardSpec,
    FlavorSpec,
    LaunchSpec,
    LoadError,
    SupportSpec,
    TensorMapSpec,
    VariantError,
    VariantSpec,
    WorkspaceSpec,
)

# ------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------


def _expr(ctx: _Ctx, v: Any, where: str, names: frozenset[str]) -> Expr:
    try:
        e = parse_expr(v, names)
    except ExprError as err:
        raise ctx.fail(where, str(err)) from None
    ctx.expr_nodes += e.nodes
    if ctx.expr_nodes > MAX_EXPR_TERMS:
        raise ctx.fail(where, f"the size expressions of a manifest may have at most "
                       f"{MAX_EXPR_TERMS} terms in all")
    return e


def _dims(ctx: _Ctx, v: Any, where: str, names: frozenset[str]) -> tuple[Expr, Expr, Expr]:
    items = _list(ctx, v, where)
    if len(items) > 3:
        raise ctx.fail(where, f"at most 3 dimensions, got {len(items)}")
    exprs = [_expr(ctx, x, f"{where}[{i}]", names) for i, x in enumerate(items)]
    while len(exprs) < 3:
        exprs.append(parse_expr(1))
    return exprs[0], exprs[1], exprs[2]


def _check_options(ctx: _Ctx, options: tuple[str, ...], where: str) -> None:
    for i, o in enumerate(options):
        if not ALLOWED_OPTIONS.match(o):
            raise ctx.fail(f"{where}[{i}]", f"option {o!r} is not allowed (allowed: "
                           "--use_fast_math, -lineinfo, --maxrregcount=N, --ftz/--prec-div/"
                           "--prec-sqrt/--fmad=true|false, --extra-device-vectorization, -DNAME)")


def _flavors(ctx: _Ctx, raw: Any, name: str, has_backward: bool) -> tuple[FlavorSpec, ...]:
    out: list[FlavorSpec] = []
    for i, t in enumerate(_bounded(ctx, raw, "flavor", MAX_FLAVORS)):
        w = f"flavor[{i}]"
        _keys(ctx, t, w, FLAVOR_REQUIRED, FLAVOR_OPTIONAL)
        fname = _str(ctx, t["name"], f"{w}.name")
        if not (IDENT_RE.match(fname) and fname.startswith(name + "_")):
            raise ctx.fail(f"{w}.name", f"{fname!r} must be {name!r} + '_' + letters, digits "
                           "or underscores")
        if fname in (f.name for f in out):
            raise ctx.fail(f"{w}.name", f"{fname!r} is declared twice")
        opts = tuple(_str(ctx, o, f"{w}.compile_options[{j}]")
                     for j, o in enumerate(_bounded(ctx, t["compile_options"],
                                                    f"{w}.compile_options",
                                                    MAX_COMPILE_OPTIONS)))
        _check_options(ctx, opts, f"{w}.compile_options")
        det = _bool(ctx, t["deterministic"], f"{w}.deterministic") \
            if "deterministic" in t else None
        bdet = None
        if "backward_deterministic" in t:
            if not has_backward:
                raise ctx.fail(f"{w}.backward_deterministic", "the variant declares no "
                               "[backward]")
            bdet = _bool(ctx, t["backward_deterministic"], f"{w}.backward_deterministic")
        out.append(FlavorSpec(fname, _str(ctx, t["description"], f"{w}.description"), opts,
                              det, bdet))
    return tuple(out)


def _build_spec(data: dict[str, Any], path: Path, folder: Path, *, expect_name: str | None,
                single_file: tuple[Path, str] | None) -> VariantSpec:
    ctx = _Ctx(path, expect_name or str(data.get("name", "")))
    required = TOP_REQUIRED if single_file is None else tuple(k for k in TOP_REQUIRED
                                                               if k != "sources")
    optional = TOP_OPTIONAL if single_file is None else TOP_OPTIONAL + ("sources",)
    _keys(ctx, data, "", required, optional)

    name = _str(ctx, data["name"], "name")
    if not IDENT_RE.match(name):
        raise ctx.fail("name", f"{name!r} must be letters, digits and underscores")
    if expect_name is not None and name != expect_name:
        raise ctx.fail("name", f"{name!r} must equal the folder name {expect_name!r}")
    ctx.variant = name
    description = _str(ctx, data["description"], "description")
    algorithm = _str(ctx, data["algorithm"], "algorithm")
    if algorithm not in ALGORITHMS:
        raise ctx.fail("algorithm", f"unknown algorithm {algorithm!r} "
                       f"(one of {', '.join(sorted(ALGORITHMS))})")

    cc_text = _str(ctx, data["min_compute_capability"], "min_compute_capability")
    m = CC_RE.match(cc_text)
    if not m:
        raise ctx.fail("min_compute_capability", f"{cc_text!r} must look like \"8.0\"")
    min_cc = (int(m.group(1)), int(m.group(2)))

    arch = _str(ctx, data.get("arch", ""), "arch")
    if arch and not ARCH_RE.match(arch):
        raise ctx.fail("arch", f"{arch!r} must look like \"sm_90a\" or be empty")

    options = tuple(_str(ctx, o, f"compile_options[{i}]") for i, o in
                    enumerate(_bounded(ctx, data.get("compile_options", []),
                                       "compile_options", MAX_COMPILE_OPTIONS,
                                       nonempty=False)))
    _check_options(ctx, options, "compile_options")
    deterministic = _bool(ctx, data.get("deterministic", True), "deterministic")

    num_splits = None
    if "num_splits" in data:
        num_splits = _int(ctx, data["num_splits"], "num_splits", 0)
        if algorithm != "splitkv":
            raise ctx.fail("num_splits", "only split-KV variants (algorithm = \"splitkv\") "
                           "may set num_splits")

    timing = _str(ctx, data.get("timing", "full"), "timing")
    if timing not in TIMING_MODES:
        raise ctx.fail("timing", f"{timing!r} must be one of {', '.join(TIMING_MODES)}")
    timing_max_seqlen = None
    if "timing_max_seqlen" in data:
        timing_max_seqlen = _int(ctx, data["timing_max_seqlen"], "timing_max_seqlen", 1)
    # The gate's floor and target of timed cases for this variant when it is the team's
    # own (harness.runs.plan); absent: the project's setting, else the default.
    timing_min = timing_cases = None
    if "timing_min" in data:
        timing_min = _int(ctx, data["timing_min"], "timing_min", 0)
    if "timing_cases" in data:
        timing_cases = _int(ctx, data["timing_cases"], "timing_cases", 0)

    supports = _supports(ctx, data["supports"])

    tiles: dict[str, int] = {}
    raw_tiles = data.get("tiles", {})
    if not isinstance(raw_tiles, dict):
        raise ctx.fail("tiles", f"must be a table, got {_tname(raw_tiles)}")
    if len(raw_tiles) > MAX_TILES:
        raise ctx.fail("tiles", f"at most {MAX_TILES} tiles, got {len(raw_tiles)}")
    for k, v in raw_tiles.items():
        if not IDENT_RE.match(k) or k in SIZE_NAMES or k in FUNCTIONS:
            raise ctx.fail(f"tiles.{k}", "tile names must be identifiers that are not size "
                           "names or functions")
        tiles[k] = _int(ctx, v, f"tiles.{k}", 1)
    names = SIZE_NAMES | frozenset(tiles)

    workspaces = _workspaces(ctx, data.get("workspace", []), "workspace", names)
    tensor_maps = _tensor_maps(ctx, data.get("tensor_map", []), names)
    launches = _launches(ctx, data["launch"], "launch", names, supports)
    backward = None
    if "backward" in data:
        backward = _backward(ctx, data["backward"], names, supports)
    check_entry_count(ctx, supports, launches + (backward.launches if backward else ()))
    flavors: tuple[FlavorSpec, ...] = ()
    if "flavor" in data:
        if single_file is not None:
            raise ctx.fail("flavor", "a single-file variant is one variant: no [[flavor]]")
        flavors = _flavors(ctx, data["flavor"], name, backward is not None)

    # Sources: read them and check their includes.
    texts: list[tuple[str, str]] = []
    if single_file is not None:
        fpath, ftext = single_file
        if "sources" in data:
            src = _list(ctx, data["sources"], "sources")
            if src != [fpath.name]:
                raise ctx.fail("sources", f"a single-file variant is its own source: leave "
                               f"sources out or set it to [{fpath.name!r}]")
        sources: tuple[str, ...] = (fpath.name,)
        texts.append((fpath.name, ftext))
    else:
        sources = tuple(_str(ctx, s, f"sources[{i}]") for i, s in
                        enumerate(_bounded(ctx, data["sources"], "sources", MAX_SOURCES,
                                           unique=True)))
        for i, s in enumerate(sources):
            if "/" in s or "\\" in s or s.startswith(".") or not s.endswith((".cu", ".cuh")):
                raise ctx.fail(f"sources[{i}]", f"{s!r} must be a .cu/.cuh file name inside "
                               "the variant folder")
            sp = folder / s
            if not sp.is_file():
                raise ctx.fail(f"sources[{i}]", f"source file {s!r} not found in {folder}")
            try:
                texts.append((f"{name}/{s}", sp.read_text()))
            except (OSError, UnicodeDecodeError) as e:
                raise ctx.fail(f"sources[{i}]", f"cannot read {s!r}: {e}") from None
    for label, text in texts:
        for lineno, line in enumerate(text.split("\n"), 1):
            m = INCLUDE_RE.match(line)
            if m and m.group(2) != HEADER_NAME:
                src_path = folder / Path(label).name if single_file is None else path
                raise VariantError(LoadError(
                    str(src_path), f"line {lineno}",
                    f"#include {m.group(1)}{m.group(2)}{'>' if m.group(1) == '<' else chr(34)}"
                    f" is not allowed: a variant may include only \"{HEADER_NAME}\"", name))

    return VariantSpec(
        name=name, description=description, algorithm=algorithm, sources=sources,
        min_compute_capability=min_cc, arch=arch, compile_options=options,
        deterministic=deterministic, num_splits=num_splits, supports=supports, tiles=tiles,
        workspaces=tuple(workspaces), launches=tuple(launches), manifest_path=path,
        source_texts=tuple(texts), raw=data, timing=timing,
        timing_max_seqlen=timing_max_seqlen, timing_min=timing_min,
        timing_cases=timing_cases, backward=backward, tensor_maps=tensor_maps,
        flavors=flavors,
    )


def _workspaces(ctx: _Ctx, raw: Any, where0: str, names: frozenset[str]
                ) -> tuple[WorkspaceSpec, ...]:
    workspaces: list[WorkspaceSpec] = []
    raw_ws = _list(ctx, raw, where0, nonempty=False)
    if len(raw_ws) > MAX_WORKSPACES:
        raise ctx.fail(where0, f"at most {MAX_WORKSPACES} workspaces "
                       f"(FaParams.workspace has {MAX_WORKSPACES} slots), got {len(raw_ws)}")
    for i, w in enumerate(raw_ws):
        where = f"{where0}[{i}]"
        _keys(ctx, w, where, WORKSPACE_KEYS, ())
        wname = _str(ctx, w["name"], f"{where}.name")
        if not IDENT_RE.match(wname) or any(x.name == wname for x in workspaces):
            raise ctx.fail(f"{where}.name", f"{wname!r} must be a unique identifier")
        wdt = _str(ctx, w["dtype"], f"{where}.dtype")
        if wdt not in WORKSPACE_DTYPES:
            raise ctx.fail(f"{where}.dtype", f"unknown dtype {wdt!r} "
                           f"(one of {', '.join(WORKSPACE_DTYPES)})")
        workspaces.append(WorkspaceSpec(wname, wdt, _expr(ctx, w["elements"],
                                                          f"{where}.elements", names)))
    return tuple(workspaces)


def _tensor_maps(ctx: _Ctx, raw: Any, names: frozenset[str], key: str = "tensor_map",
                 tensors: tuple[str, ...] = TENSOR_MAP_TENSORS) -> tuple[TensorMapSpec, ...]:
    """`[[tensor_map]]` (or `[[backward.tensor_map]]`): which tensor, the box (expressions,
    checked against TMA's rules for each case when the map is encoded) and the swizzle."""
    maps: list[TensorMapSpec] = []
    raw_maps = _list(ctx, raw, key, nonempty=False)
    if len(raw_maps) > MAX_TENSOR_MAPS:
        raise ctx.fail(key, f"at most {MAX_TENSOR_MAPS} tensor maps, got {len(raw_maps)}")
    for i, m in enumerate(raw_maps):
        where = f"{key}[{i}]"
        _keys(ctx, m, where, TENSOR_MAP_REQUIRED, TENSOR_MAP_OPTIONAL)
        tensor = _str(ctx, m["tensor"], f"{where}.tensor")
        if tensor not in tensors:
            raise ctx.fail(f"{where}.tensor", f"{tensor!r} is not one of {', '.join(tensors)}")
        # An integer is checked here; an expression (a swizzle by head dim or by e4m3
        # rows) when a case gives it a value (tensor_map.Box.check: the launch is refused).
        raw_swizzle = m.get("swizzle", 128)
        swizzle = _expr(ctx, raw_swizzle, f"{where}.swizzle", names)
        if isinstance(raw_swizzle, int) and raw_swizzle not in (0, 32, 64, 128):
            raise ctx.fail(f"{where}.swizzle", f"{raw_swizzle} must be 0, 32, 64 or 128 (bytes)")
        maps.append(TensorMapSpec(tensor, _expr(ctx, m["box_rows"], f"{where}.box_rows", names),
                                  _expr(ctx, m["box_cols"], f"{where}.box_cols", names), swizzle))
    return tuple(maps)


def _launches(ctx: _Ctx, raw: Any, where0: str, names: frozenset[str],
              supports: SupportSpec) -> tuple[LaunchSpec, ...]:
    launches: list[LaunchSpec] = []
    for i, launch in enumerate(_bounded(ctx, raw, where0, MAX_LAUNCHES)):
        where = f"{where0}[{i}]"
        _keys(ctx, launch, where, LAUNCH_REQUIRED, LAUNCH_OPTIONAL)
        entry = _str(ctx, launch["entry"], f"{where}.entry")
        if not ENTRY_RE.match(entry) or entry[0].isdigit():
            raise ctx.fail(f"{where}.entry", f"{entry!r} must be an identifier, optionally "
                           "with {dtype} and {head_dim} placeholders")
        if "{head_dim}" in entry and supports.head_dims is None:
            raise ctx.fail(f"{where}.entry", "uses {head_dim} but supports.head_dims is "
                           "\"any\": list the head dims the entries exist for")
        launches.append(LaunchSpec(
            entry=entry,
            grid=_dims(ctx, launch["grid"], f"{where}.grid", names),
            block=_dims(ctx, launch["block"], f"{where}.block", names),
            shared_mem=_expr(ctx, launch.get("shared_mem", 0), f"{where}.shared_mem", names),
        ))
    return tuple(launches)


def _backward(ctx: _Ctx, table: Any, names: frozenset[str], supports: SupportSpec
              ) -> BackwardSpec:
    """The `[backward]` table: its own launches and workspaces, run with the backward's
    FaParams fields filled (dout, dq, dk, dv; o and lse hold the forward's O and LSE)."""
    _keys(ctx, table, "backward", BACKWARD_REQUIRED, BACKWARD_OPTIONAL)
    return BackwardSpec(
        deterministic=_bool(ctx, table.get("deterministic", False), "backward.deterministic"),
        workspaces=_workspaces(ctx, table.get("workspace", []), "backward.workspace", names),
        launches=_launches(ctx, table["launch"], "backward.launch", names, supports),
        tensor_maps=_tensor_maps(ctx, table.get("tensor_map", []), names, "backward.tensor_map",
                                 TENSOR_MAP_TENSORS_BWD),
        masks=_backward_masks(ctx, table["masks"], supports) if "masks" in table else None,
        head_dims=(_backward_head_dims(ctx, table["head_dims"], supports)
                   if "head_dims" in table else None))
