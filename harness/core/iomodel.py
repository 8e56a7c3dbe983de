"""How many HBM bytes each attention algorithm moves, and what that allows on a roofline.

The formulas follow the derivation the project grew from (naive attention with its N x N
intermediates, FlashAttention's tiling, FA1 vs FA2 loop order, split-KV):

- naive_3pass: S = QK^T written, softmax reads S three times (max, sum, normalise) and
  writes P, PV reads P: Q, K, V, O once plus 6 * Nq * Nk score elements.
- naive_fused: the same with a one-pass softmax (S read once): 4 * Nq * Nk.
- fa1 (outer loop over K/V blocks of B_k keys): K and V read once; O, l, m initialised in
  HBM, then for every K/V block, Q, O, m and l are read back and O, m, l written again.
- fa2 (outer loop over Q blocks of B_q rows): Q read once, K and V read once per Q block
  (ceil(Nq / B_q) times), O and LSE written once.
- splitkv: FA2 with the keys split over `splits` programs: each split reads its Q block
  and writes a float32 partial O and partial LSE; a combine reads them back and writes O
  and LSE. One split is plain FA2.
- ideal: Q, K, V, O once (K/V once per K/V head): the floor no exact algorithm beats.

Scores S and P are stored at `tiles["score_bytes"]` bytes per element (default: the input
element size, as in the worked example); O, Q, K, V at the input element size; LSE, m, l
and split partials in float32. For causal masks, FA1/FA2/split-KV skip whole tiles that
lie above the diagonal (K/V rows are counted up to the last visible key of each Q block,
rounded up to B_k; FA1 skips Q blocks that see no key of a K/V block). Key padding and
arbitrary masks are not modelled (every tile is assumed loaded). For GQA, every query
head reads its K/V head's blocks itself (no sharing across the group) except in `ideal`.

Q and K rows are d_qk = `head_dim` wide, V and O rows d_v (`Case.dv`: the same unless the
case's `head_dim_v` says otherwise). Score modifiers move no more than H float32 values (ALiBi slopes, sink logits), read
once per program: not modelled. A softcap is a scalar argument.

FP8 inputs (harness.core.fp8): e4m3 tensors (Q, K, V, or a KV cache's K and V) count 1
byte an element, O stays in the case dtype. Their descales are float32: per-token ones
(kv_token) travel with their K/V rows, 4 bytes more per row read; per-tensor and per-head
ones are read once per (batch, head), "read descales" (3 for q, k, v; 2 for a cache).

Everything is per (batch, head) and summed: `hbm_bytes(algorithm, case, tiles)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.cases import Case
from harness.core.fp8 import Fp8, scalar_descales, stored_bytes

F32 = 4
ALGORITHMS = ("naive_3pass", "naive_fused", "fa1", "fa2", "splitkv", "ideal")
LSE_ALGORITHMS = ("fa1", "fa2", "splitkv")  # the algorithms whose terms write an LSE
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet ceilings: dense fp16/bf16 tensor-core TFLOP/s (without sparsity) and HBM
    TB/s, the L2 size, the device names that identify the part, the datasheet, and the
    dense FP8 (e4m3) tensor-core TFLOP/s (None: no FP8 tensor cores, e.g. the A100)."""

    name: str
    tflops_fp16: float
    hbm_tbps: float
    l2_bytes: int = 0
    device_names: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name()
    source: str = ""
    tflops_fp8: float | None = None

    def peak_tflops(self, case: Case) -> float:
        """The compute ceiling of `case`: FP8's for a case with e4m3 tensors on a GPU with
        FP8 tensor cores, else fp16/bf16's. A KV-cache case (Q in the dtype) gets FP8's
        too: a kernel may quantize Q and run both products in e4m3 (vLLM's FA3 path with
        an FP8 cache does), so fp16's peak would call such an honest kernel impossible.
        Without FP8 tensor cores every e4m3 tile is widened first: fp16's peak."""
        if Fp8(case.fp8) is not Fp8.NONE and self.tflops_fp8:
            return self.tflops_fp8
        return self.tflops_fp16

    @property
    def ridge(self) -> float:
        """FLOP/byte where the roofline turns from bandwidth- to compute-bound."""
        return self.tflops_fp16 / self.hbm_tbps


_H100_DS = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): "
            "SXM 989 TFLOP/s dense FP16/BF16 (1,979 with sparsity), 1,979 dense FP8 "
            "(3,958 with sparsity), 3.35 TB/s; PCIe 756, FP8 1,513 (3,026), 2.0 TB/s; NVL "
            "835, FP8 1,670.5 (3,341), 3.9 TB/s; 50 MB L2")
_H200_DS = ("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): "
            "SXM 989 TFLOP/s dense FP16/BF16 (1,979 with sparsity), 1,979 dense FP8 "
            "(3,958 with sparsity), 4.8 TB/s; NVL 835, FP8 1,670.5 (3,341), 4.8 TB/s; "
            "50 MB L2 (Hopper architecture whitepaper)")
_A100_DS = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100): "
            "312 TFLOP/s dense FP16/BF16 (624 with sparsity); 80GB SXM 2,039 GB/s, 80GB PCIe "
            "1,935 GB/s, 40GB 1,555 GB/s; 40 MB L2 (Ampere architecture whitepaper)")
_MB = 1024 * 1024

# Ordered: the first entry whose device name occurs in the GPU's name applies, so the
# more specific names (NVL, PCIe, 40GB) come before the plain ones. Hopper's dense FP8
# peak is twice its fp16 one (the H200 has the H100 SXM's compute); the A100 has no FP8
# tensor cores.
GPU_SPECS: dict[str, GpuSpec] = {
    s.name: s for s in (
        GpuSpec("h200-nvl", 835.0, 4.8, 50 * _MB, ("H200 NVL",), _H200_DS, 1670.5),
        GpuSpec("h200", 989.0, 4.8, 50 * _MB, ("H200",), _H200_DS, 1979.0),
        GpuSpec("h100-nvl", 835.0, 3.9, 50 * _MB, ("H100 NVL",), _H100_DS, 1670.5),
        GpuSpec("h100-pcie", 756.0, 2.0, 50 * _MB, ("H100 PCIe",), _H100_DS, 1513.0),
        GpuSpec("h100-sxm", 989.0, 3.35, 50 * _MB, ("H100 80GB HBM3", "H100 SXM"), _H100_DS,
                1979.0),
        GpuSpec("a100-80gb-pcie", 312.0, 1.935, 40 * _MB, ("A100 80GB PCIe",), _A100_DS),
        GpuSpec("a100-40gb", 312.0, 1.555, 40 * _MB, ("A100-SXM4-40GB", "A100-PCIE-40GB"),
                _A100_DS),
        GpuSpec("a100-80gb-sxm", 312.0, 2.039, 40 * _MB, ("A100-SXM4-80GB", "A100 80GB"),
                _A100_DS),
    )
}


def datasheet_for(device_name: str) -> GpuSpec | None:
    """The datasheet entry of a GPU named `device_name` (as CUDA reports it), or None."""
    for spec in GPU_SPECS.values():
        if any(n.lower() in device_name.lower() for n in spec.device_names):
            return spec
    return None


@dataclass(frozen=True)
class Ceilings:
    """Ceilings measured on a runner (harness.measure.calibrate): device copy bandwidth (read +
    write bytes per second, in GB/s) and large fp16 matmul throughput (TFLOP/s)."""

    copy_gbps: float
    matmul_tflops: float

    @classmethod
    def from_dict(cls, d: dict) -> Ceilings:
        try:
            return cls(float(d["copy_gbps"]), float(d["matmul_tflops"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"calibration needs numeric copy_gbps and matmul_tflops: {e}") from e

    def as_spec(self, name: str = "measured") -> GpuSpec:
        return GpuSpec(name, self.matmul_tflops, self.copy_gbps / 1000.0)


def elem_bytes(case: Case) -> int:
    return case.torch_dtype.itemsize


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_param(tiles: dict | None, key: str, default: int) -> int:
    value = int((tiles or {}).get(key, default))
    if value < 1:
        raise ValueError(f"tile {key} must be >= 1, got {value}")
    return value


def _causal_offset(case: Case) -> int | None:
    return case.causal_offset if case.mask.is_causal else None


def _kv_rows_per_q_block(case: Case, block_q: int, block_k: int) -> int:
    """K (or V) rows one (b, h) loads over all its Q blocks: every key for a non-causal
    case; for causal, up to the last visible key of the block, rounded up to B_k; under
    a window, from the first visible key's block to the last's."""
    nq, nk = case.seqlen_q, case.seqlen_k
    if case.has_window:
        return _window_kv_rows(case, block_q, block_k)
    offset = _causal_offset(case)
    total = 0
    for r0 in range(0, nq, block_q):
        r1 = min(r0 + block_q, nq)
        end = nk if offset is None else max(0, min(nk, r1 + offset))
        total += min(nk, _ceil_div(end, block_k) * block_k)
    return total


def _window_kv_rows(case: Case, block_q: int, block_k: int) -> int:
    from harness.core.serving import intervals

    nq, nk = case.seqlen_q, case.seqlen_k
    lo, hi = intervals(case, nq, nk)
    total = 0
    for r0 in range(0, nq, block_q):
        blo, bhi = lo[r0:r0 + block_q], hi[r0:r0 + block_q]
        seen = bhi > blo
        if not bool(seen.any()):
            continue
        first = (int(blo[seen].min()) // block_k) * block_k
        last = min(nk, _ceil_div(int(bhi[seen].max()), block_k) * block_k)
        total += last - first
    return total


def q_rows_per_kv_block(case: Case, block_q: int, block_k: int) -> int:
    """Q rows re-visited over all K/V blocks: every Q block for each K/V block; for causal,
    only Q blocks with some row that sees a key of the K/V block."""
    nq, nk = case.seqlen_q, case.seqlen_k
    offset = _causal_offset(case)
    total = 0
    for c0 in range(0, nk, block_k):
        if offset is None:
            total += nq
            continue
        first_row = max(0, c0 - offset)  # the first row i with c0 <= i + offset
        if first_row >= nq:
            continue
        total += nq - (first_row // block_q) * block_q
    return total


def _per_sequence(algorithm: str, case: Case, tiles: dict | None) -> dict[str, int]:
    """A varlen or paged case: the sum over its sequences, each a dense problem of its
    own lengths (only what each sequence touches; an empty cache writes its zero rows)."""
    import dataclasses

    from harness.core.serving import Layout, sequence_lengths

    total: dict[str, int] = {}
    for q_len, k_len in sequence_lengths(case):
        if not q_len:
            continue
        if not k_len:  # nothing to read: zero rows of O, and -inf LSE where it is written
            terms = {"write O": case.heads * q_len * case.dv * elem_bytes(case)}
            if algorithm in LSE_ALGORITHMS:
                terms["write LSE"] = case.heads * q_len * F32
        else:
            sub = dataclasses.replace(case, batch=1, seqlen_q=q_len, seqlen_k=k_len,
                                      layout=Layout.DENSE, page_size=0, full_lengths=False)
            terms = hbm_breakdown(algorithm, sub, tiles)
        for k, v in terms.items():
            total[k] = total.get(k, 0) + v
    return total


def hbm_breakdown(algorithm: str, case: Case, tiles: dict | None = None) -> dict[str, int]:
    """Bytes per term ("read Q", "write S", ...), summed over batch and heads. Windows
    count the key blocks a row block sees; serving layouts sum their sequences. The
    naive algorithms materialise every score under a window too."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if case.is_serving:
        return _per_sequence(algorithm, case, tiles)
    e = elem_bytes(case)
    # Q and K/V as stored (1 byte for e4m3, rs: a per-token descale's bytes per K/V row).
    eq, ekv, rs = stored_bytes(case)
    # d (d_qk) for Q and K, dv (d_v) for V and O: the same unless head_dim_v says.
    nq, nk, d, dv = case.seqlen_q, case.seqlen_k, case.head_dim, case.dv
    bh, bhkv = case.batch * case.heads, case.batch * case.kv_heads
    q_bytes, o_bytes = nq * d * eq, nq * dv * e
    k_row, v_row = d * ekv + rs, dv * ekv + rs
    kv_bytes, v_bytes = nk * k_row, nk * v_row
    descales = {"read descales": bh * scalar_descales(case) * F32} if scalar_descales(
        case) else {}
    terms: dict[str, int] = {}
    if algorithm in ("naive_3pass", "naive_fused"):
        sb = tile_param(tiles, "score_bytes", e)
        score = nq * nk * sb
        terms = {"read Q": q_bytes, "read K": kv_bytes, "write S": score,
                 "read S": (3 if algorithm == "naive_3pass" else 1) * score,
                 "write P": score, "read P": score, "read V": v_bytes, "write O": o_bytes}
        return {k: bh * v for k, v in terms.items()} | descales
    if algorithm == "ideal":
        if case.has_window:  # only the keys some row sees
            from harness.core.serving import keys_touched

            keys = keys_touched(case, nq, nk)
            kv_bytes, v_bytes = keys * k_row, keys * v_row
        return {"read Q": bh * q_bytes, "read K": bhkv * kv_bytes, "read V": bhkv * v_bytes,
                "write O": bh * o_bytes} | descales
    bq = tile_param(tiles, "block_q", DEFAULT_BLOCK_Q)
    bk = tile_param(tiles, "block_k", DEFAULT_BLOCK_K)
    if algorithm == "fa1":
        q_rows = q_rows_per_kv_block(case, bq, bk)
        # O lives in HBM between outer iterations (in float32 when acc_bytes = 4, as FA1's
        # own code kept it); a final pass reads it with m and l, writes O in the input
        # dtype and the LSE.
        acc = tile_param(tiles, "acc_bytes", e)
        terms = {
            "read K": kv_bytes, "read V": v_bytes,
            # initialisation, once per visit, then the final O in the input dtype
            "write O": nq * dv * acc + q_rows * dv * acc + o_bytes,
            "write m,l": 2 * nq * F32 + q_rows * 2 * F32,
            "read Q": q_rows * d * eq, "read O": q_rows * dv * acc + nq * dv * acc,
            "read m,l": q_rows * 2 * F32 + 2 * nq * F32,
            "write LSE": nq * F32,
        }
        return {k: bh * v for k, v in terms.items()} | descales
    kv_rows = _kv_rows_per_q_block(case, bq, bk)
    terms = {"read Q": q_bytes, "read K": kv_rows * k_row, "read V": kv_rows * v_row,
             "write O": o_bytes, "write LSE": nq * F32}
    # A kernel whose blocks serve every query head of a GQA group (tile kv_per_group = 1)
    # reads each K/V row once per group: the K/V terms are per K/V head, not per head.
    kv_share = case.group_size if int((tiles or {}).get("kv_per_group", 0)) else 1
    if algorithm == "splitkv":
        splits = tile_param(tiles, "splits", 1)
        if splits > 1:
            terms["read Q"] = splits * q_bytes
            partial = splits * nq * (dv + 1) * F32  # partial O and partial LSE, float32
            terms["write partials"] = partial
            terms["read partials"] = partial
    return {k: bh * v // (kv_share if k in ("read K", "read V") else 1)
            for k, v in terms.items()} | descales


def hbm_bytes(algorithm: str, case: Case, tiles: dict | None = None) -> int:
    """Total HBM bytes `algorithm` moves for `case` with the given tile sizes."""
    return sum(hbm_breakdown(algorithm, case, tiles).values())


def ideal_bytes(case: Case) -> int:
    return hbm_bytes("ideal", case)


def arithmetic_intensity(flops: int | float, nbytes: int | float) -> float:
    """FLOP per byte of HBM traffic."""
    return float(flops) / float(nbytes) if nbytes else float("inf")


def roofline_tflops(intensity: float, spec: GpuSpec | Ceilings) -> float:
    """Attainable TFLOP/s at `intensity`: min(peak compute, intensity x bandwidth)."""
    if isinstance(spec, Ceilings):
        spec = spec.as_spec()
    return min(spec.tflops_fp16, intensity * spec.hbm_tbps)


def roofline_floor_ms(flops: int | float, nbytes: int | float, spec: GpuSpec | Ceilings,
                      case: Case | None = None) -> float:
    """The least time any kernel needs to do `flops` and move `nbytes` on `spec`
    (ms). Measurements below this floor are physically impossible (status invalid). With
    `case`, the compute ceiling is the peak of its input precision (`GpuSpec.peak_tflops`:
    FP8's for e4m3 inputs); without, fp16/bf16's."""
    if isinstance(spec, Ceilings):
        spec = spec.as_spec()
    peak = spec.tflops_fp16 if case is None else spec.peak_tflops(case)
    return max(flops / (peak * 1e12), nbytes / (spec.hbm_tbps * 1e12)) * 1e3


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPU_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPU_SPECS)}") from None
