"""What a submission includes, defines and asks of the compiler, as the preprocessor saw it.

The submission's sources are preprocessed by nvcc itself, in the sandbox
(`harness.candidates.sandbox`), as one translation unit: the harness's header from the
sandbox's private folder, then every source, then the entry checks. nvcc runs once per
architecture the submission is built for (`-E` with exactly the build's `-arch` /
`-gencode`, standard and options, so `__CUDA_ARCH__` and an `sm_90a` build's
`__CUDA_ARCH_FEAT_SM90_ALL` are what the build sees), with GCC's `-dI` (every `#include`
directive processed, as the preprocessor spelled it after line splices and macro
expansion) and `-dD` (every `#define` / `#undef` where it happened).

Which output came from which submission file is not read from the output's line markers
(a submission could write its own): the translation unit puts a `#pragma` holding a
random nonce before and after each source's `#include`, and everything between one
source's pair is that source's. Within it:

* `#include` only of "fa_harness.h" (the header is already in, so nothing is entered:
  any line marker that enters a file, or names another file than the source itself,
  refuses the submission);
* no `#define` / `#undef` of the header's names (FA_*, fa_*, FaParams, __FA*);
* `#pragma` only `unroll` / `nounroll`.

`#line` directives and linemarkers in the text are refused before this, by
`harness.submissions.line_directives`. The text is also scanned, after the compiler's own
line splicing, for the spellings that ask the file system a question without including
anything (`__has_include`, `#pragma GCC dependency`, `_Pragma`): inside the sandbox they
would see only its empty root, but a kernel has no use for them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from harness.candidates import sandbox
from harness.submissions.budget import Budget
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


def translation_unit(sources: list[str], entries: list[str], nonce: str) -> str:
    lines = [f'#include "{HEADER_NAME}"']
    for i, name in enumerate(sources):
        lines += [f"#pragma {_sentinel(nonce, 'begin', i)}", f'#include "{name}"',
                  f"#pragma {_sentinel(nonce, 'end', i)}"]
    lines += [f"FA_CHECK_ENTRY({e});" for e in entries]
    return "\n".join(lines) + "\n"


def _sentinel(nonce: str, what: str, i: int) -> str:
    return f"fa_harness_{nonce}_{what}_{i}"


def _base(path: str) -> str:
    """A file of the sandbox's source folder by its name ("/src/x.cu" under bubblewrap, the
    private host folder ".../src/x.cu" under the rlimits backend); other paths unchanged."""
    folder, _, name = path.rpartition("/")
    return name if folder == "/src" or folder.endswith("/fa-sandbox-src") else path


def _regions(text: str, sources: list[str], nonce: str
             ) -> Iterator[tuple[str, int, str] | Finding]:
    """(source, line, output line) for every output line between a source's two sentinel
    pragmas, whatever the line markers in between say (less the translation unit's own
    lines: its `#include` of the source, the marker entering it and the one returning
    from it); a Finding when the sentinels are not all there. Line numbers follow the
    markers, for messages only."""
    begins = {f"#pragma {_sentinel(nonce, 'begin', i)}": i for i in range(len(sources))}
    ends = {f"#pragma {_sentinel(nonce, 'end', i)}": i for i in range(len(sources))}
    seen: list[int] = []
    current: int | None = None
    region: list[str] = []
    for raw in text.splitlines():
        key = raw.strip()
        if current is None:
            if key in begins:
                current, region = begins[key], []
            continue
        if key not in ends or ends[key] != current:
            region.append(raw)
            continue
        name = sources[current]
        seen.append(current)
        current = None
        lines = _own_lines(region, name)
        line = 1
        for raw_line in lines:
            yield name, line, raw_line
            m = _MARKER.match(raw_line)
            line = int(m.group(1)) if m else line + 1
    if seen != list(range(len(sources))):
        yield Finding(TU_NAME, 0, "the preprocessor's output does not hold every source "
                      "between the harness's markers, so the submission cannot be checked")


def _own_lines(region: list[str], name: str) -> list[str]:
    """A region less the translation unit's lines around the source's own."""
    lo, hi = 0, len(region)
    if lo < hi and region[lo].strip() == f'#include "{name}"':
        lo += 1
    while lo < hi and (m := _MARKER.match(region[lo])) and _base(m.group(2)) == TU_NAME \
            and not m.group(3).split():
        lo += 1
    if lo < hi and (m := _MARKER.match(region[lo])) and _base(m.group(2)) == name \
            and m.group(3).split() == ["1"]:
        lo += 1
    while hi > lo and (m := _MARKER.match(region[hi - 1])) and _base(m.group(2)) == TU_NAME \
            and m.group(3).split() == ["2"]:
        hi -= 1
    return region[lo:hi]


def check_preprocessed(text: str, sources: list[str], nonce: str) -> Finding | None:
    """The rules of the module doc on one pass's output."""
    for item in _regions(text, sources, nonce):
        if isinstance(item, Finding):
            return item
        file, line, raw = item
        marker = _MARKER.match(raw)
        if marker:
            path, flags = marker.group(2), marker.group(3).split()
            if "1" in flags:
                # The header is in before any source, so no `#include` a source may write
                # enters a file: this is another include, or a linemarker posing as one.
                return Finding(file, line, f"the compiler enters another file here (an "
                               f"#include other than \"{HEADER_NAME}\", or a linemarker): "
                               f"submissions may include only the harness header")
            # Flags 3 and 4 on the source's own name: a system header's macro expanded
            # here (GCC marks its tokens so); anything else renames the text.
            if not set(flags) <= {"3", "4"} or _base(path) != file:
                return Finding(file, line, "a #line directive or linemarker makes the "
                               "compiler take the following text for another file's")
            continue
        m = _DIRECTIVE.match(raw)
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
                     options: list[str], header: str, *, archs: list[str],
                     budget: Budget | None = None, timeout_s: float = 60.0) -> str | None:
    """None when the submission passes for every arch in `archs` (the `-arch` values the
    build uses, `harness.candidates.nvcc.arch_for`), else the one-line (or few-line)
    refusal."""
    for name in sources:
        f = check_spellings(name, files[name])
        if f:
            return str(f)
    from harness.candidates.compile import nvcc_path
    from harness.candidates.nvcc import CXX_STD, arch_flags

    nvcc = nvcc_path()
    if nvcc is None:
        return "nvcc not found on PATH: the submission cannot be checked here"
    budget = budget or Budget()
    tool = sandbox.toolchain_root(nvcc)
    # Unknown to the submission, so its text cannot pose as a sentinel.
    nonce = secrets.token_hex(16)
    tree = {n: files[n] for n in sources}
    tree[HEADER_NAME] = header
    tree[TU_NAME] = translation_unit(sources, entries, nonce)
    for arch in archs:
        step = f"preprocessing for {arch}"
        for_arch = f" (for {arch})" if len(archs) > 1 else ""
        # The build's own flags (`nvcc -cubin`, harness.candidates.sandboxed_compile),
        # with -E: the same single device pass, so the same macros are defined.
        argv = [str(tool / "bin" / "nvcc"), "-E", "-cubin", *arch_flags(arch), CXX_STD,
                "-Xcompiler", "-dD", "-Xcompiler", "-dI", *options,
                "-o", "/out/pp.ii", f"/src/{TU_NAME}"]
        res = sandbox.run(argv, sources=tree, toolchain=tool,
                          limits=budget.limits(step, timeout_s, output_bytes=64 << 20),
                          require_isolation=True)
        stopped = budget.stopped(res, step)
        if stopped:
            return str(stopped)
        out = res.files.get("pp.ii")
        if res.returncode != 0 or out is None:
            return compile_message(res.output, set(sources), files, public=[header],
                                   what=f"preprocessing failed{for_arch}")
        finding = check_preprocessed(out.decode("utf-8", "replace"), sources, nonce)
        if finding:
            return f"{finding}{for_arch}"
    return None
