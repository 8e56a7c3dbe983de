"""Kernel variants: loading `kernels/<name>/manifest.toml` (and single annotated `.cu` files).

A variant is a folder under `kernels/` holding a `manifest.toml` and the `.cu` sources it
names; adding the folder enrols the variant everywhere (registry, CI compile, suites).
A submission may instead be a single `.cu` whose manifest is TOML inside a leading
`/* fa-harness manifest ... */` block comment (`load_variant_file`).

Every problem is reported as one `LoadError` naming the file and the field (or line);
one broken variant never stops the others from loading. The format is documented in
kernels/README.md; harness.candidates.variant_spec holds what a loaded variant is and
harness.candidates.manifest checks each field. This module is the public face of both.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from harness.candidates.manifest import _build_spec
from harness.candidates.variant_spec import (
    ARCH_RE,
    HEADER_NAME,
    KERNELS_ROOT,
    MANIFEST_NAME,
    NOT_VARIANTS,
    SUBMISSION_RE,
    LoadError,
    VariantError,
    VariantSpec,
    header_path,
    size_env,
)

__all__ = [
    "ARCH_RE", "HEADER_NAME", "KERNELS_ROOT", "LoadError", "VariantError", "VariantSpec",
    "header_path", "load_specs", "load_variant", "load_variant_dir", "load_variant_file",
    "size_env",
]


def load_specs(root: Path | str | None = None) -> tuple[list[VariantSpec], list[LoadError]]:
    root = Path(root) if root is not None else KERNELS_ROOT
    specs: list[VariantSpec] = []
    errors: list[LoadError] = []
    if not root.is_dir():
        return specs, [LoadError(str(root), "", "kernels folder not found")]
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name in NOT_VARIANTS or folder.name.startswith((".", "_")):
            continue
        try:
            specs.extend(load_variant_dir(folder).with_flavors())
        except VariantError as e:
            errors.append(e.error)
    return specs, errors


def load_variant_dir(folder: Path | str) -> VariantSpec:
    """Load `folder/manifest.toml`; raises VariantError naming file and field."""
    folder = Path(folder)
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        raise VariantError(LoadError(str(manifest), "", "manifest.toml not found",
                                     folder.name))
    try:
        data = tomllib.loads(manifest.read_text())
    except tomllib.TOMLDecodeError as e:
        raise VariantError(LoadError(str(manifest), "", f"not valid TOML: {e}",
                                     folder.name)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise VariantError(LoadError(str(manifest), "", f"cannot read: {e}", folder.name)) from None
    return _build_spec(data, manifest, folder, expect_name=folder.name, single_file=None)


def load_variant_file(path: Path | str) -> VariantSpec:
    """A single `.cu` whose manifest is TOML in a leading `/* fa-harness manifest ... */`
    block comment. `sources` may be left out (the file is the source)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise VariantError(LoadError(str(path), "", f"cannot read: {e}")) from None
    m = SUBMISSION_RE.match(text)
    if not m:
        raise VariantError(LoadError(
            str(path), "line 1",
            "no manifest: the file must start with a /* fa-harness manifest ... */ comment"))
    try:
        data = tomllib.loads(m.group(1))
    except tomllib.TOMLDecodeError as e:
        raise VariantError(LoadError(str(path), "", f"manifest comment is not valid TOML: {e}"))\
            from None
    return _build_spec(data, path, path.parent, expect_name=None, single_file=(path, text))


def load_variant(path: Path | str, name: str | None = None) -> VariantSpec:
    """A variant folder or a single annotated `.cu` file; with `name`, that variant or
    the folder's `[[flavor]]` of that name (a VariantError when it has none)."""
    p = Path(path)
    spec = load_variant_dir(p) if p.is_dir() else load_variant_file(p)
    if name is None or name == spec.name:
        return spec
    flavored = spec.flavor(name)
    if flavored is None:
        raise VariantError(LoadError(str(spec.manifest_path), "name",
                                     f"{spec.name!r} has no flavor {name!r}", spec.name))
    return flavored


