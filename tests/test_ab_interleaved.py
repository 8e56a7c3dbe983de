"""bench/ab_interleaved.py refuses what it cannot time, with exit status 2 and one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _main():
    spec = importlib.util.spec_from_file_location("ab_interleaved", ROOT / "bench" / "ab_interleaved.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def test_bad_arguments_exit_2_with_one_message(capsys):
    main = _main()
    assert main(["--kernels", "no_such_kernel"]) == 2
    assert "no candidate named 'no_such_kernel'" in capsys.readouterr().err
    assert main(["--kernels", "sdpa_math", "--cases", "nothing-matches-*"]) == 2
    assert "no case of grid 'perf' matches" in capsys.readouterr().err
    assert main(["--kernels", "sdpa_math", "--baseline", "fa1"]) == 2
    assert "baseline 'fa1' is not among --kernels" in capsys.readouterr().err
    for bad in (["--rounds", "0"], ["--min-time", "0"], ["--min-time", "nan"]):
        assert main(["--kernels", "sdpa_math", *bad]) == 2
        assert "--rounds must be at least 1" in capsys.readouterr().err
