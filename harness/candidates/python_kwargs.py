"""The keywords a Python candidate's forward gets beyond q, k and v for the case axes it
declares (harness.candidates.python_candidate's doc): the score modifiers' and the FP8
descales. A kernel declaring none of them is called as before those axes existed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.core.fp8 import DESCALE_NAMES

if TYPE_CHECKING:
    from harness.candidates.python_candidate import PythonKernel
    from harness.core.cases import Case, Inputs


def mod_args(k: PythonKernel, case: Case, inputs: Inputs) -> dict[str, Any]:
    """The score-modifier and FP8 keywords of the forward: only those `k` declares."""
    kw: dict[str, Any] = {}
    if k.softcap:
        kw["softcap"] = case.softcap
    if k.alibi:
        kw["alibi_slopes"] = inputs.alibi_slopes
    if k.sinks:
        kw["sinks"] = inputs.sinks
    if k.fp8 or k.fp8_kv:
        kw.update({name: getattr(inputs, name) for name in DESCALE_NAMES})
        # the case dtype, which an e4m3 q no longer says (the result is in it)
        kw["out_dtype"] = case.torch_dtype
    return kw
