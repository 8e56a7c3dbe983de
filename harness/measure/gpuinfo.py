"""Who the runner is: GPU identity and clocks, through NVML (`pynvml`) and torch.

Two runs are comparable only on the same GPU model (`gpu_model_key`), and a timing is
trustworthy only at a sane SM clock, so both the perf record and the timing method ask
this module. NVML being absent or failing (containers without the driver's NVML, no GPU
at all) never raises: the identity is partial and `nvml_error` says why in one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# Bits of nvmlDeviceGetCurrentClocksEventReasons (formerly "throttle reasons"). Kept here
# rather than read from pynvml so the names are stable across nvidia-ml-py versions.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass
class GpuIdentity:
    name: str = "unknown"
    uuid: str | None = None
    index: int | None = None
    driver: str | None = None
    cuda_driver_version: str | None = None  # e.g. "13.0" (the driver's CUDA API level)
    compute_capability: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    sm_clock_mhz: int | None = None  # current
    sm_clock_max_mhz: int | None = None
    sm_clock_default_mhz: int | None = None  # default applications clock
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    persistence_mode: bool | None = None
    clock_event_reasons: list[str] = field(default_factory=list)
    torch_version: str | None = None
    torch_cuda: str | None = None
    nvml_error: str | None = None

    @property
    def model_key(self) -> str:
        return gpu_model_key(self.name)

    @property
    def reference_sm_clock_mhz(self) -> int | None:
        """The clock a sample's SM clock is compared with to call it throttled: the default
        applications clock when NVML reports one, else the maximum SM clock."""
        return self.sm_clock_default_mhz or self.sm_clock_max_mhz

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model_key"] = self.model_key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuIdentity:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def gpu_model_key(name: str) -> str:
    """"NVIDIA H200" -> "nvidia-h200"; "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3".
    The memory suffix is kept on purpose: two boards of one chip with different memory
    systems are not comparable for bandwidth-bound kernels."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml():
    """Import and initialise pynvml; raises with a readable message when unusable."""
    import pynvml

    pynvml.nvmlInit()  # idempotent: NVML counts init/shutdown pairs
    return pynvml


def _torch_uuid(index: int) -> str | None:
    import torch

    try:
        u = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # older torch builds have no uuid property
        return None
    return u if u.startswith("GPU-") else f"GPU-{u}"


def nvml_handle(index: int | None = None):
    """NVML handle of the torch device `index` (current device when None).

    Matched by UUID because NVML numbers devices physically while torch numbers them after
    CUDA_VISIBLE_DEVICES; falls back to the index only when nothing remaps them."""
    import torch

    nv = _nvml()
    if index is None:
        index = torch.cuda.current_device()
    uuid = _torch_uuid(index)
    if uuid:
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        except nv.NVMLError:
            pass
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        raise RuntimeError("cannot match the torch device to an NVML device (no UUID)")
    return nv.nvmlDeviceGetHandleByIndex(index)


def sm_clock_reader(index: int | None = None) -> tuple[Callable[[], float] | None, str | None]:
    """(read_sm_clock_mhz, None), or (None, reason) when NVML cannot be used."""
    try:
        nv = _nvml()
        h = nvml_handle(index)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)  # fail now rather than per sample
    except Exception as e:  # any NVML problem: the timing runs without a clock filter
        return None, f"NVML unavailable ({_str(e) or type(e).__name__})"
    return (lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))), None


def _fill_from_torch(ident: GpuIdentity, index: int | None) -> int | None:
    try:
        import torch

        ident.torch_version = torch.__version__
        ident.torch_cuda = torch.version.cuda
        if not torch.cuda.is_available():
            return None
        if index is None:
            index = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        ident.index = index
        ident.name = p.name
        ident.compute_capability = f"{p.major}.{p.minor}"
        ident.sm_count = p.multi_processor_count
        ident.l2_bytes = int(getattr(p, "L2_cache_size", 0)) or None
        ident.memory_bytes = int(p.total_memory)
        ident.uuid = _torch_uuid(index)
        return index
    except Exception:
        return None


def gpu_identity(index: int | None = None) -> GpuIdentity:
    """Everything we know about the runner's GPU. Never raises."""
    ident = GpuIdentity()
    index = _fill_from_torch(ident, index)
    if index is None and ident.torch_version is not None:
        ident.nvml_error = "no CUDA device visible to torch"
        return ident
    try:
        nv = _nvml()
        h = nvml_handle(index)
    except Exception as e:
        ident.nvml_error = f"NVML unavailable ({_str(e) or type(e).__name__})"
        return ident

    def get(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # one unsupported query must not lose the others
            return None

    ident.name = _str(get(lambda: nv.nvmlDeviceGetName(h)) or ident.name)
    ident.uuid = _str(get(lambda: nv.nvmlDeviceGetUUID(h)) or ident.uuid)
    drv = get(nv.nvmlSystemGetDriverVersion)
    ident.driver = _str(drv) if drv else None
    cuda = get(nv.nvmlSystemGetCudaDriverVersion)
    if cuda:
        ident.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    sm, mem = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM
    ident.sm_clock_mhz = get(lambda: nv.nvmlDeviceGetClockInfo(h, sm))
    ident.sm_clock_max_mhz = get(lambda: nv.nvmlDeviceGetMaxClockInfo(h, sm))
    ident.sm_clock_default_mhz = get(lambda: nv.nvmlDeviceGetDefaultApplicationsClock(h, sm))
    ident.mem_clock_mhz = get(lambda: nv.nvmlDeviceGetClockInfo(h, mem))
    ident.mem_clock_max_mhz = get(lambda: nv.nvmlDeviceGetMaxClockInfo(h, mem))
    pm = get(lambda: nv.nvmlDeviceGetPersistenceMode(h))
    ident.persistence_mode = None if pm is None else bool(pm)
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    bits = get(lambda: reasons_fn(h)) if reasons_fn else None
    if bits is not None:
        ident.clock_event_reasons = [n for b, n in CLOCK_EVENT_REASONS.items() if bits & b]
    return ident


def describe(ident: GpuIdentity) -> str:
    """One line for logs and table captions."""
    parts = [ident.name]
    if ident.driver:
        parts.append(f"driver {ident.driver}")
    if ident.cuda_driver_version:
        parts.append(f"CUDA {ident.cuda_driver_version}")
    if ident.sm_clock_mhz:
        parts.append(f"SM {ident.sm_clock_mhz}/{ident.sm_clock_max_mhz} MHz")
    if ident.sm_count:
        parts.append(f"{ident.sm_count} SMs")
    if ident.l2_bytes:
        parts.append(f"L2 {ident.l2_bytes / 2**20:.0f} MiB")
    if ident.nvml_error:
        parts.append(ident.nvml_error)
    return ", ".join(str(p) for p in parts)


# ----------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class VisibleGpu:
    """A GPU a worker may be pinned to: its NVML index (nvidia-smi's number, PCI bus
    order), its UUID (what the worker locks and hands the child as CUDA_VISIBLE_DEVICES,
    so no numbering convention can pin the child to another GPU) and its name."""

    index: int
    uuid: str
    name: str


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML sees on a GPU (pid as NVML reports it: the host's pid
    namespace, which need not be ours inside a container)."""

    pid: int
    used_bytes: int | None


def _all_gpus(nv: Any) -> list[VisibleGpu]:
    out = []
    for i in range(int(nv.nvmlDeviceGetCount())):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        out.append(VisibleGpu(i, _str(nv.nvmlDeviceGetUUID(h)), _str(nv.nvmlDeviceGetName(h))))
    return out


def visible_gpus() -> list[VisibleGpu]:
    """The GPUs this process may use, through NVML, in CUDA_VISIBLE_DEVICES order when it is
    set (entries are nvidia-smi indices or UUIDs / UUID prefixes, as CUDA reads them; CUDA
    stops at the first entry it cannot read, and so does this). Raises RuntimeError with
    one line when NVML is unusable."""
    try:
        nv = _nvml()
        gpus = _all_gpus(nv)
    except Exception as e:  # noqa: BLE001 - pynvml raises its own error types
        raise RuntimeError(f"NVML unavailable ({_str(e) or type(e).__name__})") from None
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return gpus
    picked: list[VisibleGpu] = []
    for entry in (e.strip() for e in env.split(",")):
        match = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in picked:
            break
        picked.append(match)
    return picked


def resolve_gpu(spec: str | int) -> VisibleGpu:
    """The GPU named by `spec`: a position among `visible_gpus()` (0, 1, ...) or a UUID
    (or unique UUID prefix, "GPU-..."). Raises ValueError naming the problem."""
    gpus = visible_gpus()
    text = str(spec).strip()
    if text.startswith("GPU-"):
        found = [g for g in gpus if g.uuid.startswith(text)]
        if len(found) != 1:
            raise ValueError(f"GPU {text}: {'ambiguous' if found else 'not visible'} "
                             f"({len(gpus)} GPU(s) visible)")
        return found[0]
    if not text.isdigit():
        raise ValueError(f"GPU {text!r}: expected an index or a GPU-... UUID")
    i = int(text)
    if i >= len(gpus):
        raise ValueError(f"GPU {i}: only {len(gpus)} GPU(s) visible")
    return gpus[i]


def compute_processes(uuid: str) -> list[GpuProcess]:
    """Compute processes running on the GPU `uuid` now (NVML
    nvmlDeviceGetComputeRunningProcesses). Raises RuntimeError when NVML cannot tell."""
    try:
        nv = _nvml()
        h = nv.nvmlDeviceGetHandleByUUID(uuid)
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"NVML cannot list processes ({_str(e) or type(e).__name__})"
                           ) from None
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), int(used) if isinstance(used, int) else None))
    return out
