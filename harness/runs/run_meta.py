"""What a run record says about the run beside its results: each candidate's kind, source
hash, manifest and compile resources, the GPU's identity, and this runner's calibration
(shared by `fa-harness run`, `fa-harness ci` and the pytest plugin, so their records
describe a run the same way)."""

from __future__ import annotations

from typing import Any

from harness.records.record import gpu_model_key


def kernel_info(c: Any) -> dict[str, Any]:
    meta = dict(getattr(c, "meta", {}) or {})
    info: dict[str, Any] = {"kind": getattr(c, "kind", None),
                            "source_hash": str(meta.get("source_hash") or "")}
    if meta.get("manifest") is not None:
        info["manifest"] = meta["manifest"]
    for key in ("registers", "spills", "shared_bytes"):
        if meta.get(key) is not None:
            info[key] = meta[key]
    return info


def gpu_meta() -> dict[str, Any] | None:
    from harness.measure.gpuinfo import gpu_identity

    ident = gpu_identity().to_dict()
    ident.setdefault("model_key", gpu_model_key(ident.get("name")))
    return ident


def calibration_object(notes: list[str]) -> Any | None:
    """This runner's calibration (harness.measure.calibrate), or None with a note why not."""
    try:
        from harness.measure.calibrate import load_calibration

        cal = load_calibration()
    except Exception as exc:  # noqa: BLE001 - a bad calibration file must not stop the gate
        notes.append(f"calibration not loaded: {exc}")
        return None
    if cal is None:
        notes.append("no calibration for this runner: no physical time floor applied")
    return cal


def plain_dict(obj: Any) -> dict[str, Any] | None:
    if obj is None or isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else {"value": str(obj)}
