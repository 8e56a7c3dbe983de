"""The split-KV kernel (kernels/splitkv) on the decode grid: checked, then timed by the
harness's timing method, against SDPA's cuDNN and flash backends, as K/V bytes read per
second. Paged and varlen cases have no SDPA peer: they are compared with the contiguous
case of the same shape. The kernel's two-kernel form (the combine as a second kernel,
`--also two_kernel`, the default) is checked and timed beside the shipped fused form;
`--sweep` also times other variants (pipeline depth, split count, the partial kernel
without its combine) on the longest caches. The grid's e4m3 caches (docs/fp8.md) have no
peer that reads them: their GB/s is set against the same case's 2-byte cache (`/2byte`).

    python bench/splitkv_decode.py [--cases GLOB[,GLOB]] [--sweep] [--json FILE]

GB/s counts the K and V bytes the sequences' query rows can see: B x Hkv x Nk x d x e
twice for a dense or full-length paged cache (e the bytes of an element: 2, or 1 for
e4m3, plus 4 bytes of descale per K row and per V row for per-token descales); the sum
over sequences with a query row for a varlen batch. Ends with one table (the last lines
of the output).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.candidates.cuda_candidate import CudaVariant  # noqa: E402
from harness.candidates.expr import parse_expr  # noqa: E402
from harness.candidates.registry import get_candidate  # noqa: E402
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir  # noqa: E402
from harness.core.cases import Case, Fp8, Layout  # noqa: E402
from harness.core.check import check_case  # noqa: E402
from harness.core.fp8 import stored_bytes  # noqa: E402
from harness.core.grids import decode  # noqa: E402
from harness.core.results import Status  # noqa: E402
from harness.core.serving import sequence_lengths  # noqa: E402
from harness.measure.perf import time_case  # noqa: E402

PEERS = ("sdpa_cudnn", "sdpa_flash")
RULE = {"min_samples": 20, "min_time_s": 0.25, "max_time_s": 3.0}
SWEEP_CASES = ("b1h32k8-1x131072-d128-fp16-none", "b1h32-1x131072-d128-fp16-none",
               "b1h32k8-1x65536-d128-fp16-none", "b1h32-1x65536-d128-fp16-none")
SWEEP = ("splitkv", "two_kernel", "stages2", "stages4", "splits_x2", "splits_half",
         "no_combine")


def kv_bytes(case: Case) -> int:
    _, elem, descale = stored_bytes(case)
    per_key = case.kv_heads * (case.head_dim * elem + descale) * 2  # K and V
    return sum(k for q, k in sequence_lengths(case) if q > 0) * per_key


def dense_twin(case: Case) -> Case:
    return dataclasses.replace(case, layout=Layout.DENSE, page_size=0, full_lengths=False)


def plain_twin(case: Case) -> Case:
    """The same case with its K/V cache in the case dtype."""
    return dataclasses.replace(case, fp8=Fp8.NONE)


def variants() -> dict[str, CudaVariant]:
    """The shipped configuration's neighbours: the combine as a second kernel (and that
    kernel left out, which leaves O unfinished: timing only), other pipeline depths
    (SK_STAGES, with the resident CTAs that shared memory allows), more or fewer splits,
    an e4m3 cache converted by bit moves (SK_E4M3_CVT=0) or with 5 slices in flight."""
    spec = load_variant_dir(KERNELS_ROOT / "splitkv")

    def v(name: str, base=spec, **kw) -> CudaVariant:
        tiles = {**base.tiles, **kw.pop("tiles", {})}
        cand = CudaVariant.from_spec(dataclasses.replace(base, tiles=tiles, **kw))
        cand.name = name
        return cand

    opts = spec.compile_options
    combine = dataclasses.replace(
        spec.launches[0], entry="splitkv_combine_{dtype}_d{head_dim}",
        grid=(parse_expr("batch * heads * seqlen_q * min(num_splits - 1, 1)"),
              parse_expr(1), parse_expr(1)),
        block=(parse_expr(128), parse_expr(1), parse_expr(1)), shared_mem=parse_expr(0))
    two = dataclasses.replace(
        spec, compile_options=tuple(o for o in opts if not o.startswith("-DSK_FUSED_COMBINE")),
        launches=(*spec.launches, combine),
        workspaces=tuple(w for w in spec.workspaces if w.name != "tickets"))
    return {
        "two_kernel": v("two_kernel", two),
        "stages2": v("stages2", compile_options=(*opts, "-DSK_STAGES=2", "-DSK_MIN_BLOCKS=3"),
                     tiles={"stages": 2, "ctas_per_sm": 3}),
        "stages4": v("stages4", compile_options=(*opts, "-DSK_STAGES=4", "-DSK_MIN_BLOCKS=1"),
                     tiles={"stages": 4, "ctas_per_sm": 1}),
        "splits_x2": v("splits_x2", tiles={"ctas_per_sm": 4}),
        "splits_half": v("splits_half", tiles={"ctas_per_sm": 1}),
        "no_combine": v("no_combine", two, launches=two.launches[:-1]),
        # An e4m3 cache's fragments by bit moves and a multiply, not the cvt units.
        "bitcvt": v("bitcvt", compile_options=(*opts, "-DSK_E4M3_CVT=0")),
        # An e4m3 cache with 5 slices in flight per warp (its slices are half the bytes:
        # the shared memory of 3 stages of a 2-byte cache holds 5 and their descales).
        "stages8_5": v("stages8_5", compile_options=(*opts, "-DSK_STAGES8=5")),
    }


def timed(cand, case: Case) -> dict:
    t0 = time.time()
    t = time_case(cand, case, rule=RULE)
    ms = t.median_ms
    return {"median_ms": ms, "min_ms": t.min_ms, "rel_noise": t.rel_noise,
            "gbps": kv_bytes(case) / (ms * 1e-3) / 1e9 if ms else None,
            "wall_s": round(time.time() - t0, 2)}


def copy_ceiling() -> float:
    """Device-to-device copy of 1 GiB, bytes read plus written per second (GB/s)."""
    from harness.measure.timing import StopRule, time_callable

    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src), rule=StopRule(**RULE))
    return 2 * src.numel() * 4 / (t.median_ms * 1e-3) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="*", help="comma-separated globs over case ids")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--also", default="two_kernel",
                    help="variants (see `variants`) checked and timed on every case too")
    ap.add_argument("--json")
    ap.add_argument("--table", metavar="JSON", help="print the table of an earlier --json")
    args = ap.parse_args()
    globs = args.cases.split(",")
    cases = [c for c in decode() if any(fnmatch.fnmatch(c.id, g) for g in globs)]
    also = [n for n in args.also.split(",") if n]
    if args.table:
        rows = json.loads(Path(args.table).read_text())["rows"]
        print_table([c for c in cases if c.id in rows], rows, sweep=True, also=also)
        return 0
    sk = get_candidate("splitkv")
    kernels = [sk] + [variants()[n] for n in also]
    peers = [] if args.no_peers else [get_candidate(n) for n in PEERS]
    rows: dict[str, dict] = {}
    out = {"gpu": torch.cuda.get_device_name(), "rows": rows}

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))

    out["copy_gbps"] = copy_ceiling()
    print(f"copy ceiling: {out['copy_gbps']:.0f} GB/s (read + write)", flush=True)
    # The long caches first, then the sweep, then the short caches: what matters most
    # lands first if the time runs out.
    long = [c for c in cases if c.seqlen_k >= 65536]
    for case in long:
        run_case(kernels, peers, case, rows)
        save()
    if args.sweep:
        sweep(rows, save)
    for case in cases:
        if case not in long:
            run_case(kernels, peers, case, rows)
            save()
    print_table(cases, rows, args.sweep, also)
    return 0


def run_case(cands: list, peers: list, case: Case, rows: dict) -> None:
    """Check, then time, each kernel configuration in `cands` (keyed by name), and the
    peers on the dense cases."""
    row = rows.setdefault(case.id, {"kv_bytes": kv_bytes(case)})
    for cand in cands:
        res = check_case(cand, case, device="cuda")
        row[f"{cand.name}_check"] = res.status.value + (
            "" if res.status is Status.PASSED else f": {res.message[:300]}")
        if res.status is Status.PASSED:
            row[cand.name] = {**timed(cand, case), "splits": cand.meta.get("num_splits")}
    for peer in peers if not case.is_serving and case.fp8 is Fp8.NONE else []:
        try:
            why = peer.supports(case)
            row[peer.name] = {"skip": why} if why else timed(peer, case)
        except Exception as e:  # noqa: BLE001 - a peer's failure is a row, not the end
            row[peer.name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    print(case.id, json.dumps(row), flush=True)
    torch.cuda.empty_cache()


def sweep(rows: dict, save) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, cand in variants().items():
        # two_kernel is timed on every case already; bitcvt and stages8_5 change only the
        # e4m3-cache entries, which the sweep's 2-byte cases never run.
        if name in ("two_kernel", "bitcvt", "stages8_5"):
            continue
        for cid in SWEEP_CASES:
            case = Case.from_id(cid)
            if name != "no_combine":  # the partial kernel alone leaves O unfinished
                res = check_case(cand, case, device="cuda")
                if res.status is not Status.PASSED:
                    rows.setdefault(cid, {})[name] = {"check": res.message[:300]}
                    continue
            r = timed(cand, case)
            r["splits"] = cand.resolve_num_splits(case, sms)
            rows.setdefault(cid, {})[name] = r
            print(cid, name, json.dumps(r), flush=True)
            save()


def _g(row: dict, key: str) -> float | None:
    v = row.get(key)
    return v.get("gbps") if isinstance(v, dict) else None


def print_table(cases: list[Case], rows: dict, sweep: bool, also: list[str]) -> None:
    """The GB/s table; then, for each `--also` variant but the two-kernel form (which
    the table has), its GB/s and its ratio to the shipped kernel's."""
    print(f"\n{'case (GB/s of K/V read)':<46} {'splits':>6} {'splitkv':>8} {'2-kern':>7} "
          f"{'cuDNN':>7} {'flash':>7} {'/cuDNN':>6} {'/flash':>6} {'/dense':>6} "
          f"{'2/cuDNN':>7} {'2/dense':>7} {'/2byte':>6}  check")
    for case in cases:
        row = rows[case.id]
        if "kv_bytes" not in row:
            continue
        s, fu = _g(row, "splitkv"), _g(row, "two_kernel")
        c, f = _g(row, "sdpa_cudnn"), _g(row, "sdpa_flash")
        twin = rows.get(dense_twin(case).id, {}) if case.is_serving else {}
        d, fd = _g(twin, "splitkv"), _g(twin, "two_kernel")
        cud = c if not case.is_serving else _g(twin, "sdpa_cudnn")
        plain = _g(rows.get(plain_twin(case).id, {}), "splitkv") if case.fp8 is not Fp8.NONE else None

        def n(x: float | None) -> str:
            return "-" if x is None else f"{x:.0f}"

        def r(a: float | None, b: float | None) -> str:
            return "-" if a is None or not b else f"{a / b:.2f}"

        checks = ",".join(sorted({str(row.get(k, "")).split(":")[0] for k in row
                                  if k.endswith("_check")}))
        splits = row.get("splitkv", {}).get("splits", "-") if isinstance(row.get("splitkv"),
                                                                          dict) else "-"
        print(f"{case.id:<46} {str(splits):>6} {n(s):>8} {n(fu):>7} {n(c):>7} {n(f):>7} "
              f"{r(s, cud):>6} {r(s, f):>6} {r(s, d):>6} {r(fu, cud):>7} {r(fu, fd):>7} "
              f"{r(s, plain):>6}  {checks}")
    for name in (n for n in also if n != "two_kernel"):
        print(f"\n{'case':<46} {name:>10} {'/splitkv':>8}")
        for case in cases:
            row = rows.get(case.id, {})
            a, s = _g(row, name), _g(row, "splitkv")
            if a is not None:
                print(f"{case.id:<46} {a:>10.0f} {a / s if s else float('nan'):>8.3f}")
    if sweep:
        print(f"\n{'sweep case (GB/s/splits)':<40} " + " ".join(f"{k:>11}" for k in SWEEP))
        for cid in SWEEP_CASES:
            row = rows.get(cid, {})
            if not row:
                continue
            print(f"{cid:<40} " + " ".join(f"{_fmt(row.get(k)):>11}" for k in SWEEP))


def _fmt(v: dict | None) -> str:
    if not isinstance(v, dict) or v.get("gbps") is None:
        return "-"
    return f"{v['gbps']:.0f}/{v.get('splits', '')}" if "splits" in v else f"{v['gbps']:.0f}"


if __name__ == "__main__":
    sys.exit(main())
