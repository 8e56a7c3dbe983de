"""Altair charts: history series with a noise band, roofline, correctness heat map.

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


def history_chart(df: pd.DataFrame, metric: str, title: str) -> alt.LayerChart:
    """`df` from history_frame, plus `href` (link to the run) and `verdict` (may be None)."""
    y_title = "TFLOP/s (median, IQR band)" if metric == "tflops" else "time ms (median, IQR band)"
    base = alt.Chart(df).encode(x=alt.X("created_at:T", title="run time (UTC)"))
    band = base.mark_area(opacity=0.25, color="#4c78a8").encode(
        y=alt.Y("band_lo:Q", title=y_title, scale=alt.Scale(zero=False)), y2="band_hi:Q")
    best = base.mark_line(strokeDash=[3, 3], color="#9ecae9").encode(y="best:Q")
    line = base.mark_line(color="#4c78a8").encode(y="value:Q")
    tooltip = [alt.Tooltip("commit_short:N", title="commit"), alt.Tooltip("run_id:Q", title="run"),
               alt.Tooltip("branch:N"), alt.Tooltip("status:N"),
               alt.Tooltip("value:Q", format=".4g", title=metric),
               alt.Tooltip("median_ms:Q", format=".4g"), alt.Tooltip("iqr_ms:Q", format=".3g"),
               alt.Tooltip("min_ms:Q", format=".4g"), alt.Tooltip("verdict:N")]
    points = base.mark_circle(size=45, color="#4c78a8", cursor="pointer").encode(
        y="value:Q", href="href:N", tooltip=tooltip)
    flagged = df[df["verdict"].isin(["regression", "correctness_regression", "precision_drift"])]
    better = df[df["verdict"].isin(["improvement", "correctness_fixed"])]
    marks = alt.Chart(flagged).mark_point(shape="triangle-down", size=160, color=RED,
                                          filled=True, cursor="pointer").encode(
        x="created_at:T", y="value:Q", href="href:N", tooltip=tooltip)
    goods = alt.Chart(better).mark_point(shape="triangle-up", size=140, color=GREEN,
                                         filled=True, cursor="pointer").encode(
        x="created_at:T", y="value:Q", href="href:N", tooltip=tooltip)
    return alt.layer(band, best, line, points, marks, goods).properties(title=title, height=380)


def err_ratio_chart(df: pd.DataFrame, y: str, title: str, bound: float = 2.0) -> alt.LayerChart:
    base = alt.Chart(df).encode(x=alt.X("created_at:T", title="run time (UTC)"))
    line = base.mark_line(point=True).encode(
        y=alt.Y(f"{y}:Q", title="error ratio (out_err / base_err)"),
        tooltip=["run_id:Q", "commit:N", alt.Tooltip(f"{y}:Q", format=".3f")])
    rule = alt.Chart(pd.DataFrame({"bound": [bound]})).mark_rule(
        color=RED, strokeDash=[6, 3]).encode(y="bound:Q")
    return alt.layer(line, rule).properties(title=title, height=260)


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
                             "roof": f"{label} ({peak:.0f} TFLOP/s)"
                             if math.isfinite(peak) else f"{bw_gbps:.0f} GB/s"})
        roof = pd.DataFrame(rows)
        layers.append(alt.Chart(roof).mark_line(color="#555", strokeDash=[4, 2]).encode(
            x="intensity:Q", y="ceiling:Q", detail="roof:N", tooltip=["roof:N"]))
    elif peaks:
        for label, peak in peaks.items():
            layers.append(alt.Chart(pd.DataFrame({"peak": [peak], "roof": [label]}))
                          .mark_rule(color="#555", strokeDash=[4, 2])
                          .encode(y="peak:Q", tooltip=["roof:N", "peak:Q"]))
    scatter = alt.Chart(points).mark_circle(size=60, opacity=0.8).encode(
        x=alt.X("intensity:Q", scale=alt.Scale(type="log"),
                title="arithmetic intensity (FLOP / byte)"),
        y=alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="achieved TFLOP/s"),
        color=alt.Color("variant:N"),
        tooltip=["variant:N", "case_id:N", alt.Tooltip("tflops:Q", format=".1f"),
                 alt.Tooltip("intensity:Q", format=".1f")])
    layers.append(scatter)
    return alt.layer(*layers).properties(title=title, height=420)


def correctness_heatmap(df: pd.DataFrame, bound: float = 2.0) -> alt.Chart:
    """variant x case cells coloured by error ratio; failures outlined in red."""
    data = df.assign(shown=df["err_ratio"].clip(upper=2 * bound),
                     failed=~df["status"].isin(["passed", "skipped"]))
    return alt.Chart(data).mark_rect(stroke="white").encode(
        x=alt.X("case_id:N", title="case", sort=None, axis=alt.Axis(labelLimit=220)),
        y=alt.Y("variant:N", title="variant"),
        color=alt.Color("shown:Q", title="error ratio",
                        scale=alt.Scale(domain=[0, bound, 2 * bound],
                                        range=["#2ca02c", "#ffdd57", "#d62728"])),
        strokeWidth=alt.condition("datum.failed", alt.value(2), alt.value(0.5)),
        tooltip=["variant:N", "case_id:N", "status:N",
                 alt.Tooltip("err_ratio:Q", format=".3f"), "message:N"],
    ).properties(height=max(160, 28 * df["variant"].nunique()))
