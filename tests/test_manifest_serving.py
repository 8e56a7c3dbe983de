"""`[supports] layouts` and `window` in a variant's manifest: parsed, carried into the
candidate's Support (so serving cases run or skip with the reason), bad values named,
and refused in submissions (whose scored grids are dense)."""

from __future__ import annotations

import pytest
from test_manifest_backward import HEAD, KERNEL, _variant  # noqa: I001

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.variants import VariantError, load_variant_dir
from harness.core.cases import Case, Layout, MaskKind

SERVING = HEAD.replace('writes_lse = true\n',
                       'writes_lse = true\nlayouts = ["dense", "varlen"]\nwindow = true\n')


def test_layouts_and_window_reach_the_support(tmp_path):
    cand = CudaVariant.from_spec(load_variant_dir(_variant(tmp_path, SERVING)))
    assert cand.support.layouts == frozenset({Layout.DENSE, Layout.VARLEN})
    assert cand.support.window
    varlen = Case(3, 4, 4, 20, 30, 64, "float16", MaskKind.NONE, layout=Layout.VARLEN)
    paged = Case(3, 4, 4, 1, 30, 64, "float16", MaskKind.NONE, layout=Layout.PAGED,
                 page_size=16)
    assert cand.supports(varlen) is None
    assert cand.supports(paged) == "paged layout not supported"
    dense = CudaVariant.from_spec(load_variant_dir(_variant(tmp_path / "plain", HEAD)))
    windowed = Case(1, 4, 4, 20, 30, 64, "float16", MaskKind.NONE, window_left=4)
    assert dense.supports(windowed) == "sliding window not supported"
    assert dense.supports(varlen) == "varlen layout not supported"


@pytest.mark.parametrize("line, where", [
    ('layouts = ["dense", "ragged"]', "supports.layouts[1]"),
    ('layouts = "varlen"', "supports.layouts"),
    ('window = "yes"', "supports.window"),
])
def test_bad_values_are_named(tmp_path, line, where):
    text = HEAD.replace("writes_lse = true\n", f"writes_lse = true\n{line}\n")
    with pytest.raises(VariantError) as info:
        load_variant_dir(_variant(tmp_path, text))
    assert where in str(info.value) and "\n" not in str(info.value)


def test_a_submission_declaring_serving_kinds_is_refused():
    from harness.submissions.submit import Rejected, validate

    with pytest.raises(Rejected) as info:
        validate({"manifest.toml": SERVING, "v.cu": KERNEL}, compile_sources=False)
    assert "layouts/window" in str(info.value) and "\n" not in str(info.value)
