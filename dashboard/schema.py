"""The database schema and engine helpers of `harness.db`, loaded without the package's
`__init__`.

`harness.db/__init__.py` re-exports the record store, which imports the case layer and
with it torch: seconds of start-up and hundreds of MB that a dashboard reading a database
has no use for. `harness.db.models` and `harness.db.engine` themselves depend on SQLAlchemy
only, so they are loaded here under their own module names; if `harness.db` is imported
later in the same process, it finds and reuses these very modules (one `Base`, one set of
tables).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import harness


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    path = Path(harness.__file__).resolve().parent / "db" / f"{name.rsplit('.', 1)[1]}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


models = _load("harness.db.models")
engine = _load("harness.db.engine")

Base = models.Base
Run = models.Run
Variant = models.Variant
CaseRow = models.CaseRow
Result = models.Result
Comparison = models.Comparison
Submission = models.Submission
ApiToken = models.ApiToken
