"""The gate's markdown summary (a CI job's step summary, and what `fa-harness ci` prints):
verdict and why, the plan and what it left out, load errors, the team's failing cases,
peer divergences, and the comparison with the baseline."""

from __future__ import annotations

from typing import Any

from harness.runs.plan import OVER_BUDGET

MAX_ROWS = 50


def _cell(text: str, n: int = 160) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:n]


def summary_markdown(out: Any) -> str:
    """`out`: a harness.runs.gate.GateOutcome."""
    rec = out.record
    status_counts: dict[str, int] = {}
    for e in rec.results:
        status_counts[e["status"]] = status_counts.get(e["status"], 0) + 1
    code = out.exit_code
    verdict = {0: "passed", 3: "NOT MEASURED"}.get(code, "FAILED")
    reasons = []
    if out.not_measured:
        reasons.append("not measured: " + ", ".join(f"{n} ({w})" for n, w in out.not_measured))
    if out.sanitizer_findings:
        reasons.append(f"{len(out.sanitizer_findings)} sanitizer finding(s)")
    if out.failures:
        reasons.append(f"{len(out.failures)} failing case(s) of the team's candidates")
    if out.load_errors:
        reasons.append(f"{len(out.load_errors)} candidate(s) failed to load")
    if out.regressions:
        c: dict[str, int] = {}
        for v in out.regressions:
            c[v.verdict] = c.get(v.verdict, 0) + 1
        reasons.append("against the baseline: " + ", ".join(f"{k} {n}" for k, n in
                                                             sorted(c.items())))
    lines = [f"## fa-harness CI: {verdict}" + (f" ({'; '.join(reasons)})" if reasons else ""),
             "",
             f"- commit `{(rec.commit or '-')[:12]}` on `{rec.branch or '-'}`, "
             f"GPU `{rec.gpu_model_key}`, grids {', '.join(rec.grids) or '-'}",
             "- results: " + (", ".join(f"{k} {n}" for k, n in sorted(status_counts.items()))
                               or "none"),
             f"- run record `{rec.uuid}`" + (f", stored as run {out.run_id}" if out.run_id
                                              else ", not stored (spooled)"),
             f"- baseline: {out.baseline}"]
    plan = (rec.env or {}).get("ci_plan")
    if plan:
        timed = sum(len(v) for v in plan.get("timed", {}).values())
        took = [f"took {plan.get('wall_s', 0):.0f} s"]
        if plan.get("compile_took_s") is not None:
            took.append(f"warm-up {plan['compile_took_s']:.0f} s")
        if plan.get("correctness_took_s") is not None:
            took.append(f"prepared after {plan['correctness_took_s']:.0f} s")
        over = f" ({OVER_BUDGET})" if plan["estimate_s"] > plan["budget_s"] else ""
        lines.append(f"- plan: budget {plan['budget_s'] / 60:g} min, estimate "
                     f"{plan['estimate_s']:.0f} s{over}, {', '.join(took)}; "
                     f"{timed} timed case(s)")
        for pass_name, key in (("fwd", "minimum"), ("bwd", "minimum_bwd")):
            for k, n in sorted((plan.get(key) or {}).items()):
                got = sum(1 for e in rec.results if e["kernel"] == k and e.get("median_ms")
                          and (e.get("pass") or "fwd") == pass_name)
                label = k if pass_name == "fwd" else f"{k} (bwd)"
                lines.append(f"- owned: {label}: {got} timed case(s) (floor {n})")
        for lo in plan.get("left_out", []):
            lines.append(f"- left out: {lo['kernel']}: {len(lo['cases'])} timing case(s) "
                         f"not timed ({lo['reason']})")
    for n in out.notes:
        lines.append(f"- note: {n}")
    for o in out.sanitizer:
        lines.append(f"- {'FAILED ' if o.failed else ''}{o.line}")
    for p in out.peer_divergences:
        lines.append(f"- {p} (a yardstick: not a failure)")
    moved: dict[str, list[str]] = {}
    for v in out.yardstick_changes:
        moved.setdefault(v.variant, []).append(v.verdict)
    for name, verdicts in sorted(moved.items()):
        lines.append(f"- yardstick {name}: {len(verdicts)} {', '.join(sorted(set(verdicts)))} "
                     "verdict(s) against the baseline (reported, not a failure)")
    lines += alert_lines(out)
    if out.load_errors:
        lines += ["", f"### Load errors ({len(out.load_errors)})", ""]
        lines += [f"- `{_cell(e, 300)}`" for e in out.load_errors]
    fails = out.failures
    if fails:
        lines += ["", f"### Failing results ({len(fails)})", "",
                  "| kernel | case | status | message |", "|---|---|---|---|"]
        for e in fails[:MAX_ROWS]:
            name = e["kernel"] + ("" if (e.get("pass") or "fwd") == "fwd" else " (bwd)")
            lines.append(f"| `{name}` | `{e['case_id']}` | {e['status']} | "
                         f"{_cell(e.get('message') or '')} |")
        if len(fails) > MAX_ROWS:
            lines.append(f"\n... and {len(fails) - MAX_ROWS} more")
    if out.report is not None:
        excused: dict[str, int] = {}
        for v in out.report.verdicts:
            if v.verdict == "missing" and v.detail.get("excused"):
                excused[v.detail["excused"]] = excused.get(v.detail["excused"], 0) + 1
        lines += ["", "### Against the baseline", "", out.report.markdown()]
        for why, n in sorted(excused.items()):
            lines.append(f"- {n} baseline entr{'y' if n == 1 else 'ies'} not in this run: "
                         f"{why} (not a failure)")
        reach = reach_lines(out)
        if reach:
            lines += ["", "### What a slowdown must pass to fail this run", ""] + reach
    return "\n".join(lines) + "\n"


# The bars a case's threshold is counted under in `reach_lines`.
BARS = (0.01, 0.02, 0.05)


def reach_lines(out: Any) -> list[str]:
    """Per team candidate and pass, the thresholds its timed cases were judged against
    (harness.records.verdict_stats where the history knows the noise: the smallest
    slowdown of one case alone that is flagged; 2% and the within-run rules while the
    history is short): how large a slowdown this run could have flagged, case by case,
    the case that needs the most, and the slowdown of the whole candidate that fails. A case whose
    runs spread 3% cannot fail on a 2% slowdown in one run, and the team should know
    which cases those are (docs/regressions.md)."""
    default = out.report.policy.threshold
    per: dict[str, list[tuple[float, bool, str, float | None]]] = {}
    for v in out.report.verdicts:
        if (out._yardstick(v.variant) or v.ratio is None or v.verdict == "missing"
                or v.verdict.startswith("correctness")):
            continue
        per.setdefault(v.label, []).append(
            (float(v.detail.get("threshold", default)), "run_to_run_spread" in v.detail,
             v.case_id, v.detail.get("run_to_run_spread")))
    # A slowdown of every case is judged on the candidate as a whole
    # (harness.records.verdict_stats): its bar, where the history knows its noise.
    wholes = {(c.variant if c.pass_name == "fwd" else f"{c.variant} ({c.pass_name})"): c
              for c in getattr(out.report, "candidates", [])}
    lines = []
    for label, rows in sorted(per.items()):
        n = len(rows)
        counts = [f"<= {bar:.0%}: {sum(t <= bar + 1e-12 for t, *_ in rows)}" for bar in BARS]
        line = f"- `{label}`: {n} timed case(s); threshold {', '.join(counts)}"
        short = sum(not known for _, known, *_ in rows)
        if short:
            line += f"; {short} on this run's samples alone (too little history)"
        t, _, case, spread = max(rows)
        if t > BARS[-1]:
            line += (f"; the widest: {t:.1%} on `{case}`"
                     + (f" (runs spread {spread:.1%})" if spread else ""))
        whole = wholes.get(label)
        if whole is not None:
            line += f"; the whole candidate {whole.bar:.1%} slower"
        lines.append(line)
    return lines


def alert_lines(out: Any) -> list[str]:
    """The open (and acknowledged) alerts of this run's GPU model after this run
    (harness.records.alerts.open_alerts, what the dashboard's Overview lists): the
    team's first; the yardsticks' apart, since they never fail the gate."""
    alerts = getattr(out, "open_alerts", None) or []
    if not alerts:
        return []
    lines = ["", f"### Open alerts on `{out.record.gpu_model_key}` ({len(alerts)})", ""]
    team = [a for a in alerts if a.owned]
    yard = [a for a in alerts if not a.owned]
    lines += [f"- {a.line()}" for a in team[:MAX_ROWS]] or ["- none of the team's"]
    if yard:
        lines += ["", "Yardsticks (reported, never a failure):", ""]
        lines += [f"- {a.line()}" for a in yard[:MAX_ROWS]]
    return lines
