"""`CudaVariant`: a kernel variant from `kernels/` as a harness candidate.

`run` compiles (cached), allocates the manifest's workspaces, resolves num_splits,
evaluates grid/block/shared memory, refuses launches the device cannot take (with a
message, before launching anything) and launches each entry in order on torch's current
stream: through the driver's cuLaunchKernel with precomputed arguments, or CuPy's own
launch where that is unavailable (harness.candidates.launch_state). cupy is imported
only inside `run`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.candidates.launch_state import (
    MAX_CACHED_PARAM_SETS,
    CaseState,
    DeviceLimits,
    PlannedLaunch,
    PreparedParams,
    aligned_for_vector_loads,
    cupy_module,
    cupy_stream,
    device_limits,
    function_ptr,
    param_sources,
    tensor_key,
)
from harness.candidates.nvcc import arch_for, unsupported_reason
from harness.candidates.params import build_params
from harness.candidates.tensor_map import Box, TensorMapError, device_maps
from harness.candidates.variants import LoadError, VariantSpec, load_specs, size_env
from harness.core.candidate import Candidate
from harness.core.cases import Case, GradInputs, Inputs
from harness.core.fp8 import stored_bytes

WORKSPACE_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                          "bfloat16": torch.bfloat16, "int32": torch.int32}
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
H200_SMS = 132  # used only when no device is present (planning on the CPU)


class LaunchRefused(RuntimeError):
    """A launch the device cannot take (grid, block or shared memory over its limits)."""


class CudaLaunchError(RuntimeError):
    """CUDA reported an error for one of the variant's launches."""


@dataclass
class CudaVariant(Candidate):
    spec: VariantSpec | None = None
    # Synchronize after the launches so an asynchronous fault is attributed to this
    # variant here. Off by default: a host sync inside a timed call would add its latency
    # to the measurement; correctness callers may turn it on.
    sync_after_run: bool = False
    # The per-case launch cache (see `run`); off only to measure what it saves
    # (bench/launch_overhead.py --uncached).
    cache_launches: bool = True
    # cuLaunchKernel with precomputed arguments (see `_new_state`); off only to measure
    # CuPy's own launch path (bench/launch_overhead.py --paths driver,cupy).
    launch_via_driver: bool = True
    _state: Any = field(default=None, init=False, repr=False, compare=False)
    # Untrusted source (submissions): build with nvcc in harness.candidates.sandbox and load
    # the cubin, instead of NVRTC inside this process.
    sandboxed_build: bool = False
    # This object launches the manifest's `[backward]` (the sibling `run_backward` uses):
    # the same module, its own launches, workspaces and launch cache.
    backward_pass: bool = False
    _bwd: Any = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_spec(cls, spec: VariantSpec) -> CudaVariant:
        tiles = dict(spec.tiles)
        if spec.num_splits is not None:
            tiles["num_splits"] = spec.num_splits
        return cls(
            name=spec.name, kind="cuda", device="cuda", algorithm=spec.algorithm,
            support=spec.to_support(), description=spec.description, isolate=True,
            tiles=tiles,
            meta={
                "source_hash": spec.source_hash,
                "manifest": spec.raw,
                "manifest_path": str(spec.manifest_path),
                "entries": spec.entry_names(),
                "resources": {},
                "timing": spec.timing,
                "timing_max_seqlen": spec.timing_max_seqlen,
                "timing_min": spec.timing_min,
                "timing_cases": spec.timing_cases,
            },
            spec=spec,
        )

    # --- support ------------------------------------------------------------------------
    def supports(self, case: Case) -> str | None:
        reason = super().supports(case)
        if reason is not None:
            return reason
        assert self.spec is not None
        if self.spec.supports.head_dims is None and case.head_dim > self.spec.supports.max_head_dim:
            return f"head_dim {case.head_dim} > {self.spec.supports.max_head_dim}"
        if torch.cuda.is_available():
            cc = torch.cuda.get_device_capability()
            if arch_for(self.spec, f"sm_{cc[0]}{cc[1]}") is None:
                return f"{unsupported_reason(self.spec)}, device has {cc[0]}.{cc[1]}"
        return None

    # --- planning (pure Python: testable without a GPU) --------------------------------
    def tiles_for(self, case: Case, sm_count: int | None = None) -> dict[str, int]:
        """The manifest's tiles with the split count resolved for `case` (the IO model's
        "splits"); the SM count is the current device's, or 132 (H100/H200) without one."""
        if self.spec is None or self.spec.num_splits is None:
            return dict(self.tiles)
        if sm_count is None:
            sm_count = 132
            try:
                import torch

                if torch.cuda.is_available():
                    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
            except Exception:  # no device: the nominal count is only for the byte model
                pass
        return {**self.tiles, "splits": self.resolve_num_splits(case, sm_count)}

    def resolve_num_splits(self, case: Case, sm_count: int) -> int:
        """1 for variants without split-KV; the manifest's value when > 0; else the
        heuristic (harness.candidates.split_heuristic), counting one CTA per (sequence,
        kv head, row block) per split since this project's split kernels process a whole
        GQA group per CTA, and `ctas_per_sm` resident CTAs per SM."""
        assert self.spec is not None
        n = self.spec.num_splits
        if n is None:
            return 1
        if n > 0:
            return n
        from harness.candidates.split_heuristic import choose_splits, splitkv_work

        tiles = self.spec.tiles
        block_rows = tiles.get("block_rows", tiles.get("block_q", 64))
        work = splitkv_work(case, block_rows, tiles.get("block_k", 64))
        return choose_splits(work, sm_count * tiles.get("ctas_per_sm", 1))

    def env(self, case: Case, *, num_splits: int, sm_count: int) -> dict[str, int]:
        assert self.spec is not None
        return size_env(case, num_splits=num_splits, sm_count=sm_count, tiles=self.spec.tiles)

    def plan(self, case: Case, *, num_splits: int, sm_count: int) -> list[PlannedLaunch]:
        assert self.spec is not None
        env = self.env(case, num_splits=num_splits, sm_count=sm_count)
        out = []
        for launch in self.spec.pass_launches(self.backward_pass):
            grid = tuple(e.evaluate(env) for e in launch.grid)
            block = tuple(e.evaluate(env) for e in launch.block)
            out.append(PlannedLaunch(launch.entry_name(case.dtype, case.head_dim),
                                     grid, block, launch.shared_mem.evaluate(env)))  # type: ignore[arg-type]
        return out

    def tensor_map_boxes(self, case: Case, *, num_splits: int, sm_count: int
                         ) -> list[tuple[str, Box]]:
        """(tensor, box) of each tensor map of this pass for `case`."""
        assert self.spec is not None
        maps = self.spec.pass_tensor_maps(self.backward_pass)
        if not maps:
            return []
        env = self.env(case, num_splits=num_splits, sm_count=sm_count)
        return [(m.tensor, Box(m.box_rows.evaluate(env), m.box_cols.evaluate(env),
                             m.swizzle.evaluate(env)))
                for m in maps]

    def workspace_sizes(self, case: Case, *, num_splits: int, sm_count: int) -> list[int]:
        assert self.spec is not None
        env = self.env(case, num_splits=num_splits, sm_count=sm_count)
        return [w.elements.evaluate(env) for w in self.spec.pass_workspaces(self.backward_pass)]

    @staticmethod
    def check_limits(p: PlannedLaunch, limits: DeviceLimits, static_smem: int = 0,
                     max_threads: int = MAX_THREADS) -> str | None:
        """Why the device cannot take this launch, or None."""
        for i, (g, cap) in enumerate(zip(p.grid, MAX_GRID, strict=True)):
            if g < 0 or g > cap:
                return f"{p.entry}: grid[{i}] = {g} outside 1..{cap}"
        for i, (b, cap) in enumerate(zip(p.block, MAX_BLOCK, strict=True)):
            if b < 1 or b > cap:
                return f"{p.entry}: block[{i}] = {b} outside 1..{cap}"
        threads = p.block[0] * p.block[1] * p.block[2]
        if threads > min(MAX_THREADS, max_threads):
            return f"{p.entry}: {threads} threads per block > {min(MAX_THREADS, max_threads)}"
        if p.shared_mem < 0:
            return f"{p.entry}: negative shared memory {p.shared_mem}"
        if p.shared_mem + static_smem > limits.max_shared_optin:
            return (f"{p.entry}: needs {p.shared_mem + static_smem} bytes of shared memory "
                    f"({p.shared_mem} dynamic + {static_smem} static), device allows "
                    f"{limits.max_shared_optin}")
        return None

    # --- running ------------------------------------------------------------------------
    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None) -> None:
        self._launch(case, inputs, out, lse, None)

    def run_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor, dk: torch.Tensor,
                     dv: torch.Tensor) -> None:
        """The manifest's `[backward]` launches, into the harness's dQ, dK and dV; the
        forward's O and LSE go in the `o` and `lse` fields, dO in `dout`."""
        if self._bwd is None:
            if self.spec is None or self.spec.backward is None:
                raise NotImplementedError(f"{self.name} declares no backward")
            self._bwd = CudaVariant.from_spec(self.spec)
            self._bwd.backward_pass = True
            self._bwd.sandboxed_build = self.sandboxed_build
            self._bwd.sync_after_run = self.sync_after_run
            self._bwd.cache_launches = self.cache_launches
            self._bwd.launch_via_driver = self.launch_via_driver
        self._bwd._launch(case, inputs, inputs.out, inputs.lse, (inputs.dout, dq, dk, dv))

    def _launch(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                grads: tuple[torch.Tensor, ...] | None) -> None:
        """Launch the variant on torch's current stream.

        The hot path (the same case again, on tensors already seen: every timing loop and
        every repeated check) does no planning, allocating or packing: the compiled
        functions, the plan, the workspaces (per case and stream) and the filled FaParams
        (per set of tensor addresses) are cached, and a call is a key lookup plus the
        launches. A new case drops the previous case's state. The parameter block holds
        only addresses and sizes, so equal addresses give an equal block; the copies made
        for a mask or key lengths are keyed by the source tensor itself (kept alive by the
        cache) and its version counter, so new contents are never served stale."""
        if out.device.type != "cuda":
            raise RuntimeError(f"{self.name} runs on CUDA tensors, got {out.device}")
        tstream = torch.cuda.current_stream(out.device)
        sid = tstream.cuda_stream
        state = self._state
        if state is None or state.case != case or state.stream_id != sid \
                or not self.cache_launches:
            state = self._state = self._new_state(case, out.device, tstream)
        key = tensor_key(inputs, out, lse, grads)
        prepared = state.params.get(key) if self.cache_launches else None
        if prepared is None or not prepared.fresh(inputs):
            prepared = self._prepare(case, inputs, out, lse, state, grads)
            if prepared.cacheable and self.cache_launches:
                if len(state.params) >= MAX_CACHED_PARAM_SETS:
                    state.params.pop(next(iter(state.params)))
                state.params[key] = prepared
        with state.cp_device:
            for fn, p, raw in state.launches:
                try:
                    if raw is not None:
                        state.driver_launch(*raw, prepared.arg_addr, 0)
                    else:
                        fn(p.grid, p.block, (prepared.params.scalar,),
                           shared_mem=p.shared_mem, stream=state.cp_stream)
                except Exception as e:
                    raise CudaLaunchError(f"{self.name}: launching {p.entry} grid={p.grid} "
                                          f"block={p.block} smem={p.shared_mem} failed: {e}") \
                        from None
        if not prepared.cacheable or not self.cache_launches:
            # Not held by the cache: keep the temporaries alive until the stream used them.
            for t in (*state.workspaces, *prepared.params.keepalive, *prepared.copies):
                t.record_stream(tstream)
        if self.sync_after_run:
            try:
                tstream.synchronize()
            except Exception as e:
                raise CudaLaunchError(f"{self.name}: CUDA error after launches "
                                      f"{[p.entry for _, p, _r in state.launches]}: {e}") from None

    def _new_state(self, case: Case, device: torch.device, tstream: Any) -> CaseState:
        """Compile (cached), plan, check limits and allocate workspaces for `case`."""
        from harness.candidates.compile import compile_cupy

        assert self.spec is not None
        limits = device_limits(device)
        if self.sandboxed_build:
            from harness.candidates.sandboxed_compile import compile_cupy_sandboxed

            compiled = compile_cupy_sandboxed(self.spec, limits.compute_capability)
        else:
            compiled = compile_cupy(self.spec, limits.compute_capability)
        self.meta["resources"] = compiled.resources_dict()
        self.meta["arch"] = compiled.arch
        num_splits = self.resolve_num_splits(case, limits.sm_count)
        self.meta["num_splits"] = num_splits
        plan = self.plan(case, num_splits=num_splits, sm_count=limits.sm_count)
        for p in plan:
            if p.skipped:
                continue
            res = compiled.resources[p.entry]
            why = self.check_limits(p, limits, res.shared_bytes, res.max_threads)
            if why is not None:
                raise LaunchRefused(f"{self.name}: launch refused, {why}")
        boxes = self.tensor_map_boxes(case, num_splits=num_splits, sm_count=limits.sm_count)
        q_bytes, kv_bytes, _ = stored_bytes(case)   # 1 for an e4m3 tensor
        for tensor, box in boxes:
            try:
                box.check({"q": q_bytes, "k": kv_bytes, "v": kv_bytes}.get(
                    tensor, case.torch_dtype.itemsize))
            except TensorMapError as e:
                raise LaunchRefused(f"{self.name}: launch refused, tensor map of {tensor}: "
                                    f"{e}") from None
        # Zeroed once, when the case's state is made: a kernel may keep counters there
        # that it leaves at zero again (the split-KV kernel's fused combine does).
        workspaces = [
            torch.zeros(max(1, n), dtype=WORKSPACE_TORCH_DTYPES[w.dtype], device=device)
            for w, n in zip(self.spec.pass_workspaces(self.backward_pass),
                            self.workspace_sizes(case, num_splits=num_splits,
                                                 sm_count=limits.sm_count), strict=True)
        ]
        cp = cupy_module()
        # The hot path calls the driver's cuLaunchKernel with every argument precomputed
        # (function handle, grid, block, shared memory, stream; the parameter block's
        # address per tensor set): CuPy's own launch converts the FaParams scalar and
        # checks its arguments on every call, which costs about 10 us per launch.
        driver_launch = (getattr(cp.cuda.driver, "launchKernel", None)
                         if self.launch_via_driver else None)
        launches = []
        for p in plan:
            if not p.skipped:
                compiled.ensure_dynamic_smem(p.entry, p.shared_mem)
                fn = compiled.function(p.entry)
                fptr = function_ptr(fn)
                raw = (None if driver_launch is None or fptr is None else
                       (fptr, *p.grid, *p.block, p.shared_mem, tstream.cuda_stream))
                launches.append((fn, p, raw))
        self.meta["launch_path"] = ("driver" if launches and all(r is not None for *_, r in launches)
                                    else "cupy")
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return CaseState(case=case, stream_id=tstream.cuda_stream, num_splits=num_splits,
                          workspaces=workspaces, launches=launches, cp=cp,
                          cp_stream=cupy_stream(cp, tstream), cp_device=cp.cuda.Device(idx),
                          driver_launch=driver_launch, tensor_boxes=boxes)

    def _prepare(self, case: Case, inputs: Inputs, out: torch.Tensor,
                 lse: torch.Tensor | None, state: CaseState,
                 grads: tuple[torch.Tensor, ...] | None = None) -> PreparedParams:
        q, k, v = (aligned_for_vector_loads(t, d) for t, d in
                   ((inputs.q, case.head_dim), (inputs.k, case.head_dim), (inputs.v, case.dv)))
        copies = [t for t, src in zip((q, k, v), (inputs.q, inputs.k, inputs.v), strict=True)
                  if t is not src]
        dev_inputs = Inputs(q, k, v, inputs.mask, inputs.key_lengths, inputs.serving,
                            alibi_slopes=inputs.alibi_slopes, sinks=inputs.sinks,
                            q_descale=inputs.q_descale, k_descale=inputs.k_descale,
                            v_descale=inputs.v_descale)
        maps = None
        if state.tensor_boxes:
            named = {"q": q, "k": k, "v": v, "o": out}
            if grads is not None:
                named["dout"] = grads[0]
            try:
                maps = device_maps([named[t] for t, _ in state.tensor_boxes],
                                   [b for _, b in state.tensor_boxes])
            except TensorMapError as e:
                raise LaunchRefused(f"{self.name}: launch refused, {e}") from None
        params = build_params(case, dev_inputs, out, lse, state.workspaces, state.num_splits,
                              grads, tensor_maps=maps)
        # What the params were filled from: a change to one (a new call's inputs) rebuilds them.
        sources = param_sources(inputs)
        # cuLaunchKernel's kernelParams: one pointer, to the FaParams bytes (the struct is
        # the kernel's only argument, passed by value; the driver copies it at launch).
        arg_ptrs = (ctypes.c_void_p * 1)(params.array.ctypes.data)
        # A re-aligned copy of q/k/v holds the contents of this call: never reused.
        return PreparedParams(params=params, copies=copies, sources=sources,
                         versions=tuple(t._version for t in sources), cacheable=not copies,
                         arg_ptrs=arg_ptrs, arg_addr=ctypes.addressof(arg_ptrs))


def load_variants(root: Path | str | None = None) -> tuple[list[CudaVariant], list[LoadError]]:
    """Every variant under `root` (default: the shipped kernels/) as a candidate, plus the
    problems of those that could not be loaded."""
    specs, errors = load_specs(root)
    return [CudaVariant.from_spec(s) for s in specs], errors


def discovered_variants() -> tuple[list[CudaVariant], list[LoadError]]:
    """The variants of every kernel folder (harness.candidates.discovery), each with its
    origin in `meta["origin"]`; raises DiscoveryError for a name defined twice."""
    from harness.candidates.discovery import find_variants

    found = find_variants()
    variants = []
    for spec, origin in found.specs:
        v = CudaVariant.from_spec(spec)
        v.meta["origin"] = origin
        variants.append(v)
    return variants, found.errors
