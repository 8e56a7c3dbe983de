"""Altair charts: history series with a noise band, roofline, decode bandwidth,
correctness heat map.

Chart builders take small, already aggregated frames (one point per run, or one run's
results) and never query the database themselves.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

RED = "#d62728"
GREEN = "#2ca02c"


def history_frame(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Adds value / band columns: the median, its IQR band, and the best sample (min)."""
    out = df.copy()
    half = out["iqr_ms"].fillna(0) / 2
    lo_ms = (out["median_ms"] - half).clip(lower=out["min_ms"].fillna(0))
    hi_ms = out["median_ms"] + half
    if metric == "tflops":
        flops = out["flops"].astype("float64")
        out["value"] = out["tflops"].where(out["tflops"].notna(),
                                          flops / (out["median_ms"] * 1e9))
        out["band_lo"] = flops / (hi_ms * 1e9)
        out["band_hi"] = flops / (lo_ms * 1e9)
        out["best"] = flops / (out["min_ms"] * 1e9)
    else:
        out["value"] = out["median_ms"]
        out["band_lo"] = lo_ms
        out["band_hi"] = hi_ms
        out["best"] = out["min_ms"]
    out["commit_short"] = out["commit"].fillna("?").str[:10]
    return out


FLAGGED = ("regression", "correctness_regression", "precision_drift")
GOOD = ("improvement", "correctness_fixed")


def _x_commits() -> alt.X:
    """The x axis of a history: one tick per commit in commit order (`label`, from
    commits.in_commit_order: the date of its first run and the short commit), sorted by
    its position `seq` in the browser: a sort list would repeat every label in each
    layer's encoding."""
    return alt.X("label:N", sort=alt.EncodingSortField("seq", op="min"),
                 title="commit (first-parent order; date of first run)",
                 axis=alt.Axis(labelAngle=-40, labelLimit=160, labelOverlap=True))


# The columns a history chart reads (encodings and tooltips): the page's frame carries
# twenty more, and every column sent is parsed by the browser before the first draw.
HISTORY_FIELDS = ["label", "seq", "series", "grid", "commit_short", "when", "run_id", "branch",
                  "status", "value", "band_lo", "band_hi", "best", "median_ms", "iqr_ms",
                  "min_ms", "verdict", "ratio", "href"]


def history_chart(df: pd.DataFrame, metric: str, title: str) -> alt.LayerChart:
    """`df` from history_frame in commit order (commits.in_commit_order: seq, label), plus
    `series` (one line each: variant and GPU, across grids), `grid`, `href` (where a click goes: the run, or
    the Compare of a flagged point's base and new runs), `when` and `verdict`."""
    y_title = "TFLOP/s (median, IQR band)" if metric == "tflops" else "time ms (median, IQR band)"
    x = _x_commits()
    color = alt.Color("series:N", title="variant | GPU",
                      scale=alt.Scale(scheme="category10"),
                      legend=alt.Legend(orient="bottom", labelLimit=400))
    # One dataset for every layer (the verdict marks filter it), with only the fields read,
    # given to the layer: six layers each holding it cost Altair six hashes of its text.
    data = df[[c for c in HISTORY_FIELDS if c in df]]
    base = alt.Chart().encode(x=x)
    y = alt.Y("band_lo:Q", title=y_title, scale=alt.Scale(zero=False))
    band = base.mark_area(opacity=0.2).encode(y=y, y2="band_hi:Q", color=color,
                                              detail="series:N")
    best = base.mark_line(strokeDash=[3, 3], opacity=0.6).encode(y="best:Q", color=color,
                                                                 detail="series:N")
    line = base.mark_line().encode(y="value:Q", color=color, detail="series:N")
    tooltip = [alt.Tooltip("series:N"), alt.Tooltip("grid:N"),
               alt.Tooltip("commit_short:N", title="commit"),
               alt.Tooltip("when:N", title="run time"), alt.Tooltip("run_id:Q", title="run"),
               alt.Tooltip("branch:N"), alt.Tooltip("status:N"),
               alt.Tooltip("value:Q", format=".4g", title=metric),
               alt.Tooltip("median_ms:Q", format=".4g"), alt.Tooltip("iqr_ms:Q", format=".3g"),
               alt.Tooltip("min_ms:Q", format=".4g"), alt.Tooltip("verdict:N"),
               alt.Tooltip("ratio:Q", format=".3f", title="ratio (verdict)")]
    points = base.mark_circle(size=50, cursor="pointer").encode(
        y="value:Q", color=color, href="href:N", tooltip=tooltip)
    marks = base.transform_filter(alt.FieldOneOfPredicate("verdict", list(FLAGGED))).mark_point(
        shape="triangle-down", size=220, color=RED, filled=True, cursor="pointer").encode(
        y="value:Q", href="href:N", tooltip=tooltip)
    goods = base.transform_filter(alt.FieldOneOfPredicate("verdict", list(GOOD))).mark_point(
        shape="triangle-up", size=160, color=GREEN, filled=True, cursor="pointer").encode(
        y="value:Q", href="href:N", tooltip=tooltip)
    chart = alt.layer(band, best, line, points, marks, goods, data=data).properties(height=380)
    return chart.properties(title=title) if title else chart


def err_ratio_chart(df: pd.DataFrame, y: str, title: str, bound: float = 2.0) -> alt.LayerChart:
    """`df` in commit order (seq, label), one line per grid (`grid`)."""
    top = float(df[y].max()) if df[y].notna().any() else bound
    # Only the fields drawn go to the browser.
    data = df[[c for c in ("label", "seq", y, "grid", "run_id", "commit", "when") if c in df]]
    base = alt.Chart(data).encode(x=_x_commits())
    line = base.mark_line(point=True).encode(
        y=alt.Y(f"{y}:Q", title="error ratio (out_err / base_err)",
                scale=alt.Scale(domain=[0, max(bound * 1.25, top * 1.1)])),
        color=alt.Color("grid:N", title="grid"),
        tooltip=["run_id:Q", "commit:N", "grid:N", alt.Tooltip("when:N", title="run time"),
                 alt.Tooltip(f"{y}:Q", format=".3f")])
    rule = alt.Chart(pd.DataFrame({"bound": [bound]})).mark_rule(
        color=RED, strokeDash=[6, 3]).encode(y="bound:Q")
    # Streamlit fits the whole chart, axis labels included, into the height.
    return alt.layer(line, rule).properties(title=title, height=380)


def roofline_chart(points: pd.DataFrame, bw_gbps: float | None,
                   peaks: dict[str, float], title: str) -> alt.LayerChart:
    """points: intensity (FLOP/byte), tflops, variant, case_id. Ceilings:
    min(peak, intensity x bandwidth) for each peak, on log axes."""
    layers: list[alt.Chart] = []
    lo = float(points["intensity"].min()) if len(points) else 1.0
    hi = float(points["intensity"].max()) if len(points) else 1000.0
    lo, hi = max(lo / 4, 1e-3), max(hi * 4, lo * 10)
    if bw_gbps:
        xs = np.logspace(math.log10(lo), math.log10(hi), 120)
        rows = []
        for label, peak in (peaks.items() if peaks else [("memory", math.inf)]):
            for x in xs:
                rows.append({"intensity": x, "ceiling": min(peak, x * bw_gbps / 1000.0),
                             "roof": f"{bw_gbps:,.0f} GB/s, {label} matmul {peak:,.0f} TFLOP/s"
                             if math.isfinite(peak) else f"{bw_gbps:,.0f} GB/s"})
        roof = pd.DataFrame(rows)
        layers.append(alt.Chart(roof).mark_line(color="#555", strokeDash=[4, 2]).encode(
            x="intensity:Q", y="ceiling:Q", detail="roof:N", tooltip=["roof:N"]))
    elif peaks:
        for label, peak in peaks.items():
            layers.append(alt.Chart(pd.DataFrame({"peak": [peak],
                                                  "roof": [f"{label} matmul {peak:,.0f} TFLOP/s"]}))
                          .mark_rule(color="#555", strokeDash=[4, 2])
                          .encode(y="peak:Q", tooltip=["roof:N", "peak:Q"]))
    scatter = alt.Chart(points).mark_circle(size=60, opacity=0.8).encode(
        x=alt.X("intensity:Q", scale=alt.Scale(type="log"),
                title="arithmetic intensity (FLOP / byte)"),
        y=alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="achieved TFLOP/s"),
        color=alt.Color("variant:N"),
        shape=alt.Shape("dtype:N") if "dtype" in points else alt.Undefined,
        tooltip=["variant:N", "case_id:N", alt.Tooltip("tflops:Q", format=".1f"),
                 alt.Tooltip("intensity:Q", format=".1f")])
    layers.append(scatter)
    return alt.layer(*layers).properties(title=title, height=420)


def decode_bandwidth_chart(points: pd.DataFrame, copy_gbps: float | None,
                           title: str) -> alt.LayerChart:
    """points (case_kinds.decode_points): achieved GB/s of each decode-shaped result
    against its KV length, colour by variant, shape by layout (contiguous, paged with its
    page size, varlen), under the runner's copy ceiling."""
    tooltip = ["variant:N", "case_id:N", "layout:N",
               alt.Tooltip("gbps:Q", title="GB/s", format=",.0f"),
               alt.Tooltip("median_ms:Q", title="median ms", format=".4f")]
    if copy_gbps:
        tooltip.append(alt.Tooltip("of_copy:Q", title="of copy ceiling", format=".2f"))
    layers: list[alt.Chart] = [alt.Chart(points).mark_point(size=70, filled=True,
                                                           opacity=0.85).encode(
        x=alt.X("seqlen_k:Q", scale=alt.Scale(type="log"), title="KV length (keys)"),
        y=alt.Y("gbps:Q", title="achieved GB/s"),
        color=alt.Color("variant:N"),
        shape=alt.Shape("layout:N", title="layout"),
        tooltip=tooltip)]
    if copy_gbps:
        layers.append(alt.Chart(pd.DataFrame({
            "copy": [copy_gbps], "roof": [f"copy ceiling {copy_gbps:,.0f} GB/s"]}))
            .mark_rule(color="#555", strokeDash=[4, 2])
            .encode(y="copy:Q", tooltip=["roof:N"]))
    return alt.layer(*layers).properties(title=title, height=380)


def correctness_heatmap(df: pd.DataFrame, bound: float = 2.0) -> alt.Chart:
    """One row per variant, one column per case, coloured by error ratio; a result that
    did not pass is a red cell with a thick black outline, whatever its ratio."""
    # Only the fields drawn go to the browser (a run's results carry thirty columns).
    data = df[["variant", "case_id", "status", "err_ratio", "message"]].assign(
        shown=df["err_ratio"].clip(upper=2 * bound),
        failed=~df["status"].isin(["passed", "skipped"]))
    # A failure without a ratio (crash, timeout) still needs a colour.
    data.loc[data["failed"] & data["shown"].isna(), "shown"] = 2 * bound
    cases = list(dict.fromkeys(data["case_id"]))
    return alt.Chart(data).mark_rect().encode(
        x=alt.X("case_id:N", title=f"case ({len(cases)})", sort=cases,
                axis=alt.Axis(labelAngle=-60, labelLimit=260, labelFontSize=10)),
        y=alt.Y("variant:N", title=None, sort="ascending",
                axis=alt.Axis(labelLimit=240, labelFontSize=12)),
        color=alt.Color("shown:Q", title="error ratio",
                        scale=alt.Scale(domain=[0, bound, 2 * bound],
                                        range=["#2ca02c", "#ffdd57", "#d62728"])),
        stroke=alt.condition("datum.failed", alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition("datum.failed", alt.value(2.5), alt.value(0.5)),
        tooltip=["variant:N", "case_id:N", "status:N",
                 alt.Tooltip("err_ratio:Q", format=".3f"), "message:N"],
    ).properties(height=alt.Step(30))
