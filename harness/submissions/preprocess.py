"""What a submission includes, defines and asks of the compiler, as the preprocessor saw it.

The submission's sources are preprocessed by nvcc itself, in the sandbox
(`harness.candidates.sandbox`), as one translation unit: the harness's header from the
sandbox's private folder, then every source, then the entry checks. nvcc runs twice, once as
the host pass and once with `__CUDA_ARCH__` set (the device pass), both with GCC's `-dI`
(every `#include` directive processed, as the preprocessor spelled it after line splices and
macro expansion) and `-dD` (every `#define` / `#undef` where it happened). The line markers
of the output say which file each directive came from, so the rules below are decided from
what the compiler did, not from reading the text:

* a directive `#include` in a submission file must be `#include "fa_harness.h"`, and the
  only file a submission file may enter is the harness's header;
* no `#define` / `#undef` of the header's names (FA_*, fa_*, FaParams, __FA*);
* `#pragma` only `unroll` / `nounroll`;
* no `#line` that names a file (it would pass the submission's lines off as the header's).

The text is still scanned, after the compiler's own line splicing, for the spellings that
ask the file system a question without including anything (`__has_include`,
`#pragma GCC dependency`, `_Pragma`): inside the sandbox they would see only its empty root,
but a kernel has no use for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from harness.candidates import sandbox
from harness.submissions.diagnostics import compile_message

TU_NAME = "fa+tu.cu"  # not a valid submission file name, so it cannot collide
HEADER_NAME = "fa_harness.h"
ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll"})
_HARNESS_NAME = re.compile(r"^(FA_|fa_|FaParams\b|__FA)")
_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d+)*)\s*$')
_DIRECTIVE = re.compile(r"^\s*#\s*(include_next|include|import|define|undef|pragma)\b\s*(.*)$")
# Backslash, optional spaces, newline: GCC joins these lines (and warns about the spaces).
_SPLICE = re.compile(r"\\[ \t\f\v]*\r?\n")
_SPELLINGS = (
    (re.compile(r"__has_include"), "__has_include (a question to the file system)"),
    (re.compile(r"GCC(?:\s|/\*.*?\*/)*dependency", re.S), "#pragma GCC dependency"),
    (re.compile(r"_Pragma"), "_Pragma"),
)


@dataclass
class Finding:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


def check_spellings(name: str, text: str) -> Finding | None:
    joined = _SPLICE.sub("", text)
    for pattern, what in _SPELLINGS:
        m = pattern.search(joined)
        if m:
            return Finding(name, joined[:m.start()].count("\n") + 1, f"{what} is not allowed "
                           f"in a submission (not even in a comment)")
    return None


def translation_unit(sources: list[str], entries: list[str]) -> str:
    lines = [f'#include "{HEADER_NAME}"']
    lines += [f'#include "{s}"' for s in sources]
    lines += [f"FA_CHECK_ENTRY({e});" for e in entries]
    return "\n".join(lines) + "\n"


def _walk(text: str, names: set[str]) -> Iterator[tuple[str, str, int, str]]:
    """(kind, file, line, payload) events of preprocessed output, for submission files only:
    ("enter", line, file entered from it) and ("directive", line, directive text)."""
    stack: list[str] = []
    line = 0
    for raw in text.splitlines():
        m = _MARKER.match(raw)
        if m:
            num, path, flags = int(m.group(1)), m.group(2), m.group(3).split()
            parent = stack[-1] if stack else ""
            if "1" in flags:
                if _base(parent) in names:
                    yield "enter", _base(parent), line, path
                stack.append(path)
            elif "2" in flags:
                while stack and stack[-1] != path:
                    stack.pop()
                if not stack:
                    stack.append(path)
            elif stack:
                if path != stack[-1] and _base(stack[-1]) in names:
                    # `#line N "name"` in a submission file: what follows would be taken
                    # for another file's text (the header's, say) and escape these checks.
                    yield "rename", _base(stack[-1]), line, path
                    return
                stack[-1] = path
            else:
                stack.append(path)
            line = num
            continue
        if stack and _base(stack[-1]) in names and raw.lstrip().startswith("#"):
            yield "directive", _base(stack[-1]), line, raw
        line += 1


def _base(path: str) -> str:
    """A file of the sandbox's source folder by its name ("/src/x.cu" under bubblewrap, the
    private host folder ".../src/x.cu" under the rlimits backend); other paths unchanged."""
    folder, _, name = path.rpartition("/")
    return name if folder == "/src" or folder.endswith("/fa-sandbox-src") else path


def check_preprocessed(text: str, names: set[str]) -> Finding | None:
    """The rules of the module doc on one pass's output."""
    for kind, file, line, payload in _walk(text, names):
        if kind == "rename":
            return Finding(file, line, "#line may not name a file (it would make the "
                           "submission's lines look like another file's)")
        if kind == "enter":
            if _base(payload) != HEADER_NAME:
                return Finding(file, line,
                               'includes a file other than "fa_harness.h" (submissions may '
                               'include only the harness header)')
            continue
        m = _DIRECTIVE.match(payload)
        if not m:
            continue
        directive, rest = m.group(1), m.group(2).strip()
        if directive in ("include", "include_next", "import"):
            if directive != "include" or rest != f'"{HEADER_NAME}"':
                return Finding(file, line, f'#{directive} of something other than '
                               f'"{HEADER_NAME}" is not allowed')
        elif directive in ("define", "undef"):
            macro = re.match(r"([A-Za-z_]\w*)", rest)
            if macro and _HARNESS_NAME.match(macro.group(1)):
                return Finding(file, line, f"#{directive} {macro.group(1)}: the names of "
                               f"fa_harness.h (FA_*, fa_*, FaParams) may not be redefined")
        elif directive == "pragma":
            word = re.match(r"([A-Za-z_]\w{0,63})", rest)
            w = word.group(1) if word else ""
            if w not in ALLOWED_PRAGMAS:
                shown = f" {w}" if w else ""
                return Finding(file, line, f"#pragma{shown} is not allowed (only #pragma "
                               f"unroll / nounroll)")
    return None


def preprocess_check(files: dict[str, str], sources: list[str], entries: list[str],
                     options: list[str], header: str, *, arch: str = "sm_90",
                     timeout_s: float = 60.0) -> str | None:
    """None when the submission passes, else the one-line (or few-line) refusal."""
    for name in sources:
        f = check_spellings(name, files[name])
        if f:
            return str(f)
    from harness.candidates.compile import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        return "nvcc not found on PATH: the submission cannot be checked here"
    tool = sandbox.toolchain_root(nvcc)
    tree = {n: files[n] for n in sources}
    tree[HEADER_NAME] = header
    tree[TU_NAME] = translation_unit(sources, entries)
    names = set(sources)
    cc = arch.removeprefix("sm_").rstrip("a")
    limits = sandbox.Limits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)),
                            memory_bytes=2 << 30, output_bytes=16 << 20)
    for pass_name, extra in (("host", []), ("device", ["-Xcompiler", f"-D__CUDA_ARCH__={cc}0"])):
        argv = [str(tool / "bin" / "nvcc"), "-E", f"-arch={arch}", "-std=c++17",
                "-Xcompiler", "-dD", "-Xcompiler", "-dI", *extra, *options,
                "-o", f"/out/{pass_name}.ii", f"/src/{TU_NAME}"]
        res = sandbox.run(argv, sources=tree, toolchain=tool, limits=limits,
                          require_isolation=True)
        if res.timed_out or res.killed_by:
            return (f"preprocessing stopped: over the {res.killed_by or 'wall clock'} limit "
                    f"of the sandbox")
        out = res.files.get(f"{pass_name}.ii")
        if res.returncode != 0 or out is None:
            return compile_message(res.output, names, what="preprocessing failed")
        finding = check_preprocessed(out.decode("utf-8", "replace"), names)
        if finding:
            return str(finding)
    return None
