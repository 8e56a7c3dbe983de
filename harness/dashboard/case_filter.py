"""The case-kind filter of the pages that list cases (Run, Roofline, Compare, Correctness,
History's case picker): memory layout (dense / varlen / paged), sliding window (with /
without) and the case's extras (score modifiers, d_v, FP8 inputs, input distributions, or
none: "plain"), backed by the query parameters `layout=` and `extras=` (comma-separated)
and `window=`.

A database whose cases are all of one kind (every dense, windowless history recorded
before the serving kinds) has nothing to choose: no widget is drawn and every frame passes
through unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st

from harness.dashboard import ui
from harness.dashboard.case_kinds import chosen_ids, present, present_extras, with_extras

ANY = "any"
WINDOW_LABELS = {ANY: "any", "with": "with a window", "without": "without a window"}


@dataclass(frozen=True)
class KindFilter:
    """The chosen case kinds: `ids` the case ids they hold, None when every case passes
    (nothing to choose, or every kind chosen)."""

    ids: frozenset[str] | None = None
    label: str = ""  # the choice in words, for a page's messages
    kinds: pd.DataFrame = field(default_factory=pd.DataFrame, compare=False, hash=False)

    @property
    def active(self) -> bool:
        return self.ids is not None

    def keeps(self, case_id: str) -> bool:
        return self.ids is None or case_id in self.ids

    def apply(self, frame: pd.DataFrame, column: str = "case_id") -> pd.DataFrame:
        """The rows of `frame` whose case is of the chosen kinds (all of them when no kind
        is filtered out)."""
        if self.ids is None or column not in frame:
            return frame
        return frame[frame[column].isin(self.ids)]


def _wanted(key: str, options: list[str], where: Any) -> list[str]:
    raw = [w.strip() for w in (ui.param(key) or "").split(",") if w.strip()]
    unknown = [w for w in raw if w not in options]
    if unknown:
        where.warning(f"`{key}={','.join(unknown)}` from the link: this database holds no "
                      f"such case ({key} here: {', '.join(options)}).")
    return [w for w in raw if w in options] or options


def pick(ctx: Any, where: Any = st) -> KindFilter:
    """The filter's widgets (only for the choices this database offers) and the choice."""
    kinds = ctx.q("case_kinds")
    layouts, windows = present(kinds)
    extras = present_extras(kinds)
    if len(layouts) <= 1 and len(windows) <= 1 and len(extras) <= 1:
        # One kind only: nothing to filter. A link naming a kind this database lacks
        # says so rather than showing every case as if the filter had applied.
        bad = []
        layout_p, window_p = ui.param("layout"), ui.param("window")
        if layout_p and any(w.strip() not in layouts for w in layout_p.split(",") if w.strip()):
            bad.append(f"layout={layout_p}")
        if window_p and window_p not in (ANY, *windows):
            bad.append(f"window={window_p}")
        if bad:
            where.warning(f"`{'&'.join(bad)}` from the link: this database holds only "
                          f"{', '.join(layouts) or 'no'} cases "
                          f"{'with' if windows == ['with'] else 'without'} a sliding window; "
                          "showing every case.")
        return KindFilter(kinds=kinds)
    c1, c2, c3 = where.columns([3, 2, 4])
    chosen_layouts = layouts
    if len(layouts) > 1:
        default = _wanted("layout", layouts, where)
        chosen_layouts = list(c1.multiselect("Case layout", layouts, default=default))
        ui.set_params(layout=None if set(chosen_layouts) == set(layouts)
                      else ",".join(chosen_layouts))
    chosen_extras = extras
    if len(extras) > 1:
        chosen_extras = list(c3.multiselect("Case extras", extras,
                                            default=_wanted("extras", extras, where)))
        ui.set_params(extras=None if set(chosen_extras) == set(extras)
                      else ",".join(chosen_extras))
    chosen_windows = windows
    if len(windows) > 1:
        window = ui.pick("Sliding window", [ANY, *windows], "window",
                         fmt=WINDOW_LABELS.__getitem__, where=c2)
        if window == ANY:
            ui.set_params(window=None)
        else:
            chosen_windows = [str(window)]
    all_extras = set(chosen_extras) == set(extras)
    if set(chosen_layouts) == set(layouts) and set(chosen_windows) == set(windows) \
            and all_extras:
        return KindFilter(kinds=kinds)
    label = (", ".join(chosen_layouts) or "no layout") + (
        "" if set(chosen_windows) == set(windows)
        else f", {WINDOW_LABELS[chosen_windows[0]]}") + (
        "" if all_extras else f", {' or '.join(chosen_extras) or 'no extras'}")
    ids = chosen_ids(kinds, chosen_layouts, chosen_windows)
    if not all_extras:
        ids &= with_extras(kinds, chosen_extras)
    return KindFilter(frozenset(ids), label, kinds)
