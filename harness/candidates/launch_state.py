"""The state behind `CudaVariant.run`'s hot path: what a launch is (`PlannedLaunch`), the
device's limits, the per-case launch state and the per-tensor-set parameter blocks it
caches, and the CuPy / driver plumbing the launches go through. No planning or checking
lives here (that is `cuda_candidate`); cupy is imported only when a launch needs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.cases import Case, Inputs


@dataclass(frozen=True)
class PlannedLaunch:
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int

    @property
    def skipped(self) -> bool:
        """A zero grid dimension means "nothing to do for this case" (for example the
        split-KV combine when num_splits == 1): the launch is left out."""
        return 0 in self.grid


@dataclass(frozen=True)
class DeviceLimits:
    sm_count: int
    max_shared_optin: int  # bytes per block, static + dynamic
    compute_capability: tuple[int, int]


# Distinct tensor sets cached per case: the timing method's input sets (tens at most),
# plus the check's buffers.
MAX_CACHED_PARAM_SETS = 64


@dataclass
class CaseState:
    case: Case
    stream_id: int
    num_splits: int
    workspaces: list[torch.Tensor]
    # (CuPy function, plan, precomputed cuLaunchKernel arguments or None)
    launches: list[tuple[Any, PlannedLaunch, tuple | None]]
    cp: Any
    cp_stream: Any
    cp_device: Any
    driver_launch: Any = None
    params: dict[tuple, PreparedParams] = field(default_factory=dict)
    # (tensor, harness.candidates.tensor_map.Box) of each declared tensor map
    tensor_boxes: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class PreparedParams:
    params: Any  # harness.candidates.params.BuiltParams
    copies: list[torch.Tensor]
    sources: tuple[torch.Tensor, ...]  # mask / key lengths the block's copies came from
    versions: tuple[int, ...]
    cacheable: bool
    arg_ptrs: Any = None  # ctypes array holding the parameter block's address
    arg_addr: int = 0

    def fresh(self, inputs: Inputs) -> bool:
        now = param_sources(inputs)
        return len(now) == len(self.sources) and all(
            a is b and a._version == v for a, b, v in zip(now, self.sources, self.versions,
                                                         strict=True))


def param_sources(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """The tensors the parameter block was filled from besides q, k, v and the outputs
    (copies of them on the device, or their addresses): a new tensor or new contents of
    one rebuilds the block."""
    return tuple(t for t in (inputs.mask, inputs.key_lengths, inputs.alibi_slopes,
                             inputs.sinks, inputs.q_descale, inputs.k_descale,
                             inputs.v_descale) if t is not None)


def tensor_key(inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
               grads: tuple[torch.Tensor, ...] | None = None) -> tuple:
    """What the parameter block depends on: addresses and strides of every tensor (the
    backward's dO, dQ, dK, dV too), and the identity of the mask / key-length tensors
    (whose converted copies it points to), as of the ALiBi slopes, sink logits and an fp8
    case's descales."""
    q, k, v = inputs.q, inputs.k, inputs.v
    extra = tuple((t.data_ptr(), t.stride()) for t in grads) if grads else ()
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
            0 if lse is None else lse.data_ptr(), q.stride(), k.stride(), v.stride(),
            out.stride(), id(inputs.mask), id(inputs.key_lengths), id(inputs.alibi_slopes),
            id(inputs.sinks), id(inputs.q_descale), id(inputs.k_descale),
            id(inputs.v_descale), *extra)


def function_ptr(fn: Any) -> int | None:
    """The CUfunction handle behind a CuPy kernel: `RawModule.get_function` gives a
    RawKernel, whose `.kernel` is the loaded cupy.cuda.Function (`.ptr`)."""
    ptr = getattr(fn, "ptr", None)
    if ptr is None:
        ptr = getattr(getattr(fn, "kernel", None), "ptr", None)
    return ptr if isinstance(ptr, int) and ptr else None


def aligned_for_vector_loads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Kernels use 16-byte vector loads: give them a 16-byte aligned base and, when the
    head dim allows it, strides that keep every row aligned."""
    if t.stride(-1) != 1:
        return t.contiguous()
    per = max(1, 16 // t.element_size())  # elements in 16 bytes (e4m3: 16)
    bad_ptr = t.data_ptr() % 16 != 0
    bad_stride = head_dim % per == 0 and any(t.stride(i) % per for i in range(3)
                                             if t.size(i) > 1)
    if bad_ptr or bad_stride:
        return t.clone(memory_format=torch.contiguous_format)
    return t


_limits_cache: dict[int, DeviceLimits] = {}


def device_limits(device: torch.device) -> DeviceLimits:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    hit = _limits_cache.get(idx)
    if hit is not None:
        return hit
    props = torch.cuda.get_device_properties(idx)
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if not optin:
        cp = cupy_module()
        optin = cp.cuda.Device(idx).attributes["MaxSharedMemoryPerBlockOptin"]
    lim = DeviceLimits(
        sm_count=int(props.multi_processor_count),
        max_shared_optin=int(optin),
        compute_capability=(int(props.major), int(props.minor)),
    )
    _limits_cache[idx] = lim
    return lim


def cupy_module():
    from harness.candidates.compile import _cupy

    return _cupy()


def cupy_stream(cp: Any, tstream: torch.cuda.Stream) -> Any:
    """CuPy view of torch's stream, so our launches order with torch's work."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            return from_external(tstream)
        except Exception:  # older CuPy, or a torch stream without __cuda_stream__
            pass
    return cp.cuda.ExternalStream(tstream.cuda_stream)
