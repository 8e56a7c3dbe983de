"""Host cost of one call of a CUDA variant, next to its device time (needs a GPU).

    python bench/launch_overhead.py [--kernels fa2_mma,splitkv] [--uncached] [--json FILE]

For each (variant, case):
- host us/call: a tight loop of `candidate.run` calls enqueued behind the timing method's
  stream hold (harness.measure.timing's flag-spin kernel), so the GPU executes nothing
  while the loop runs and the loop time is host work alone; median of 7 batches of 200
  calls (a batch stays well under CUDA's launch queue depth);
- device us/call: harness.measure.timing (warm mode) of the same call.

`--uncached` turns the per-case launch cache off (`CudaVariant.cache_launches = False`):
every call then plans, compiles-or-looks-up, allocates workspaces and packs FaParams as
the launch path did before the cache existed, so the two runs are the before/after pair.
Target: host <= 30 us per call with the cache. Exit 1 when a cached figure misses it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

CASES = {
    # the shapes of the measurement that motivated the cache: fa2_mma d=128 N=512, splitkv
    # decode (small and long KV)
    "fa2_mma": [(1, 16, 16, 512, 512, 128, "float16", "none"),
                (4, 16, 16, 512, 512, 64, "float16", "causal_br")],
    "splitkv": [(1, 32, 8, 1, 4096, 128, "float16", "none"),
                (8, 32, 8, 1, 32768, 128, "float16", "none")],
    "fa2_simt": [(1, 16, 16, 512, 512, 64, "float16", "none")],
}
TARGET_US = 30.0
BATCH = 200
BATCHES = 7


def host_us_per_call(launch, hold) -> float:
    import torch

    stream = torch.cuda.current_stream()
    per_batch = []
    for _ in range(BATCHES):
        torch.cuda.synchronize()
        hold.engage(stream)
        t0 = time.perf_counter()
        for _ in range(BATCH):
            launch()
        dt = time.perf_counter() - t0
        hold.release()
        torch.cuda.synchronize()
        if hold.expired():
            raise RuntimeError("the stream hold expired during the loop: host cost unknown")
        per_batch.append(dt / BATCH * 1e6)
    return statistics.median(per_batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="fa2_mma,splitkv")
    ap.add_argument("--uncached", action="store_true", help="launch cache off (the before)")
    ap.add_argument("--paths", default="driver",
                    help="launch paths to measure, comma-separated, each case in turn: "
                         "driver (cuLaunchKernel, the default path), cupy (CuPy's launch)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness.candidates.cuda_candidate import CudaVariant
    from harness.candidates.variants import KERNELS_ROOT, load_variant_dir
    from harness.core.cases import Case, MaskKind, make_inputs
    from harness.measure.timing import _StreamHold, time_callable

    hold = _StreamHold(torch.cuda.current_device(), timeout_s=10.0)
    path = "uncached" if args.uncached else "cached"
    rows = []
    for name in [k.strip() for k in args.kernels.split(",") if k.strip()]:
        cand = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / name))
        cand.cache_launches = not args.uncached
        for b, h, hk, nq, nk, d, dt, mask in CASES.get(name, []):
            case = Case(b, h, hk, nq, nk, d, dt, MaskKind(mask))
            inputs = make_inputs(case, "cuda")
            out = torch.empty(b, h, nq, d, dtype=case.torch_dtype, device="cuda")
            lse = torch.empty(b, h, nq, dtype=torch.float32, device="cuda")

            def launch(cand=cand, case=case, inputs=inputs, out=out, lse=lse) -> None:
                cand.run(case, inputs, out, lse)

            for via in [x.strip() for x in args.paths.split(",") if x.strip()]:
                cand.launch_via_driver = via == "driver"
                cand._state = None  # re-plan for this launch path
                for _ in range(5):
                    launch()
                torch.cuda.synchronize()
                host = host_us_per_call(launch, hold)
                dev = time_callable(launch, mode="warm").median_ms * 1e3
                label = f"{path}-{cand.meta.get('launch_path', via)}"
                rows.append({"variant": name, "case": case.id, "path": label,
                             "host_us": round(host, 2), "device_us": round(dev, 2),
                             "host_over_device": round(host / dev, 3) if dev else None})
                print(f"{name:9s} {case.id:36s} {label:15s} host {host:8.1f} us/call   "
                      f"device {dev:8.1f} us/call", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"target_us": TARGET_US, "rows": rows}, indent=1) + "\n")
    if not args.uncached:
        over = [r for r in rows if r["host_us"] > TARGET_US and r["path"].endswith("driver")]
        for r in over:
            print(f"over target: {r['variant']} {r['case']} {r['host_us']} us > {TARGET_US} us")
        return 1 if over else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
