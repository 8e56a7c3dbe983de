"""The counts a manifest may not exceed (harness.candidates.manifest).

A submission's size expressions are evaluated at every case of the scoring grids, and
each list multiplies some work (entries compiled and checked, sources read, options
passed), so no manifest, however legal each field, may make loading or validating it
slow. The shipped kernels use a fraction of each (fa3_wgmma: 5 launches, 18 entries,
about 200 expression terms).
"""

from __future__ import annotations

from harness.candidates.manifest_fields import _Ctx
from harness.candidates.variant_spec import LaunchSpec, SupportSpec

MAX_LAUNCHES = 16  # per pass (forward, backward)
MAX_EXPR_TERMS = 2048  # names, literals, operators and calls of all size expressions
MAX_TILES = 64
MAX_FLAVORS = 16
MAX_COMPILE_OPTIONS = 32
MAX_SOURCES = 16
MAX_ENTRIES = 256  # kernels after {dtype} / {head_dim} expansion


def check_entry_count(ctx: _Ctx, supports: SupportSpec, launches: tuple[LaunchSpec, ...]
                       ) -> None:
    """Every entry is compiled and checked, and listed once (VariantSpec.entry_names):
    dtypes x head dims x launches, bounded before anything expands them."""
    dims = len(supports.head_dims or ()) if any("{head_dim}" in x.entry for x in launches) \
        else 1
    n = len(supports.dtypes) * max(1, dims) * len(launches)
    if n > MAX_ENTRIES:
        raise ctx.fail("launch", f"{n} entry points after expanding {{dtype}} and "
                       f"{{head_dim}}; at most {MAX_ENTRIES}")
