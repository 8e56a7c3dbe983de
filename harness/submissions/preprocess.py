"""What a submission includes, defines and asks of the compiler, as the preprocessor saw it.

The text preprocessed is the text the build compiles (`VariantSpec.full_source()`: the
header inlined, each source after a `#line 1 "its name"`, the entry checks), run by nvcc
itself in the sandbox (`harness.candidates.sandbox`) once per architecture the submission
is built for: `-E` with exactly the build's `-arch` / `-gencode`, standard and options, so
`__CUDA_ARCH__`, an `sm_90a` build's `__CUDA_ARCH_FEAT_SM90_ALL`, `__INCLUDE_LEVEL__` and
every other predefined macro are what the build sees. GCC's `-dI` reports every `#include`
directive processed (as the preprocessor spelled it after line splices and macro
expansion) and `-dD` every `#define` / `#undef` where it happened.

Which output came from which submission file is not read from the output's line markers
(a submission could write its own): each source is wrapped in two `#pragma`s holding a
random nonce (followed by a `#line 1`, so its lines keep their numbers), and everything
between one source's pair is that source's. A source that swallows its closing pragma
(an unterminated comment or `#if`) is refused for it. Within a source:

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
from dataclasses import dataclass, replace

from harness.candidates import sandbox
from harness.candidates.variant_spec import VariantSpec
from harness.submissions.budget import Budget
from harness.submissions.diagnostics import compile_message

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
        where = f"{self.file}:{self.line}" if self.line else self.file  # 0: the whole file
        return f"{where}: {self.what}"


def check_spellings(name: str, text: str) -> Finding | None:
    joined = _SPLICE.sub("", text)
    for pattern, what in _SPELLINGS:
        m = pattern.search(joined)
        if m:
            return Finding(name, joined[:m.start()].count("\n") + 1, f"{what} is not allowed "
                           f"in a submission (not even in a comment)")
    return None


def marked_source(spec: VariantSpec, nonce: str) -> str:
    """The build's source with each submitted text between its two sentinel pragmas."""
    texts = tuple(
        (label, f"#pragma {_sentinel(nonce, 'begin', i)}\n#line 1\n{text}\n"
                f"#pragma {_sentinel(nonce, 'end', i)}")
        for i, (label, text) in enumerate(spec.source_texts))
    return replace(spec, source_texts=texts).full_source()


def _sentinel(nonce: str, what: str, i: int) -> str:
    return f"fa_harness_{nonce}_{what}_{i}"


def _regions(text: str, labels: list[str], nonce: str
             ) -> Iterator[tuple[str, int, str] | Finding]:
    """(source label, line, output line) for every output line between a source's two
    sentinel pragmas, whatever the line markers in between say; a Finding when the
    sentinels are not all there. Line numbers follow the markers, for messages only."""
    begins = {f"#pragma {_sentinel(nonce, 'begin', i)}": i for i in range(len(labels))}
    ends = {f"#pragma {_sentinel(nonce, 'end', i)}": i for i in range(len(labels))}
    seen: list[int] = []
    current: int | None = None
    line = 1
    for raw in text.splitlines():
        key = raw.strip()
        if current is None:
            if key in begins:
                current, line = begins[key], 1
            continue
        if key in ends and ends[key] == current:
            seen.append(current)
            current = None
            continue
        if key in ends or key in begins:
            break  # another source's sentinel: this one ran into what follows it
        yield labels[current], line, raw
        m = _MARKER.match(raw)
        line = int(m.group(1)) if m else line + 1
    if seen != list(range(len(labels))):
        missing = current if current is not None else \
            next(i for i in range(len(labels)) if i not in seen)
        yield Finding(_short(labels[missing]), 0, "does not end where it should for the "
                      "preprocessor (an unterminated comment, #if or line continuation "
                      "runs into what follows it), so it cannot be checked")


def _short(label: str) -> str:
    return label.rsplit("/", 1)[-1]


def check_preprocessed(text: str, labels: list[str], nonce: str) -> Finding | None:
    """The rules of the module doc on one pass's output."""
    for item in _regions(text, labels, nonce):
        if isinstance(item, Finding):
            return item
        label, line, raw = item
        file = _short(label)
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
            if not set(flags) <= {"3", "4"} or path != label:
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


def preprocess_check(spec: VariantSpec, *, archs: list[str], budget: Budget | None = None,
                     timeout_s: float = 60.0) -> str | None:
    """None when the submission `spec` passes for every arch in `archs` (the `-arch`
    values the build uses, `harness.candidates.nvcc.arch_for`), else the one-line (or
    few-line) refusal."""
    labels = [label for label, _ in spec.source_texts]
    texts = {_short(label): text for label, text in spec.source_texts}
    for name, text in texts.items():
        f = check_spellings(name, text)
        if f:
            return str(f)
    from harness.candidates.compile import nvcc_path
    from harness.candidates.nvcc import CXX_STD, arch_flags
    from harness.candidates.variant_spec import header_path

    nvcc = nvcc_path()
    if nvcc is None:
        return "nvcc not found on PATH: the submission cannot be checked here"
    budget = budget or Budget()
    tool = sandbox.toolchain_root(nvcc)
    # Unknown to the submission, so its text cannot pose as a sentinel.
    nonce = secrets.token_hex(16)
    filename = f"{spec.name}.cu"  # the build's (harness.candidates.sandboxed_compile)
    tree = {filename: marked_source(spec, nonce)}
    shown = {**texts, **dict(spec.source_texts)}
    for arch in archs:
        step = f"preprocessing for {arch}"
        for_arch = f" (for {arch})" if len(archs) > 1 else ""
        # The build's own flags (`nvcc -cubin`), with -E: the same single device pass.
        argv = [str(tool / "bin" / "nvcc"), "-E", "-cubin", *arch_flags(arch), CXX_STD,
                "-Xcompiler", "-dD", "-Xcompiler", "-dI", *spec.compile_options,
                "-o", "/out/pp.ii", f"/src/{filename}"]
        res = sandbox.run(argv, sources=tree, toolchain=tool,
                          limits=budget.limits(step, timeout_s, output_bytes=64 << 20),
                          require_isolation=True)
        stopped = budget.stopped(res, step)
        if stopped:
            return str(stopped)
        out = res.files.get("pp.ii")
        if res.returncode != 0 or out is None:
            return compile_message(res.output, [*labels, *texts], shown,
                                   public=[header_path().read_text()],
                                   what=f"preprocessing failed{for_arch}")
        finding = check_preprocessed(out.decode("utf-8", "replace"), labels, nonce)
        if finding:
            return f"{finding}{for_arch}"
    return None
