"""Cases ``make fuzz`` found, pasted as data (``ChainSpec`` fields), each with what it showed."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from tvm import relay

from conftest import build_and_load, run
from refcodegen import offload_report, partition_for_refcg
from fuzzing.chains import ChainSpec, build_batch, fuzz_batches, tvm_only_undefined
from fuzzing.check import check_batch

# Found 2026-11-30 (seed 1, float64; every numerics): "max diff 255". Not refcg's: the avg_pool's last
# ceil_mode window (W column 3: starts at 3*2=6, input W is 6, right pad 0) lies outside the padded
# input, TVM divides by a count <= 0 and that column is garbage (differs between builds). refcg keeps
# the pool in TVM; the grouped conv it offloads next reads that column only at output W 4 and 5
# (kernel width 2, left pad 2).
EMPTY_CEIL_WINDOW = dict(
    shape=(2, 9, 6, 4), layout="NHWC", dtype="uint8", scale=0.019755996763706207, zp=185, seed=979990, ops=[
        {"op": "binary", "kind": "subtract", "other": (1, 1), "flip": False, "const": True,
         "o_scale": 0.0005520643899217248, "o_zp": 243, "out_scale": 0.007490534335374832, "out_zp": 127,
         "clip": (41, 216)},
        {"op": "pool", "kind": "avg", "size": (2, 1), "strides": (1, 2), "padding": (0, 0, 1, 0),
         "ceil_mode": True, "count_include_pad": True},
        {"op": "conv2d", "out_c": 8, "kernel": (1, 2), "strides": (2, 1), "dilation": (1, 1),
         "padding": (1, 2, 0, 1), "groups": 4, "w_dtype": "int8", "kernel_zp": -123, "per_channel": True,
         "bias": 1024, "bias_form": "add", "out_dtype": "uint8", "out_scale": 0.0328996516764164, "out_zp": 255,
         "rounding": "None", "clip": None}])


def test_empty_ceil_window_is_tvm_undefined_and_the_rest_exact(tmp_path):
    spec = ChainSpec(**EMPTY_CEIL_WINDOW)
    assert "TVM divides" in tvm_only_undefined(spec)
    # the harness does not even build it (the division can trap: SIGFPE killed a fuzz run)
    result = check_batch([spec], "llvm", tmp_path)
    assert result["undefined"] == [(spec, tvm_only_undefined(spec))] and result["cases"] == 0
    assert not result["outputs"] and not result["partitions"]
    mod, inputs = build_batch([spec], "llvm")
    partitioned = partition_for_refcg(mod)
    stayed = {op: reason for op, _, reason in offload_report(partitioned).stayed}
    assert "ceil_mode window entirely outside" in stayed["nn.avg_pool2d"]
    want = run(build_and_load(mod, "llvm", tmp_path, "tvm_only"), inputs)[0]  # this one runs (no trap)
    got = run(build_and_load(partitioned, "llvm", tmp_path, "refcg"), inputs)[0]
    assert want.shape == got.shape == (2, 5, 6, 8)
    np.testing.assert_array_equal(got[:, :, :4], want[:, :, :4])  # all the garbage column does not reach


# Found 2026-11-30 by the CI fuzz draw (seed 0, tonearest). TVM-only cannot build it: LLVM module
# verification fails ("location of #dbg_declare must be a pointer or int") in the fused TONEAREST
# requantize of the broadcast add feeding the dense. TVM's bug: the harness isolates such chains
# (bisecting the batch), counts them apart and compares the rest.
DBG_DECLARE = dict(
    shape=(1, 10, 2, 8), layout="NHWC", dtype="int8", scale=2.2543704509735107, zp=-128, seed=2246, ops=[
        {"op": "binary", "kind": "add", "other": (1, 1, 8), "flip": False, "const": True,
         "o_scale": 0.0003791530034504831, "o_zp": -72, "out_scale": 0.08690851926803589, "out_zp": -27, "clip": None},
        {"op": "dense", "units": 14, "w_dtype": "int8", "kernel_zp": 96, "per_channel": True, "bias": None,
         "out_dtype": "int8", "out_scale": 0.0010858712485060096, "out_zp": 127, "rounding": "UPWARD", "clip": None}])


def test_tvm_only_llvm_verification_failure_is_counted_apart(tmp_path):
    spec = ChainSpec(**DBG_DECLARE)
    result = check_batch([spec], "tonearest", tmp_path)
    [(bad, error)] = result["unbuildable"]
    assert bad is spec and "LLVM module verification failed" in error and "dbg_declare" in error
    assert result["cases"] == 0 and not result["mismatches"]


def test_chains_around_an_unbuildable_one_are_compared_from_the_parts_built(tmp_path):
    """The bisection keeps the parts TVM-only could build instead of building the batch again; their
    outputs must be the ones a single TVM-only build of all those chains gives (inputs come from each
    chain's seed, not its position)."""
    [(good, numerics)] = fuzz_batches(3, 3, seed=5, numerics=st.just("tonearest"), chunk=3)
    specs = [good[0], ChainSpec(**DBG_DECLARE), *good[1:]]
    result = check_batch(specs, numerics, tmp_path)
    assert [bad for bad, _ in result["unbuildable"]] == [specs[1]]
    assert result["cases"] == 3 and not result["mismatches"]
    with relay.qnn.op.requantize_config(rounding="TONEAREST"):
        mod, inputs = build_batch(good, numerics)
        whole = run(build_and_load(mod, "llvm", tmp_path, "whole"), inputs)
    for (reference, _), want in zip(result["outputs"], whole, strict=True):
        np.testing.assert_array_equal(reference, want)
