"""The IO model reproduces the worked example and behaves per algorithm."""

from __future__ import annotations

import pytest

from harness.core import iomodel as io
from harness.core.cases import Case, MaskKind
from harness.core.flops import attention_flops

MIB = 2 ** 20
SEED = Case(1, 1, 1, 4096, 4096, 64, "float16")  # N = 4096, d = 64, fp16, one head


def test_seed_figures():
    f = attention_flops(SEED)
    assert f == pytest.approx(4.3e9, rel=0.01)
    h100 = io.GPU_SPECS["h100-sxm"]
    expect = {"naive_3pass": (194, 21, 71), "naive_fused": (130, 32, 106), "fa2": (65, 63, 211)}
    for algo, (mib, ai, tflops) in expect.items():
        b = io.hbm_bytes(algo, SEED, {"block_q": 64})
        assert round(b / MIB) == mib, algo
        got_ai = io.arithmetic_intensity(f, b)
        assert round(got_ai) == ai, algo
        assert round(io.roofline_tflops(got_ai, h100)) == tflops, algo
    assert io.hbm_bytes("naive_3pass", SEED) == 194 * MIB  # exact: no LSE, no extras
    assert io.ideal_bytes(SEED) == 2 * MIB
    assert round(h100.ridge) == 295


def test_fa2_rereads_kv_once_per_query_block():
    t = io.hbm_breakdown("fa2", SEED, {"block_q": 128})
    assert t["read K"] == t["read V"] == 32 * 4096 * 64 * 2
    assert io.hbm_bytes("fa2", SEED, {"block_q": 128}) < io.hbm_bytes("fa2", SEED, {"block_q": 64})


def test_fa1_rereads_q_and_o_per_kv_block():
    t = io.hbm_breakdown("fa1", SEED, {"block_k": 64})
    assert t["read K"] == 4096 * 64 * 2
    assert t["read Q"] == 64 * 4096 * 64 * 2
    # once per K/V block, plus the final pass that normalises O
    assert t["read O"] == 65 * 4096 * 64 * 2
    # initialisation + once per K/V block + the final O
    assert t["write O"] == 66 * 4096 * 64 * 2
    assert t["write LSE"] == 4096 * 4
    acc = io.hbm_breakdown("fa1", SEED, {"block_k": 64, "acc_bytes": 4})
    assert acc["read O"] == 65 * 4096 * 64 * 4  # a float32 O workspace doubles that traffic


def test_causal_skips_tiles_above_the_diagonal():
    causal = Case(1, 1, 1, 4096, 4096, 64, mask=MaskKind.CAUSAL_BR)
    full = io.hbm_breakdown("fa2", SEED)
    half = io.hbm_breakdown("fa2", causal)
    assert half["read K"] == 64 * 4096 * 64 * 2 * 65 // 128  # blocks 1..64 of 64 rows
    assert half["read K"] < full["read K"]
    assert io.hbm_bytes("fa1", causal) < io.hbm_bytes("fa1", SEED)
    # Nq > Nk bottom-right: early query blocks see no key and load nothing.
    empty = Case(1, 1, 1, 256, 64, 64, mask=MaskKind.CAUSAL_BR)
    assert io.hbm_breakdown("fa2", empty, {"block_q": 64, "block_k": 64})["read K"] == 64 * 64 * 2


def test_gqa_shares_kv_only_in_ideal():
    mha = Case(1, 8, 8, 512, 512, 64)
    gqa = Case(1, 8, 2, 512, 512, 64)
    assert io.ideal_bytes(gqa) < io.ideal_bytes(mha)
    assert io.hbm_bytes("fa2", gqa) == io.hbm_bytes("fa2", mha)


def test_splitkv_pays_for_partials():
    dec = Case(1, 32, 8, 1, 65536, 128)
    one = io.hbm_bytes("splitkv", dec, {"splits": 1})
    assert one == io.hbm_bytes("fa2", dec)
    many = io.hbm_breakdown("splitkv", dec, {"splits": 16})
    assert many["write partials"] == many["read partials"] == 32 * 16 * 129 * 4
    assert sum(many.values()) > one


def test_ceilings_and_floor():
    c = io.Ceilings.from_dict({"copy_gbps": 4240, "matmul_tflops": 672.1})
    assert io.roofline_tflops(10, c) == pytest.approx(42.4)
    assert io.roofline_tflops(1e6, c) == pytest.approx(672.1)
    h200 = io.get_gpu("h200")
    ms = io.roofline_floor_ms(4.8e12, 1, h200)
    assert ms == pytest.approx(4.8e12 / 989e12 * 1e3)
    with pytest.raises(ValueError, match="copy_gbps"):
        io.Ceilings.from_dict({"copy": 1})
    with pytest.raises(ValueError, match="known"):
        io.get_gpu("rtx")
    with pytest.raises(ValueError, match="unknown algorithm"):
        io.hbm_bytes("fa9", SEED)
    with pytest.raises(ValueError, match="block_q"):
        io.hbm_bytes("fa2", SEED, {"block_q": 0})
