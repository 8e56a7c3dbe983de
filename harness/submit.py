"""Kernel submissions: packing, validation before queueing, and storing.

A submission is CUDA source plus a declarative manifest, nothing else: either a variant
folder in the format of `kernels/` (manifest.toml + .cu files) or a single .cu whose
manifest is TOML in a leading `/* fa-harness manifest ... */` comment. No host code from a
submission ever runs; the manifest's sizes are integer expressions parsed by `harness.expr`
(never `eval`).

Everything below is checked here, on any machine (nvcc is enough, no GPU needed), before a
submission may enter the queue. The first problem found rejects it with one message:

1. files: at most `MAX_FILES` plain files, no sub-folders or links, names of letters,
   digits and `._-`, suffixes .cu/.cuh/.toml/.md/.txt, at most `MAX_FILE_BYTES` each and
   `MAX_TOTAL_BYTES` in all (sizes are read from the file system before any content is),
   UTF-8 text without NUL bytes;
2. sources (comments and string literals blanked first, line continuations joined):
   `#include` only of "fa_harness.h"; only ordinary preprocessor directives; no digraph or
   trigraph spellings of `#`; no redefinition of the header's names (FA_*, fa_*, FaParams)
   and no use of the entry-signature check's internals; no device-side launches or device
   runtime calls (dynamic parallelism);
3. the manifest, by the project's variant loader (schema, types, expressions, entries);
4. compile options from a whitelist (no -rdc, -I, -include, no -D of harness names) and
   an `arch` from a short list;
5. launch limits, with every expression evaluated at every case of the full, perf and
   decode grids the variant supports (the largest decides): blocks per launch at most
   `MAX_BLOCKS_PER_LAUNCH`, at most 1024 threads per block, dynamic shared memory at most
   the Hopper opt-in maximum (227 KiB), workspace at most `MAX_WORKSPACE_BYTES`;
6. an nvcc compile of every entry with the entry-signature check, under a time limit.

A rejected submission is stored as status `done`, verdict `rejected`, with the message
(and its source, when the source was within the size limits), so the submitter and the
leaderboard see it; it never enters the queue. Accepted ones are stored `queued`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cases import Case

MAX_FILES = 16
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_TOTAL_BYTES = 2 << 20  # 2 MiB
MAX_BLOCKS_PER_LAUNCH = 1 << 24
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_Y_Z = 65535  # CUDA's limit for gridDim.y and gridDim.z
MAX_SHARED_BYTES = 227 * 1024  # opt-in dynamic shared memory per block on Hopper (sm_90)
MAX_WORKSPACE_BYTES = 16 << 30
COMPILE_TIMEOUT_S = 180.0
MAX_NAME_LEN = 64
SM_COUNT = 132  # H200; used only to size launches that depend on it
MAX_SPLITS = 128

SINGLE_FILE_MARKER = "fa-harness manifest"
MANIFEST_FILE = "manifest.toml"
ALLOWED_SUFFIXES = (".cu", ".cuh", ".toml", ".md", ".txt")
SOURCE_SUFFIXES = (".cu", ".cuh")
ALLOWED_INCLUDES = frozenset({"fa_harness.h"})
ALLOWED_DIRECTIVES = frozenset({"include", "define", "undef", "if", "ifdef", "ifndef", "elif",
                                "else", "endif", "pragma", "error", ""})
ALLOWED_ARCHS = frozenset({"", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
# Compile options a submission may ask for: numerics and register caps, nothing that changes
# what gets linked, included or defined by the harness.
_FLAG_OPTIONS = frozenset({"--use_fast_math", "-use_fast_math", "-lineinfo",
                           "--generate-line-info", "--extra-device-vectorization",
                           "-std=c++17", "--std=c++17", "-std=c++20", "--std=c++20"})
_VALUE_OPTIONS = {
    "ftz": ("true", "false"), "prec-div": ("true", "false"), "prec-sqrt": ("true", "false"),
    "fmad": ("true", "false"),
}
_HARNESS_NAME = re.compile(r"^(FA_|fa_|FaParams\b|__FA)")
_NAME_OK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_SUB_NAME_OK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
# Device runtime (dynamic parallelism) entry points and spellings of a device-side launch.
_DEVICE_RUNTIME = re.compile(
    r"<<<|\bcudaLaunchDevice\b|\bcudaGetParameterBuffer\w*\b|\bcudaLaunchKernel\w*\b|"
    r"\bcudaStream\w+\b|\bcudaDeviceSynchronize\b|\bcudaGraph\w+\b|\bcudaMalloc\w*\b|"
    r"\bcudaMemcpy\w*\b|\bcudaEvent\w+\b")
_CHECK_INTERNALS = re.compile(r"\b(fa_same_type|FA_CHECK_ENTRY)\b")


class Rejected(ValueError):
    """A submission that may not be queued; the message says what is wrong."""


@dataclass
class Validated:
    """A submission that passed every check."""

    name: str
    files: dict[str, str]
    manifest: dict[str, Any]
    source_hash: str
    limits: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- files


def pack_path(path: str | Path) -> dict[str, str]:
    """Read a submission from disk as {filename: text}. Sizes are checked from the file
    system first, so a 50 MB file is refused without being read."""
    p = Path(path)
    if p.is_symlink():
        raise Rejected(f"{p}: symbolic links are not accepted")
    if p.is_file():
        if p.suffix != ".cu":
            raise Rejected(f"{p}: a single-file submission must be a .cu file with a "
                           f"'/* {SINGLE_FILE_MARKER} ... */' header")
        entries = [p]
    elif p.is_dir():
        entries = sorted(p.iterdir())
        if not entries:
            raise Rejected(f"{p}: the folder is empty")
    else:
        raise Rejected(f"{p}: no such file or folder")
    if len(entries) > MAX_FILES:
        raise Rejected(f"{p}: {len(entries)} entries; a submission holds at most {MAX_FILES} files")
    total = 0
    for e in entries:
        if e.is_symlink() or not e.is_file():
            raise Rejected(f"{e.name}: only plain files are accepted (no folders or links)")
        size = e.stat().st_size
        _check_size(e.name, size)
        total += size
    if total > MAX_TOTAL_BYTES:
        raise Rejected(f"submission is {total} bytes in all; the limit is {MAX_TOTAL_BYTES}")
    files: dict[str, str] = {}
    for e in entries:
        files[e.name] = _decode(e.name, e.read_bytes())
    return files


def pack_upload(items: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """{filename: text} from uploaded (name, bytes) pairs (the dashboard's upload)."""
    files: dict[str, str] = {}
    total = 0
    for name, data in items:
        name = Path(name).name
        _check_size(name, len(data))
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise Rejected(f"submission is over {MAX_TOTAL_BYTES} bytes in all")
        if name in files:
            raise Rejected(f"{name}: uploaded twice")
        files[name] = _decode(name, data)
        if len(files) > MAX_FILES:
            raise Rejected(f"a submission holds at most {MAX_FILES} files")
    if not files:
        raise Rejected("no files uploaded")
    return files


def _check_size(name: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise Rejected(f"{name}: {size} bytes; the limit is {MAX_FILE_BYTES} bytes per file")


def _decode(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Rejected(f"{name}: not UTF-8 text (byte {e.start})") from None
    if "\x00" in text:
        raise Rejected(f"{name}: contains NUL bytes (binary files are not accepted)")
    return text


def check_files(files: dict[str, str]) -> None:
    """Names, count and sizes of an already packed submission (uploads and stored jobs go
    through this too, not only `pack_path`)."""
    if not files:
        raise Rejected("the submission holds no files")
    if len(files) > MAX_FILES:
        raise Rejected(f"{len(files)} files; a submission holds at most {MAX_FILES}")
    total = 0
    for name, text in files.items():
        if not _NAME_OK.match(name) or name in (".", ".."):
            raise Rejected(f"{name!r}: file names may hold only letters, digits and ._-")
        if not name.endswith(ALLOWED_SUFFIXES):
            raise Rejected(f"{name}: unexpected file type (allowed: {', '.join(ALLOWED_SUFFIXES)})")
        size = len(text.encode())
        _check_size(name, size)
        total += size
    if total > MAX_TOTAL_BYTES:
        raise Rejected(f"submission is {total} bytes in all; the limit is {MAX_TOTAL_BYTES}")
    sources = [n for n in files if n.endswith(SOURCE_SUFFIXES)]
    if not sources:
        raise Rejected("the submission holds no .cu source")
    if MANIFEST_FILE not in files:
        if len(files) != 1 or not sources[0].endswith(".cu"):
            raise Rejected(f"a folder submission needs a {MANIFEST_FILE}; a single-file one is "
                           f"one .cu with a '/* {SINGLE_FILE_MARKER} ... */' header")
        if not re.match(r"\s*/\*\s*" + re.escape(SINGLE_FILE_MARKER), files[sources[0]]):
            raise Rejected(f"{sources[0]}: a single-file submission must start with a "
                           f"'/* {SINGLE_FILE_MARKER} ... */' comment holding its manifest")


def source_hash(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- sources


def blank_comments_and_strings(text: str) -> str:
    """The source with comments replaced by spaces (newlines kept, so line numbers stay)
    and string/char literal contents blanked, after joining backslash-newline
    continuations the way the preprocessor does (line numbers then count physical lines
    of the joined text; good enough for messages)."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            # Keep the quotes (an #include "x" stays recognisable), blank the contents only
            # for char literals and non-directive strings; directives are read from the
            # original line below.
            out.append(c + " " * max(0, j - i - 2) + (text[j - 1] if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _directives(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, directive name, rest of the line) of every preprocessor directive,
    read from the original text with comments blanked (so the include's quoted name stays)."""
    joined = text.replace("\\\r\n", "").replace("\\\n", "")
    blanked = blank_comments_and_strings(text).splitlines()
    original = joined.splitlines()
    for no, line in enumerate(blanked, 1):
        m = re.match(r"\s*#\s*([A-Za-z_]*)(.*)$", line)
        if m:
            # The directive's arguments from the original line: the blanking hides quoted
            # include names; comments after them do not matter for the checks below.
            orig = original[no - 1] if no - 1 < len(original) else line
            om = re.match(r"\s*#\s*[A-Za-z_]*(.*)$", orig)
            yield no, m.group(1), (om.group(1) if om else m.group(2)).strip()


def check_source(name: str, text: str) -> None:
    """Preprocessor and device-runtime rules for one source file (see the module doc)."""
    code = blank_comments_and_strings(text)
    for bad, what in (("%:", "the digraph %: (a spelling of #)"),
                      ("??=", "the trigraph ??= (a spelling of #)")):
        if bad in code:
            line = code[:code.index(bad)].count("\n") + 1
            raise Rejected(f"{name}:{line}: {what} is not allowed")
    if "_Pragma" in code:
        line = code[:code.index("_Pragma")].count("\n") + 1
        raise Rejected(f"{name}:{line}: _Pragma is not allowed")
    for line, directive, rest in _directives(text):
        where = f"{name}:{line}"
        if directive not in ALLOWED_DIRECTIVES:
            raise Rejected(f"{where}: preprocessor directive #{directive} is not allowed")
        if directive == "include":
            m = re.fullmatch(r'"([^"<>]+)"\s*(//.*|/\*.*)?', rest)
            target = m.group(1) if m else rest
            if not m or target not in ALLOWED_INCLUDES:
                raise Rejected(f"{where}: #include {target} is not allowed "
                               f"(submissions may include only \"fa_harness.h\")")
        elif directive in ("define", "undef"):
            macro = re.match(r"\s*([A-Za-z_]\w*)", rest)
            if macro and _HARNESS_NAME.match(macro.group(1)):
                raise Rejected(f"{where}: #{directive} {macro.group(1)}: the names of "
                               f"fa_harness.h (FA_*, fa_*, FaParams) may not be redefined")
        elif directive == "pragma" and re.match(r"\s*(push_macro|pop_macro)\b", rest):
            raise Rejected(f"{where}: #pragma push_macro/pop_macro is not allowed")
    for pattern, what in ((_CHECK_INTERNALS, "the harness's entry-signature check"),
                          (_DEVICE_RUNTIME, "dynamic parallelism / the device runtime API")):
        m = pattern.search(code)
        if m:
            line = code[:m.start()].count("\n") + 1
            raise Rejected(f"{name}:{line}: {m.group(0)!r}: {what} is not allowed in a "
                           f"submission")


def check_compile_options(options: Iterable[str], arch: str = "") -> None:
    """Only numerics, register caps, the C++ standard and -D of non-harness names."""
    if arch not in ALLOWED_ARCHS:
        raise Rejected(f"manifest arch {arch!r} is not allowed (allowed: "
                       f"{', '.join(sorted(a for a in ALLOWED_ARCHS if a))} or empty)")
    for opt in options:
        if not isinstance(opt, str):
            raise Rejected(f"compile option {opt!r} is not a string")
        if opt in _FLAG_OPTIONS:
            continue
        m = re.fullmatch(r"--?(ftz|prec-div|prec-sqrt|fmad)=(\w+)", opt)
        if m and m.group(2) in _VALUE_OPTIONS[m.group(1)]:
            continue
        if re.fullmatch(r"--?maxrregcount=\d{1,3}", opt):
            continue
        m = re.fullmatch(r"-D([A-Za-z_]\w*)(=[\w.+\-]*)?", opt)
        if m:
            if _HARNESS_NAME.match(m.group(1)):
                raise Rejected(f"compile option {opt}: harness names (FA_*, fa_*, FaParams) "
                               f"may not be defined")
            continue
        if re.match(r"-(rdc|-relocatable-device-code|dc\b|dlink|-device-c)", opt):
            raise Rejected(f"compile option {opt}: relocatable device code (needed for dynamic "
                           f"parallelism) is not allowed")
        raise Rejected(f"compile option {opt!r} is not allowed (allowed: --use_fast_math, "
                       f"-ftz/-prec-div/-prec-sqrt/-fmad=true|false, --maxrregcount=N, "
                       f"-lineinfo, -std=c++17|20, -DNAME[=VALUE] of non-harness names)")


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
    """The submission's `harness.variants.VariantSpec`, through the project's variant
    loader (the one schema for shipped kernels and submissions)."""
    from harness import variants

    target = materialize(files, workdir)
    try:
        return variants.load_variant(target)
    except variants.VariantError as e:
        # Messages name the file relative to the submission, not the temporary folder.
        raise Rejected(f"manifest: {str(e).replace(str(target.parent) + '/', '')}") from None


def load_candidate(files: dict[str, str], workdir: Path) -> Any:
    """The submission as a `harness.cuda_candidate.CudaVariant` (GPU workers)."""
    from harness.cuda_candidate import CudaVariant

    return CudaVariant.from_spec(load_spec(files, workdir))


# --------------------------------------------------------------------------- launch limits


def limit_cases() -> list[Case]:
    """Every case of the grids a submission can be run on (full, perf, decode)."""
    from harness.grids import get_grid

    cases: list[Case] = []
    for grid in ("full", "perf", "decode"):
        cases += get_grid(grid)
    return cases


def check_launch_limits(spec: Any, cases: Iterable[Case]) -> dict[str, Any]:
    """Evaluate the spec's launch and workspace expressions at every case it supports (the
    split count is tried at both extremes when the manifest leaves it to the heuristic).
    Returns the largest values seen and how many cases were checked."""
    from harness.expr import ExprError
    from harness.variants import size_env

    support = spec.to_support()
    splits_options = [spec.num_splits] if spec.num_splits else [1, MAX_SPLITS]
    worst: dict[str, Any] = {"blocks": 0, "threads": 0, "shared_bytes": 0,
                             "workspace_bytes": 0, "case": None, "cases_checked": 0}
    for case in cases:
        if support.reason_unsupported(case) is not None:
            continue
        worst["cases_checked"] += 1
        for splits in splits_options:
            env = size_env(case, num_splits=splits, sm_count=SM_COUNT, tiles=spec.tiles)
            try:
                for li, launch in enumerate(spec.launches):
                    where = f"launch[{li}] ({launch.entry})"
                    grid = [e.evaluate(env) for e in launch.grid]
                    block = [e.evaluate(env) for e in launch.block]
                    _check_launch(where, case, grid, block, launch.shared_mem.evaluate(env),
                                  worst)
                ws_total = 0
                for wi, ws in enumerate(spec.workspaces):
                    n = ws.elements.evaluate(env)
                    if n < 0:
                        raise Rejected(f"workspace[{wi}] ({ws.name}): negative size {n} at "
                                       f"case {case.id}")
                    ws_total += n * ws.itemsize
                    if ws_total > MAX_WORKSPACE_BYTES:
                        raise Rejected(f"workspace[{wi}] ({ws.name}): {ws_total} bytes at "
                                       f"case {case.id} exceed the limit of "
                                       f"{MAX_WORKSPACE_BYTES} bytes")
                worst["workspace_bytes"] = max(worst["workspace_bytes"], ws_total)
            except ExprError as e:
                raise Rejected(f"manifest: {e} (case {case.id})") from None
    return worst


def _check_launch(where: str, case: Case, grid: list[int], block: list[int], shared: int,
                  worst: dict[str, Any]) -> None:
    if any(g < 1 for g in grid) or any(b < 1 for b in block) or len(grid) > 3 or len(block) > 3:
        raise Rejected(f"{where}: grid {grid} / block {block} at case {case.id}: every "
                       f"dimension must be >= 1 and there are at most 3")
    blocks = 1
    for g in grid:
        blocks *= g
    threads = 1
    for b in block:
        threads *= b
    if blocks > MAX_BLOCKS_PER_LAUNCH:
        raise Rejected(f"{where}: {blocks} blocks at case {case.id} exceed the limit of "
                       f"{MAX_BLOCKS_PER_LAUNCH} blocks per launch")
    if any(g > MAX_GRID_Y_Z for g in grid[1:]):
        raise Rejected(f"{where}: grid {grid} at case {case.id}: gridDim.y/z above {MAX_GRID_Y_Z}")
    if threads > MAX_THREADS_PER_BLOCK:
        raise Rejected(f"{where}: block {block} = {threads} threads at case {case.id} exceeds "
                       f"{MAX_THREADS_PER_BLOCK} threads per block")
    if shared < 0 or shared > MAX_SHARED_BYTES:
        raise Rejected(f"{where}: {shared} bytes of shared memory at case {case.id} exceed the "
                       f"device maximum of {MAX_SHARED_BYTES} bytes per block")
    if blocks > worst["blocks"]:
        worst["blocks"], worst["case"] = blocks, case.id
    worst["threads"] = max(worst["threads"], threads)
    worst["shared_bytes"] = max(worst["shared_bytes"], shared)


# --------------------------------------------------------------------------- compile


def compile_check(spec: Any, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
    """nvcc-compile the full source (header, sources, one signature check per entry) for
    sm_90 under a time limit, and require every entry in the cubin; no GPU needed."""
    from harness.compile import compile_spec_nvcc

    for report in compile_spec_nvcc(spec, "sm_90", timeout_s):
        if not report.ok:
            entry = f" ({report.entry})" if report.entry else ""
            raise Rejected(f"compile failed{entry}: {report.message.strip()[:3000]}")


# --------------------------------------------------------------------------- validation


def validate(files: dict[str, str], *, compile_timeout_s: float = COMPILE_TIMEOUT_S,
             compile_sources: bool = True, cases: list[Case] | None = None) -> Validated:
    """Run every check of the module doc; raises `Rejected` on the first problem."""
    check_files(files)
    for fname, text in files.items():
        if fname.endswith(SOURCE_SUFFIXES):
            check_source(fname, text)
    manifest = read_manifest(files)
    check_compile_options(manifest.get("compile_options") or [], str(manifest.get("arch", "")))
    workdir = Path(tempfile.mkdtemp(prefix="fa-submit-"))
    try:
        spec = load_spec(files, workdir)
        limits = check_launch_limits(spec, cases if cases is not None else limit_cases())
        if limits["cases_checked"] == 0:
            raise Rejected("the submission supports none of the scoring grids' cases "
                           "(check [supports]: dtypes, head_dims, masks)")
        if compile_sources:
            compile_check(spec, compile_timeout_s)
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
    from harness.db.engine import session_factory
    from harness.db.models import Submission, utcnow

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
    """Validate and store. `rejection` set means packing already failed (files may be None)."""
    validated = None
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
    except (Rejected, ValueError, KeyError):
        return None


def default_submitter() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
