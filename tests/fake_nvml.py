"""A stand-in for pynvml: the GPUs, UUIDs and compute processes a test says exist."""

from __future__ import annotations

from dataclasses import dataclass, field


class NVMLError(Exception):
    pass


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None = 1 << 20  # noqa: N815 - pynvml's spelling


@dataclass
class FakeNvml:
    gpus: list[tuple[str, str]] = field(default_factory=lambda: [
        ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H200"),
        ("GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA H200")])
    # uuid -> pids that the test says run there now
    procs: dict[str, list[int]] = field(default_factory=dict)
    calls: int = 0
    NVMLError = NVMLError

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[i][0]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802
        if uuid not in {u for u, _ in self.gpus}:
            raise NVMLError("Not Found")
        return uuid

    def nvmlDeviceGetUUID(self, h: str) -> str:  # noqa: N802
        return h

    def nvmlDeviceGetName(self, h: str) -> bytes:  # noqa: N802
        return dict(self.gpus)[h].encode()

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[_Proc]:  # noqa: N802
        self.calls += 1
        return [_Proc(p) for p in self.procs.get(h, [])]


def install(monkeypatch, nvml: FakeNvml | None = None) -> FakeNvml:
    from harness.measure import gpuinfo

    nvml = nvml or FakeNvml()
    monkeypatch.setattr(gpuinfo, "_nvml", lambda: nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml
