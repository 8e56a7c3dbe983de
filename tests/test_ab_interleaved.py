"""bench/ab_interleaved.py refuses what it cannot time, with exit status 2 and one line."""

from __future__ import annotations

from benchscripts import load


def _main():
    return load("ab_interleaved").main


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
