"""Kernel submissions: packing, validation before queueing, and storing.

A submission is CUDA source plus a declarative manifest, nothing else: either a variant
folder in the format of `kernels/` (manifest.toml + .cu files) or a single .cu whose
manifest is TOML in a leading `/* fa-harness manifest ... */` comment. No host code from a
submission ever runs; the manifest's sizes are integer expressions parsed by `harness.candidates.expr`
(never `eval`).

Everything below is checked here, on any machine (nvcc is enough, no GPU needed), before a
submission may enter the queue, within one time and memory budget for the whole
validation (`harness.submissions.budget`). The first problem found rejects it with one
message:

0. no `#line` directive or linemarker in any source (`harness.submissions.line_directives`):
   what a file includes, defines and is blamed for is decided by file and line;
1. files: at most `MAX_FILES` plain files, no sub-folders or links, names of letters,
   digits and `._-`, suffixes .cu/.cuh/.toml/.md/.txt, at most `MAX_FILE_BYTES` each and
   `MAX_TOTAL_BYTES` in all (sizes are read from the file system before any content is),
   UTF-8 text without NUL bytes;
2. sources (comments and string literals blanked first, line continuations joined):
   `#include` only of "fa_harness.h"; only ordinary preprocessor directives; no digraph or
   trigraph spellings of `#`; no redefinition of the header's names (FA_*, fa_*, FaParams)
   and no use of the entry-signature check's internals; no device-side launches or device
   runtime calls (dynamic parallelism);
3. the manifest, by the project's variant loader (schema, types, expressions and their
   counts, entries); a variant that needs a GPU newer than every build target
   (`BUILD_TARGETS`) is refused, since nothing of it would be compiled or judged;
4. compile options from a whitelist (no -rdc, -I, -include, no -D of harness names) and
   an `arch` from a short list;
5. launch limits (harness.submissions.limits), with every expression evaluated at every
   case of the full, perf and decode grids the variant supports (the largest decides):
   blocks per launch at most `MAX_BLOCKS_PER_LAUNCH`, at most 1024 threads per block,
   dynamic shared memory at most the Hopper opt-in maximum (227 KiB), workspace at most
   `MAX_WORKSPACE_BYTES`; a `[backward]`, which is scored too, is held to the same limits
   at every case of the full and perf-bwd grids, its own launches and workspaces;
6. per build target, with the build's own `-arch`: what the preprocessor included and
   defined (`harness.submissions.preprocess`), then an nvcc compile of every entry (the
   backward's too: one module holds both) with the entry-signature check.

A rejected submission is stored as status `done`, verdict `rejected`, with the message
(and its source, when the source was within the size limits), so the submitter and the
leaderboard see it; it never enters the queue. Accepted ones are stored `queued`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.cases import Case, Layout
from harness.submissions.budget import Budget
from harness.submissions.limits import BWD_GRIDS, check_launch_limits, limit_cases
from harness.submissions.line_directives import find_line_directive
from harness.submissions.sources import (
    _SUB_NAME_OK,
    COMPILE_TIMEOUT_S,
    MANIFEST_FILE,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_NAME_LEN,
    MAX_TOTAL_BYTES,
    SINGLE_FILE_MARKER,
    SOURCE_SUFFIXES,
    CannotCheck,
    Rejected,
    check_compile_options,
    check_files,
    check_source,
    pack_path,
    pack_upload,
    source_hash,
)

# The checks of harness.submissions.sources and .limits are part of this module's public
# face.
__all__ = [
    "MAX_FILES", "MAX_FILE_BYTES", "MAX_TOTAL_BYTES", "CannotCheck", "Rejected", "Validated",
    "check_compile_options", "check_files", "check_launch_limits", "check_source",
    "limit_cases", "pack_path", "pack_upload", "read_manifest", "submit_files", "store",
    "validate", "default_submitter",
]


# What submissions are built for: the GPUs they are scored on (H100, H200). The worker
# builds for its device's own capability (harness.candidates.sandboxed_compile), and
# validation checks and compiles for each of these, with the arch the build picks
# (`harness.candidates.nvcc.arch_for`: a manifest's sm_90a for sm_90).
BUILD_TARGETS: tuple[str, ...] = ("sm_90",)


@dataclass
class Validated:
    """A submission that passed every check."""

    name: str
    files: dict[str, str]
    manifest: dict[str, Any]
    source_hash: str
    limits: dict[str, Any] = field(default_factory=dict)

# --------------------------------------------------------------------------- manifest


def read_manifest(files: dict[str, str]) -> dict[str, Any]:
    """The manifest as a dict (folder: manifest.toml; single file: its header comment)."""
    if MANIFEST_FILE in files:
        text, where = files[MANIFEST_FILE], MANIFEST_FILE
    else:
        (where, src), = ((n, t) for n, t in files.items() if n.endswith(".cu"))
        m = re.match(r"\s*/\*\s*" + re.escape(SINGLE_FILE_MARKER) + r"(.*?)\*/", src, re.S)
        if not m:
            raise Rejected(f"{where}: the '/* {SINGLE_FILE_MARKER} ... */' comment is not closed")
        text = m.group(1)
    try:
        manifest = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise Rejected(f"{where}: manifest is not valid TOML: {e}") from None
    except RecursionError:
        # tomllib recurses once per nesting level: a few thousand nested arrays or tables
        # exhaust the stack before any size limit applies.
        raise Rejected(f"{where}: manifest is nested too deeply to be read") from None
    name = manifest.get("name")
    if not isinstance(name, str) or not _SUB_NAME_OK.match(name) or "." in name:
        raise Rejected(f"{where}: field 'name' must be 1..{MAX_NAME_LEN} letters, digits, "
                       f"'_' or '-' (got {name!r})")
    return manifest


def materialize(files: dict[str, str], workdir: Path) -> Path:
    """Write the submission under `workdir` the way the variant loader expects it: a folder
    named after the manifest, or the single .cu. Returns the folder or file path."""
    manifest = read_manifest(files)
    if MANIFEST_FILE in files:
        folder = workdir / "variants" / manifest["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in files.items():
            (folder / fname).write_text(text)
        return folder
    (fname, text), = files.items()
    (workdir / "single").mkdir(parents=True, exist_ok=True)
    target = workdir / "single" / fname
    target.write_text(text)
    return target


def load_spec(files: dict[str, str], workdir: Path) -> Any:
    """The submission's `harness.candidates.variants.VariantSpec`, through the project's variant
    loader (the one schema for shipped kernels and submissions)."""
    from harness.candidates import variants

    target = materialize(files, workdir)
    try:
        return variants.load_variant(target)
    except variants.VariantError as e:
        # Messages name the file relative to the submission, not the temporary folder.
        raise Rejected(f"manifest: {str(e).replace(str(target.parent) + '/', '')}") from None


def load_candidate(files: dict[str, str], workdir: Path) -> Any:
    """The submission as a `harness.candidates.cuda_candidate.CudaVariant` (GPU workers)."""
    from harness.candidates.cuda_candidate import CudaVariant

    candidate = CudaVariant.from_spec(load_spec(files, workdir))
    candidate.sandboxed_build = True
    return candidate


# --------------------------------------------------------------------------- compile


def build_archs(spec: Any) -> list[str]:
    """The `-arch` of each build target the variant can be built for, or a refusal saying
    that no target reaches the capability it needs."""
    from harness.candidates.nvcc import arch_for, unsupported_reason

    archs = [a for t in BUILD_TARGETS if (a := arch_for(spec, t)) is not None]
    if not archs:
        raise Rejected(f"manifest: the variant {unsupported_reason(spec)}, but submissions "
                       f"are built and scored for {', '.join(BUILD_TARGETS)} only: nothing "
                       f"of it would be compiled or judged")
    return archs


def compile_check(spec: Any, timeout_s: float = COMPILE_TIMEOUT_S,
                  budget: Budget | None = None) -> None:
    """For every build target: what the preprocessor includes and defines
    (`harness.submissions.preprocess`), then an nvcc compile of the full source (header,
    sources, one signature check per entry), both in the sandbox with the build's own
    arch and under the budget's limits; every entry must be in the cubin. No GPU needed.
    Messages come from positions in the submission's own files only."""
    from harness.candidates.sandbox import SandboxUnavailable
    from harness.candidates.sandboxed_compile import compile_spec_sandboxed
    from harness.candidates.variant_spec import header_path
    from harness.submissions.diagnostics import compile_message, entry_check_texts
    from harness.submissions.preprocess import preprocess_check

    budget = budget or Budget()
    header = header_path().read_text()
    # What the compiler may quote besides the submission: the public header and what its
    # entry checks say.
    public = [header, *entry_check_texts(header, spec.entry_names())]
    labels = [label for label, _ in spec.source_texts]
    names = [label.rsplit("/", 1)[-1] for label in labels]
    texts = dict(zip(names, (t for _, t in spec.source_texts), strict=True))
    shown = {**texts, **dict(spec.source_texts)}
    archs = build_archs(spec)
    try:
        why = preprocess_check(spec, archs=archs, budget=budget,
                               timeout_s=min(timeout_s, 60.0))
        if why:
            raise Rejected(why)
        for target in BUILD_TARGETS:
            step = f"the compile for {target}"
            reports = compile_spec_sandboxed(spec, target, budget.seconds_for(step, timeout_s))
            for report in reports:
                if report.ok:
                    continue
                entry = f" ({report.entry})" if report.entry else ""
                if report.message.startswith("nvcc stopped"):
                    if budget.binding:
                        raise budget.exceeded(step)
                    raise Rejected(f"compile failed{entry}: {report.message}")
                if report.message.startswith("entry point missing"):
                    raise Rejected(f"compile failed{entry}: {report.message}")
                raise Rejected(compile_message(report.message, [*labels, *names], shown,
                                               public=public, what=f"compile failed{entry}"))
    except SandboxUnavailable as e:
        raise CannotCheck(f"this machine cannot check submissions: {e}; nothing was "
                          "recorded") from None


# --------------------------------------------------------------------------- validation


def validate(files: dict[str, str], *, compile_timeout_s: float = COMPILE_TIMEOUT_S,
             compile_sources: bool = True, cases: list[Case] | None = None,
             budget: Budget | None = None) -> Validated:
    """Run every check of the module doc within `budget` (by default a fresh
    `harness.submissions.budget.Budget`); raises `Rejected` on the first problem."""
    budget = budget or Budget()
    check_files(files)
    sources = [n for n in files if n.endswith(SOURCE_SUFFIXES)]
    for fname in sources:
        found = find_line_directive(fname, files[fname])
        if found:
            raise Rejected(str(found))
    for fname in sources:
        check_source(fname, files[fname])
    budget.check("the source checks")
    manifest = read_manifest(files)
    check_compile_options(manifest.get("compile_options") or [], str(manifest.get("arch", "")))
    budget.check("reading the manifest")
    workdir = Path(tempfile.mkdtemp(prefix="fa-submit-"))
    try:
        spec = load_spec(files, workdir)
        budget.check("loading the manifest")
        build_archs(spec)
        sup = spec.supports
        if tuple(sup.layouts) != (Layout.DENSE,) or sup.window:
            # The scored grids are dense and windowless: a declared serving layout would
            # be accepted and never judged.
            raise Rejected("manifest: [supports] layouts/window: submissions are scored on "
                           "dense cases without a window; declare layouts = [\"dense\"] "
                           "and no window")
        step = "the launch limits"
        limits = check_launch_limits(
            spec, budget.each(cases if cases is not None else limit_cases(), step))
        if limits["cases_checked"] == 0:
            raise Rejected("the submission supports none of the scoring grids' cases "
                           "(check [supports]: dtypes, head_dims, masks)")
        if spec.backward is not None:
            # The backward is scored too (harness.submissions.scoring_bwd), on the full
            # and perf-bwd grids: its launches are held to the same limits there.
            limits["backward"] = check_launch_limits(
                spec, budget.each(cases if cases is not None else limit_cases(BWD_GRIDS),
                                  f"{step} of the backward"), backward=True)
        if compile_sources:
            compile_check(spec, compile_timeout_s, budget)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Validated(name=manifest["name"], files=files, manifest=manifest,
                     source_hash=source_hash(files), limits=limits)


# --------------------------------------------------------------------------- storing


@dataclass
class SubmitResult:
    id: int
    accepted: bool
    message: str


def store(engine: Any, files: dict[str, str] | None, *, name: str, submitter: str,
          token_id: int | None, validated: Validated | None,
          rejection: str | None = None) -> SubmitResult:
    """Insert the submission: `queued` when validated, else `done`/`rejected`."""
    from harness.records.db.engine import session_factory
    from harness.records.db.models import Submission, utcnow

    ok = validated is not None
    keep = files if files is not None and _within_limits(files) else {}
    row = Submission(
        name=name[:255], submitter=submitter[:255], token_id=token_id,
        source=json.dumps(keep, sort_keys=True),
        manifest=validated.manifest if ok else None,
        source_hash=validated.source_hash if ok else source_hash(keep),
        status="queued" if ok else "done",
        verdict=None if ok else "rejected",
        message=("queued" if ok else rejection),
        detail={"limits": validated.limits} if ok else None,
        attempts=0,
    )
    if not ok:
        row.finished_at = utcnow()
    with session_factory(engine)() as s, s.begin():
        s.add(row)
        s.flush()
        sid = row.id
    return SubmitResult(sid, ok, "queued" if ok else (rejection or "rejected"))


def _within_limits(files: dict[str, str]) -> bool:
    return (len(files) <= MAX_FILES
            and sum(len(t.encode()) for t in files.values()) <= MAX_TOTAL_BYTES)


def submit_files(engine: Any, files: dict[str, str] | None, *, name: str | None,
                 submitter: str, token_id: int | None, rejection: str | None = None,
                 **validate_kw: Any) -> SubmitResult:
    """Validate and store. `rejection` set means packing already failed (files may be None).
    Raises CannotCheck, storing nothing, when this host cannot check a submission at all."""
    validated = None
    if name is not None and not _SUB_NAME_OK.match(name):
        # A display name is shown on the leaderboard and the dashboard: the manifest
        # name's pattern, matched whole; a bad one is recorded under the manifest's name.
        rejection = rejection or (f"display name must be 1..{MAX_NAME_LEN} letters, "
                                  f"digits, '_', '.' or '-' (got {name[:80]!r})")
        name = None
    if rejection is None and files is not None:
        try:
            validated = validate(files, **validate_kw)
        except Rejected as e:
            rejection = str(e)
    display = name or (validated.name if validated else _guess_name(files)) or "unnamed"
    return store(engine, files, name=display, submitter=submitter, token_id=token_id,
                 validated=validated, rejection=rejection)


def _guess_name(files: dict[str, str] | None) -> str | None:
    if not files:
        return None
    try:
        return read_manifest(files)["name"]
    except (Rejected, ValueError, KeyError, RecursionError):
        return None


def default_submitter() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
