"""What a submission may contain, checked file by file before anything reads it as code:
packing a folder or an upload, the file limits, the source checks and the compile-option
whitelist (steps 1, 2 and 4 of harness.submissions.submit).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

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
# Names are matched whole: \Z, not $, which also matches before a final newline.
_NAME_OK = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_SUB_NAME_OK = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}\Z")
# Device runtime (dynamic parallelism) entry points and spellings of a device-side launch.
_DEVICE_RUNTIME = re.compile(
    r"<<<|\bcudaLaunchDevice\b|\bcudaGetParameterBuffer\w*\b|\bcudaLaunchKernel\w*\b|"
    r"\bcudaStream\w+\b|\bcudaDeviceSynchronize\b|\bcudaGraph\w+\b|\bcudaMalloc\w*\b|"
    r"\bcudaMemcpy\w*\b|\bcudaEvent\w+\b")
_CHECK_INTERNALS = re.compile(r"\b(fa_same_type|FA_CHECK_ENTRY)\b")


class Rejected(ValueError):
    """A submission that may not be queued; the message says what is wrong."""


class CannotCheck(RuntimeError):
    """This host cannot check submissions (no sandbox to compile them in): the host's
    fault, not the submitter's, so nothing is recorded against them and the message says
    what the host lacks."""


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
