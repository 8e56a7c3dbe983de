"""A synthetic result history, for the dashboard's tests and its speed benchmark.

Shape: commits x GPUs runs, each holding variants x cases results, plus the comparison
verdicts of every run against its parent commit on the same GPU. The numbers behave like a
real history: each variant has its own efficiency, bigger problems run faster, timing noise
and IQR are a few percent, and a few regressions (a 15% step on the bf16 cases of one
variant, undone later) and one correctness regression (a failing case over a span of
commits) are planted, so every page has something to show.

Rows are written through the models' tables; `bulk=True` switches the two big tables
(results, comparisons) to the driver's fastest path: PostgreSQL COPY, SQLite executemany.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, insert, select, text

from harness.dashboard.schema import Base, CaseRow, Comparison, Result, Run, Variant

# (model key, name, copy GB/s, fp16 matmul TFLOP/s, speed relative to the first)
GPUS: list[tuple[str, str, float, float, float]] = [
    ("NVIDIA H200", "NVIDIA H200", 4240.0, 672.1, 1.00),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 3050.0, 640.0, 0.93),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 1720.0, 275.0, 0.42),
    ("NVIDIA L40S", "NVIDIA L40S", 790.0, 330.0, 0.35),
    ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation", 860.0, 320.0, 0.33),
]

# (name, kind, fraction of matmul peak on a large problem, registers, shared bytes, IO factor)
VARIANTS: list[tuple[str, str, float, int, int, float]] = [
    ("fa2_tc", "cuda", 0.45, 168, 49152, 1.0),
    ("fa2_cuda", "cuda", 0.08, 128, 32768, 1.0),
    ("fa1_cuda", "cuda", 0.06, 122, 32768, 1.6),
    ("naive_cuda", "cuda", 0.02, 40, 0, 12.0),
    ("splitkv", "cuda", 0.30, 96, 16384, 1.1),
    ("sdpa_flash", "peer", 0.48, 0, 0, 1.0),
    ("sdpa_cudnn", "peer", 0.70, 0, 0, 1.0),
    ("sdpa_efficient", "peer", 0.25, 0, 0, 1.0),
    ("torch_naive", "peer", 0.05, 0, 0, 12.0),
    ("reference_cpu", "model", 0.01, 0, 0, 12.0),
]

MASKS = ("none", "causal_br", "causal_tl", "key_padding", "random")
DTYPES = (("float16", "fp16"), ("bfloat16", "bf16"))


@dataclass(frozen=True)
class SynthSpec:
    commits: int = 12
    gpus: int = 2
    variants: int = 4
    cases: int = 6
    branch: str = "main"
    seed: int = 0
    samples: int = 10  # raw timing samples kept per result
    start: datetime = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= len(GPUS):
            raise ValueError(f"gpus must be 1..{len(GPUS)}")
        if self.commits < 1 or self.cases < 1 or self.variants < 1:
            raise ValueError("commits, cases and variants must be >= 1")

    @property
    def results(self) -> int:
        return self.commits * self.gpus * self.variants * self.cases


@dataclass(frozen=True)
class SynthCase:
    case_id: str
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    mask: str

    @property
    def flops(self) -> int:
        full = 4 * self.batch * self.heads * self.seqlen_q * self.seqlen_k * self.head_dim
        return full // 2 if self.mask.startswith("causal") else full

    @property
    def bytes_ideal(self) -> int:
        elems = self.batch * self.heads * self.head_dim * (2 * self.seqlen_q + 2 * self.seqlen_k)
        return 2 * elems


def synth_cases(n: int) -> list[SynthCase]:
    """n distinct cases, ids in the same format as `harness.core.cases.Case.id`."""
    out: list[SynthCase] = []
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 128, 256, 113, 1023):
        for d in (64, 128, 96, 32, 256):
            for dtype, short in DTYPES:
                for mask in MASKS:
                    batch, heads = max(1, 16384 // seq), 2048 // d
                    case_id = f"b{batch}h{heads}-{seq}x{seq}-d{d}-{short}-{mask}"
                    out.append(SynthCase(case_id, batch, heads, seq, seq, d, dtype, mask))
    # Interleave so that a small n still mixes sizes, dtypes and masks.
    order = sorted(range(len(out)), key=lambda i: (i % 7, i))
    if n > len(out):
        raise ValueError(f"at most {len(out)} synthetic cases")
    return [out[i] for i in order[:n]]


def commit_sha(seed: int, index: int) -> str:
    return hashlib.sha1(f"synth-{seed}-{index}".encode()).hexdigest()


def _step(spec: SynthSpec, v: int, c: int, case: SynthCase) -> float:
    """Planted performance steps: variant v loses 15% on bf16 at one commit and regains it
    later; variant 1 loses it at the newest commit (so the latest runs show a regression)."""
    if spec.commits < 8 or case.dtype != "bfloat16":
        return 1.0
    if v == 1:
        return 0.85 if c == spec.commits - 1 else 1.0
    drop = (37 * v + spec.commits // 2) % (spec.commits - 4) + 2
    back = drop + max(2, spec.commits // 10)
    return 0.85 if drop <= c < back else 1.0


def _broken(spec: SynthSpec, v: int, c: int, k: int) -> bool:
    """Planted correctness regression: variant 0, case 1, over a span of commits."""
    if spec.commits < 4 or v != 0 or k != min(1, spec.cases - 1):
        return False
    start = spec.commits * 3 // 4
    return start <= c < start + 2


class _Rows:
    """Generates all rows; results and comparisons stream to keep memory flat."""

    def __init__(self, spec: SynthSpec, ids: dict[str, int]) -> None:
        self.spec = spec
        self.ids = ids
        self.cases = synth_cases(spec.cases)
        self.variants = [VARIANTS[i % len(VARIANTS)] for i in range(spec.variants)]
        self.names = [
            name if i < len(VARIANTS) else f"{name}_{i // len(VARIANTS)}"
            for i, (name, *_rest) in enumerate(self.variants)
        ]

    def run_id(self, c: int, g: int) -> int:
        return self.ids["runs"] + c * self.spec.gpus + g + 1

    def runs(self) -> list[dict[str, Any]]:
        rows = []
        for c in range(self.spec.commits):
            for g in range(self.spec.gpus):
                key, name, copy_gbps, mm, _ = GPUS[g]
                rid = self.run_id(c, g)
                rows.append({
                    "id": rid,
                    "uuid": hashlib.md5(f"run-{self.spec.seed}-{rid}".encode()).hexdigest(),
                    "commit": commit_sha(self.spec.seed, c),
                    "parent_commit": commit_sha(self.spec.seed, c - 1) if c else None,
                    "branch": self.spec.branch,
                    "created_at": self.spec.start + timedelta(hours=6 * c, minutes=7 * g),
                    "source": "ci",
                    "gpu_name": name, "gpu_uuid": f"GPU-synth-{g}", "gpu_model_key": key,
                    "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0",
                    "cupy": "14.2.0", "python": "3.12.3", "hostname": f"runner-{g}",
                    "clocks": {"sm_mhz": 1980, "mem_mhz": 3201},
                    "calibration": {"copy_gbps": copy_gbps, "matmul_tflops_fp16": mm,
                                    "matmul_tflops_bf16": mm * 1.01},
                    "grids": ["synthetic"], "schema_version": 1,
                    "record_sha256": hashlib.sha256(f"{rid}".encode()).hexdigest(),
                    "env": {"synthetic": True},
                })
        return rows

    def variant_rows(self) -> list[dict[str, Any]]:
        return [{"id": self.ids["variants"] + i + 1, "name": self.names[i], "kind": kind,
                 "source_hash": hashlib.sha256(self.names[i].encode()).hexdigest()[:16],
                 "manifest": {"entry": self.names[i], "synthetic": True}}
                for i, (_, kind, *_rest) in enumerate(self.variants)]

    def case_rows(self) -> list[dict[str, Any]]:
        return [{"id": self.ids["cases"] + k + 1, "case_id": cs.case_id, "batch": cs.batch,
                 "heads": cs.heads, "kv_heads": cs.heads, "seqlen_q": cs.seqlen_q,
                 "seqlen_k": cs.seqlen_k, "head_dim": cs.head_dim, "dtype": cs.dtype,
                 "mask": cs.mask, "seed": 0}
                for k, cs in enumerate(self.cases)]

    def _one(self, rng: random.Random, c: int, g: int, v: int, k: int) -> dict[str, Any]:
        spec, cs = self.spec, self.cases[k]
        _, kind, eff, regs, smem, io = self.variants[v]
        size = min(1.0, (cs.seqlen_q * cs.head_dim / (4096 * 128)) ** 0.35)
        tflops_true = GPUS[g][3] * eff * GPUS[g][4] / GPUS[0][4] * max(size, 0.05)
        tflops_true *= _step(spec, v, c, cs)
        median = cs.flops / (tflops_true * 1e9) * (1 + rng.gauss(0, 0.006))
        iqr = median * rng.uniform(0.004, 0.03)
        samples = [round(median * (1 + rng.gauss(0, 0.01)), 6) for _ in range(spec.samples)]
        broken = _broken(spec, v, c, k)
        ratio = rng.uniform(0.25, 1.3) * (4.0 if broken else 1.0)
        base_err = 2.0 ** -10 if cs.dtype == "float16" else 2.0 ** -7
        measured = g == 0 and kind == "cuda"
        bytes_model = int(cs.bytes_ideal * io)
        return {
            "id": self.ids["results"] + ((c * spec.gpus + g) * spec.variants + v) * spec.cases
            + k + 1,
            "run_id": self.run_id(c, g),
            "variant_id": self.ids["variants"] + v + 1,
            "case_pk": self.ids["cases"] + k + 1,
            "status": "failed" if broken else "passed",
            "message": (f"out_err {ratio * base_err:.3e} > 2 x base_err {base_err:.3e}"
                        if broken else ""),
            "out_err": ratio * base_err, "base_err": base_err, "err_ratio": ratio,
            "lse_err": base_err * 0.1,
            "samples_ms": samples, "median_ms": median, "min_ms": min(samples + [median]),
            "iqr_ms": iqr, "rel_noise": iqr / median, "dropped_throttled": 0,
            "tflops": cs.flops / (median * 1e9), "flops": cs.flops,
            "bytes_model": bytes_model, "bytes_ideal": cs.bytes_ideal,
            "bytes_read": int(bytes_model * 0.55) if measured else None,
            "bytes_write": int(cs.bytes_ideal * 0.2) if measured else None,
            "registers": regs or None, "spills": 0 if regs else None,
            "shared_bytes": smem or None, "extra": None,
        }

    def results_and_comparisons(self) -> Iterator[tuple[list[dict[str, Any]],
                                                        list[dict[str, Any]]]]:
        """Per run: its results, and its verdicts against the parent run on the same GPU."""
        spec = self.spec
        rng = random.Random(spec.seed)
        prev: dict[int, list[dict[str, Any]]] = {}
        cid = self.ids["comparisons"]
        for c in range(spec.commits):
            for g in range(spec.gpus):
                res = [self._one(rng, c, g, v, k)
                       for v in range(spec.variants) for k in range(spec.cases)]
                comps: list[dict[str, Any]] = []
                base = prev.get(g)
                if base is not None:
                    when = spec.start + timedelta(hours=6 * c, minutes=7 * g + 3)
                    for i, r in enumerate(res):
                        b = base[i]
                        v, k = divmod(i, spec.cases)
                        ratio = r["median_ms"] / b["median_ms"]
                        if b["status"] == "passed" and r["status"] == "failed":
                            verdict = "correctness_regression"
                        elif b["status"] == "failed" and r["status"] == "passed":
                            verdict = "correctness_fixed"
                        elif ratio > 1.1:
                            verdict = "regression"
                        elif ratio < 1 / 1.1:
                            verdict = "improvement"
                        else:
                            verdict = "inconclusive" if rng.random() < 0.02 else "same"
                        cid += 1
                        comps.append({
                            "id": cid, "run_id": r["run_id"], "base_run_id": b["run_id"],
                            "variant": self.names[v], "case_id": self.cases[k].case_id,
                            "verdict": verdict, "ratio": ratio,
                            "p_value": 1e-4 if verdict in ("regression", "improvement") else 0.4,
                            "detail": None, "created_at": when,
                        })
                prev[g] = res
                yield res, comps


def _next_ids(conn: Connection) -> dict[str, int]:
    out = {}
    for key, model in (("runs", Run), ("variants", Variant), ("cases", CaseRow),
                       ("results", Result), ("comparisons", Comparison)):
        out[key] = int(conn.execute(select(func.coalesce(func.max(model.id), 0))).scalar_one())
    return out


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime):  # the text form SQLAlchemy's SQLite DateTime reads back
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _pg_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _insert(conn: Connection, table: Table, rows: list[dict[str, Any]], bulk: bool) -> None:
    if not rows:
        return
    cols = list(rows[0])
    dialect = conn.dialect.name
    if bulk and dialect == "postgresql":
        raw = conn.connection.driver_connection  # psycopg 3 connection
        names = ", ".join(f'"{c}"' for c in cols)
        with raw.cursor() as cur, cur.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as cp:
            for row in rows:
                cp.write_row([_pg_value(row[c]) for c in cols])
    elif bulk and dialect == "sqlite":
        marks = ", ".join("?" for _ in cols)
        names = ", ".join(f'"{c}"' for c in cols)
        cur = conn.connection.driver_connection.cursor()
        cur.executemany(f'INSERT INTO "{table.name}" ({names}) VALUES ({marks})',
                        [tuple(_sqlite_value(row[c]) for c in cols) for row in rows])
        cur.close()
    else:
        conn.execute(insert(table), rows)


def _chunks(items: Iterable[tuple[list[dict[str, Any]], list[dict[str, Any]]]],
            size: int) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    res: list[dict[str, Any]] = []
    comps: list[dict[str, Any]] = []
    for r, c in items:
        res.extend(r)
        comps.extend(c)
        if len(res) >= size:
            yield res, comps
            res, comps = [], []
    if res:
        yield res, comps


def generate(engine: Engine, spec: SynthSpec, *, create: bool = True, bulk: bool = False,
             analyze: bool = True) -> dict[str, int]:
    """Write the synthetic history into `engine`'s database; returns row counts."""
    if create:
        Base.metadata.create_all(engine)
    counts = {"runs": 0, "results": 0, "comparisons": 0}
    with engine.begin() as conn:
        rows = _Rows(spec, _next_ids(conn))
        runs = rows.runs()
        _insert(conn, Run.__table__, runs, False)
        _insert(conn, Variant.__table__, rows.variant_rows(), False)
        _insert(conn, CaseRow.__table__, rows.case_rows(), False)
        counts["runs"] = len(runs)
        for res, comps in _chunks(rows.results_and_comparisons(), 50_000):
            _insert(conn, Result.__table__, res, bulk)
            _insert(conn, Comparison.__table__, comps, bulk)
            counts["results"] += len(res)
            counts["comparisons"] += len(comps)
        if conn.dialect.name == "postgresql":
            # Explicit ids were written; move the sequences past them.
            for t in ("runs", "variants", "cases", "results", "comparisons"):
                conn.execute(text(
                    f"SELECT setval(pg_get_serial_sequence('{t}', 'id'), "
                    f"(SELECT COALESCE(MAX(id), 1) FROM {t}))"))
    if analyze:
        # Planner statistics, as autovacuum (PostgreSQL) or a maintenance job would keep.
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    return counts
