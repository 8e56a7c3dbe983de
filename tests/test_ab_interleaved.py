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
    assert main(["--kernels", "sdpa_math,sdpa_math@sc30-bogus"]) == 2
    assert "sdpa_math@sc30-bogus: not a case's modifiers" in capsys.readouterr().err
    for bad in (["--rounds", "0"], ["--min-time", "0"], ["--min-time", "nan"]):
        assert main(["--kernels", "sdpa_math", *bad]) == 2
        assert "--rounds must be at least 1" in capsys.readouterr().err


def test_a_row_gives_the_clock_beside_the_ratio_or_a_dash_without_nvml():
    row = load("ab_interleaved").row
    base = row("b1-case", "fa3_base", 9, 2 * 10**12, [2.0, 2.2, 2.1], [1980.0, 1980.0], None)
    assert base.split()[1:] == ["fa3_base", "952.4", "1980"]
    # the rounds' ratios 2.0/1.9, 2.2/2.0, 2.1/2.2: median 1.053, range 0.955-1.100
    new = row("b1-case", "fa3_wgmma", 9, 2 * 10**12, [1.9, 2.0, 2.2], [1740.0, 1770.0, 1755.0],
              [2.0, 2.2, 2.1])
    assert new.split()[1:] == ["fa3_wgmma", "1000.0", "1755", "1.053", "0.955-1.100"]
    assert row("b1-case", "x", 9, 10**12, [1.0], [], None).split()[2:] == ["1000.0", "-"]


def test_the_summary_gives_the_median_over_cases_overall_and_per_head_dim():
    summary = load("ab_interleaved").summary
    got = {"fa3_wgmma": [(64, 1.02), (64, 1.01), (128, 0.99), (128, 1.00)],
           "sdpa_cudnn": [(128, 0.95)]}
    lines = summary(got, "fa3_base")
    assert lines[0].startswith("over the cases, each case's median / fa3_base")
    assert "  fa3_wgmma all (4): 1.005 (0.990-1.020), 3 >= 1.0" in lines
    assert "  fa3_wgmma d64 (2): 1.015 (1.010-1.020), 2 >= 1.0" in lines
    assert "  fa3_wgmma d128 (2): 0.995 (0.990-1.000), 1 >= 1.0" in lines
    # One head dim: no per-dim lines.
    assert [ln for ln in lines if "sdpa_cudnn" in ln] == ["  sdpa_cudnn all (1): 0.950 "
                                                          "(0.950-0.950), 0 >= 1.0"]
    assert all(len(ln) <= 80 for ln in lines)
    assert summary({}, "fa3_base") == []
