"""bench/retiming_noise.py off the GPU: its input checks and its summary of medians."""

from __future__ import annotations

import pytest
from benchscripts import load

rn = load("retiming_noise")


@pytest.mark.parametrize("argv, says", [
    (["--pairs", "fa1"], "not CANDIDATE:CASE_ID"),
    (["--pairs", "fa1:not-a-case"], "not a case id"),
    (["--ways", "same,later"], "--ways: later"),
    (["--repeats", "1"], "at least 2"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert rn.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_the_default_pairs_parse_and_name_the_decode_case():
    pairs = rn.parse_pairs(list(rn.PAIRS))
    assert {n for n, _ in pairs} == {"fa1", "naive", "fa2_simt", "template", "fa2_mma"}
    assert {c for _, c in pairs} == {rn.DECODE}


def test_the_summary_tells_a_process_mode_from_a_steady_process():
    def ms(xs, clock=1980.0):
        return [{"median_ms": x, "sm_clock_mhz": clock, "rel_noise": 0.004, "samples": 99}
                for x in xs]

    steady = [0.945, 0.9452, 0.9449, 0.9451]
    modes = [0.92, 0.945, 0.972, 0.945]
    summ = rn.summary({"template:" + rn.DECODE: {"same": ms(steady), "process": ms(modes)}})
    s = summ["template:" + rn.DECODE]
    assert s["same"]["range"] < 0.001 < 0.05 < s["process"]["range"]
    assert s["process"]["median_ms"] == pytest.approx(0.945)
    assert s["same"]["clock_mhz"] == [1980.0, 1980.0]
    rows = rn.table(summ)
    assert len(rows) == 4 and rows[2].split("|")[2].strip() == "same"  # in WAYS order
    assert rn.spread([]) == {"n": 0}


def test_without_a_gpu_it_says_so(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert rn.main(["--repeats", "2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
