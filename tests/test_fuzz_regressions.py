"""Cases ``make fuzz`` found, pasted as data (``ChainSpec`` fields), each with what it showed."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
import tvm
from tvm import relay

from arm.host import TARGET_DOTPROD, ensure_host, export_aarch64
from conftest import build_and_load, run
from fuzzing.chains import ALL_NUMERICS, ChainSpec, build_batch, fuzz_batches, tvm_only_undefined
from fuzzing.check import check_batch, refcg_build
from models import module
from refcodegen import RefcgError, offload_report, partition_for_refcg
from test_ops_common import compare, const, scale_loaded_marks

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


# Found 2026-12-01 by make fuzz-arm (seed 900, aarch64-dotprod): TVM-only's build of a batch raised
# ValueError ("too many values to unpack", topi/x86/batch_matmul.py: its schedule, which the arm_cpu
# strategy uses, on a batch_matmul fused with the reshape after it). The harness isolated only
# TVMError, IndexError and UnboundLocalError, so the whole batch of 20 went uncompared as a "build error".
BATCH_MATMUL_RESHAPE = dict(
    shape=(2, 7, 17, 5), layout="NHWC", dtype="uint8", scale=0.0032818394247442484, zp=201, seed=8008, ops=[
        {"op": "batch_matmul", "form": "broadcast", "m": 7, "n": 14, "y_dtype": "uint8", "y_zp": 128,
         "y_scale": 0.003733894322067499, "per_channel": False, "out_dtype": "uint8", "out_scale": 0.638675332069397,
         "out_zp": 189, "rounding": "UPWARD", "clip": [131, 227]},
        {"op": "copy", "kind": "reshape", "shape": [2, 7, 14, 1]},
        {"op": "conv2d", "out_c": 7, "kernel": [2, 1], "strides": [2, 1], "pad": [1, 0, 2, 0], "dilation": [2, 1],
         "padding": [1, 0, 2, 0], "groups": 7, "w_dtype": "uint8", "kernel_zp": 65, "per_channel": True, "bias": None,
         "bias_form": "bias_add", "out_dtype": "int32"}])


def test_a_python_exception_in_tvm_only_build_is_counted_apart(tmp_path):
    spec = ChainSpec(**BATCH_MATMUL_RESHAPE)
    result = check_batch([spec], "aarch64-dotprod", tmp_path)  # TVM-only fails: nothing reaches the emulator
    [(bad, error)] = result["unbuildable"]
    assert bad is spec and "ValueError" in error
    assert result["cases"] == 0 and not result["mismatches"]


@pytest.mark.slow  # make test-slow (CI): the fuzz's bisection, three builds of a batch
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


# Found 2026-12-01 by make fuzz (seed 1: float64, float32, float32-nofma; "max diff 1", 20 after a
# concatenate), a float input quantized per tensor. TVM's TIR simplifier rewrites x / c for a float
# constant c into x * (1.0 / c) (src/arith/rewrite_simplify.cc:775-780 at v0.19.0; the reciprocal is
# taken in double, then made float32), so TVM-only computes round(x * float32(1 / scale)): here
# 17.496006 * 2.1433... = 37.5 -> 38, while refcg's refcg_quantize_ref divides, x / scale = 37.499996
# -> 37. A per-axis scale is a tensor, not a constant TIR folds, so TVM divides there (as refcg does).
# Fixed: refcg multiplies by that reciprocal for a rank-0 scale (ops/quantize.quantize_divisor).
def test_per_tensor_quantize_rounds_like_tvm_multiplying_by_the_reciprocal(tmp_path):
    x = relay.var("x", shape=(3,), dtype="float32")
    y = relay.qnn.op.quantize(x, const(0.4665601849555969), const(0, "int32"), out_dtype="uint8")
    value = np.array([1099691986], "int32").view("float32")[0]  # 17.496006: x / scale = 37.499996 in float32
    compare(module([x], y), {"x": np.array([value, -value, 1.0], "float32")}, tmp_path)


# Found 2026-12-01 by make fuzz-arm (seed 1, aarch64-neon; +neon,+dotprod too): "max diff 255", and a
# dequantized float output behind the same conv. TVM-only is wrong there: on aarch64 its int8 NHWC conv
# (topi/arm_cpu/conv2d_gemm.py:111-113 at v0.19.0) makes the im2col of a 1x1 kernel a reshape of the
# input, ignoring the strides, so it reads the wrong pixels; refcg's result equals numpy's exact one
# and TVM-only x86's. The fuzz does not compare such chains on aarch64 (test_fuzz shows the difference
# on the emulated host).
STRIDED_1X1_NHWC = dict(
    shape=(2, 5, 13, 7), layout="NHWC", dtype="int8", scale=0.038758207112550735, zp=76, seed=10342385, ops=[
        {"op": "conv2d", "out_c": 10, "kernel": (1, 1), "strides": (2, 2), "pad": None, "dilation": (1, 1),
         "padding": (0, 0, 0, 0), "groups": 1, "w_dtype": "int8", "kernel_zp": 101, "per_channel": True,
         "bias": 1024, "bias_form": "bias_add", "out_dtype": "int8", "out_scale": 0.00390625, "out_zp": -128,
         "rounding": "UPWARD", "clip": None}])


def test_tvm_only_aarch64_strided_1x1_nhwc_conv_is_wrong_where_refcg_is_right(tmp_path):
    """On the emulated host (QEMU max): refcg's aarch64 result is x86 TVM-only's (numpy's exact one),
    TVM-only aarch64's is not. When TVM fixes its im2col, this fails: drop the exclusion then."""
    ensure_host()
    from fuzzing.arm import EmulatedHost

    mod, inputs = build_batch([ChainSpec(**STRIDED_1X1_NHWC)], "aarch64-dotprod")
    x86 = run(build_and_load(mod, "llvm", tmp_path, "x86"), inputs)[0]
    tvm_only = export_aarch64(mod, TARGET_DOTPROD, tmp_path / "tvm_only.so")
    refcg = export_aarch64(partition_for_refcg(mod, target=TARGET_DOTPROD), TARGET_DOTPROD, tmp_path / "refcg.so")
    host = EmulatedHost()
    try:
        emulated = host.runner("aarch64-dotprod")
        np.testing.assert_array_equal(emulated(refcg, inputs)[0], x86)
        assert (emulated(tvm_only, inputs)[0] != x86).sum() == 24  # of 420 (saturated values of the other sign)
    finally:
        host.close()


def test_tvm_only_aarch64_strided_1x1_nhwc_conv_is_not_compared():
    spec = ChainSpec(**STRIDED_1X1_NHWC)
    for numerics in ("aarch64-neon", "aarch64-dotprod"):
        assert "ignores its strides" in tvm_only_undefined(spec, numerics)
    assert tvm_only_undefined(spec, "llvm") is None  # x86 computes it right: compared there
    nchw = ChainSpec(**{**STRIDED_1X1_NHWC, "layout": "NCHW"})
    unstrided = ChainSpec(**{**STRIDED_1X1_NHWC, "ops": [{**STRIDED_1X1_NHWC["ops"][0], "strides": (1, 1)}]})
    assert tvm_only_undefined(nchw, "aarch64-neon") is None and tvm_only_undefined(unstrided, "aarch64-neon") is None


# Found 2026-12-01 by make fuzz-arm (seed 1, aarch64-neon): refcg refused to build an aarch64 module
# where a qnn.concatenate's result is read by an elementwise op (armfuse cannot tell which TVM kernel
# requantizes the concatenate's inputs, so whether it rounds with NEON). partition_for_refcg given the
# aarch64 target now asks armfuse and leaves such composites in TVM with that reason.
CONCAT_INTO_MUL = dict(
    shape=(1, 2, 17, 5), layout="NCHW", dtype="uint8", scale=0.5, zp=255, seed=5691, ops=[
        {"op": "concat", "axis": 2, "extra": 1, "o_scale": 2.0000100135803223, "o_zp": 255,
         "out_scale": 0.06526513397693634, "out_zp": 0},
        {"op": "binary", "kind": "mul", "other": (1, 5), "flip": False, "const": True, "o_scale": 0.015790274366736412,
         "o_zp": 0, "out_scale": 0.00392521545290947, "out_zp": 255, "clip": (149, 160)}])


# Found the same day, same run: a qnn.mul whose result a refcg.copy op reads (here maximum with a
# constant; a split too): "it feeds a refcg.copy kernel".
BINARY_INTO_COPY = dict(
    shape=(1, 6), layout="", dtype="uint8", scale=0.003561475547030568, zp=215, seed=6993, ops=[
        {"op": "binary", "kind": "mul", "other": (1,), "flip": True, "const": True, "o_scale": 0.6623316407203674,
         "o_zp": 0, "out_scale": 0.0035409298725426197, "out_zp": 206, "clip": None},
        {"op": "copy", "kind": "maximum", "value": 242, "flip": True}])

# Found 2026-12-02 by make fuzz-arm on 338c813 (seed 3500, aarch64-dotprod; +neon too): max diff 1. A float
# softmax left in TVM -> quantize -> per-channel requantize -> qnn.add, the last three offloaded. nn.softmax is
# an anchor (kOutEWiseFusable): TVM-only grows its kernel through the quantize and the requantize into the
# add's requantize of them, whose NEON rounding follows the softmax's loop; armfuse stopped at the quantize
# (not elementwise to it) and took the add's own injective loop. Now the anchor search passes through
# quantize and lut composites and stops, unknown, at an operand TVM computes outside the partition.
SOFTMAX_INTO_ADD = dict(
    shape=(1, 9, 17, 4), layout="NHWC", dtype="uint8", scale=0.0007671861094422638, zp=0, seed=649751, ops=[
        {"op": "softmax", "form": "float", "out_dtype": "int8", "out_scale": 0.001204618951305747, "out_zp": 127},
        {"op": "requantize", "axis": 0, "per_channel": True, "out_dtype": "uint8", "out_scale": 0.09926877170801163,
         "out_zp": 18, "rounding": "TONEAREST", "clip": None},
        {"op": "binary", "kind": "add", "other": (9, 17, 1), "flip": True, "const": False,
         "o_scale": 0.000675660849083215, "o_zp": 180, "out_scale": 0.02964569255709648, "out_zp": 255, "clip": None}])

ARM_REFUSED = [(CONCAT_INTO_MUL, "qnn.concatenate", "concatenated into a tensor"),
               (BINARY_INTO_COPY, "qnn.mul", "feeds a refcg.copy kernel"),
               (SOFTMAX_INTO_ADD, "qnn.add", "computed by TVM outside the partition")]


@pytest.mark.parametrize("found,op,why", ARM_REFUSED, ids=["concat", "copy", "softmax"])
def test_aarch64_rounding_refcg_cannot_tell_stays_in_tvm(found, op, why):
    spec = ChainSpec(**found)
    mod = build_batch([spec], "aarch64-neon")[0]
    report = offload_report(partition_for_refcg(mod, target=ALL_NUMERICS["aarch64-neon"][0]))
    reasons = [reason for name, _, reason in report.stayed if name == op]
    assert reasons and all(r.startswith("aarch64 rounding: cannot tell") and why in r for r in reasons), report
    for merge in (False, True):  # merging partitions (the fuzz's speed-up) does not bring it back
        refcg_build([spec], "aarch64-neon", merge=merge)
    # the codegen's guard: partitioned without the target, the aarch64 build refuses instead of miscomputing
    # (the float softmax, offloaded then, is refused first: it is reproduced for x86 only)
    with pytest.raises(RefcgError, match="cannot tell whether TVM-only rounds|reproduced for x86 llvm targets only"):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(mod), target=ALL_NUMERICS["aarch64-neon"][0])
    assert not any(name == op for name, _, _ in offload_report(partition_for_refcg(mod)).stayed)


# Found 2026-12-02 by make fuzz-arm on c778bfb (seed 8100, aarch64-neon): max diff 3219 in the int32 result.
# qnn.leaky_relu stays in TVM on aarch64 (its table needs an aarch64 host); TVM-only computes it, the
# hardswish table and the reshape in one kernel whose loop vectorizes the reshape's last axis (3: scalar,
# the exact rounding). With those two offloaded, TVM's kernel of the leaky_relu alone vectorized its own
# last axis (4 lanes: NEON's double rounding). Now what TVM-only fuses with a requantizing op left in TVM
# stays with it (armfuse.tvm_kernel_mates).
LEAKY_INTO_TABLE = dict(
    shape=(2, 9, 1, 4), layout="NHWC", dtype="uint8", scale=0.15072400867938995, zp=193, seed=10, shared=True, ops=[
        {"op": "lut", "form": "qnn.leaky_relu", "alpha": 0.2, "out_dtype": "uint8", "out_scale": 0.36297130584716797,
         "out_zp": 255},
        {"op": "lut", "form": "qnn.hardswish", "alpha": 0.1, "out_dtype": "uint8", "out_scale": 0.00390625, "out_zp": 128},
        {"op": "batch_matmul", "form": "self", "m": 12, "n": 12, "y_dtype": "uint8", "y_zp": 128, "y_scale": 0.00390625,
         "per_channel": True, "out_dtype": "int32"}])


# Found the same run (seed 8100, aarch64-neon): a float result 1 quantum off (max diff 1028111915 in its
# bits). qnn.softmax (left in TVM on aarch64) requantizes in its canonical form too (softmax.cc); TVM-only
# computes its last stage and the dequantize in one kernel, the refcg build the softmax alone.
SOFTMAX_INTO_DEQUANTIZE = dict(
    shape=(1, 16), layout="", dtype="int8", scale=0.0014960251282900572, zp=0, seed=57, shared=True, ops=[
        {"op": "softmax", "form": "qnn", "in_scale": 0.0074567836709320545, "out_dtype": "int8",
         "out_scale": 0.04876534268260002, "out_zp": -128},
        {"op": "dequantize", "axis": -1, "per_axis": False}])


@pytest.mark.parametrize("found,left,mates", [(LEAKY_INTO_TABLE, "qnn.leaky_relu", ("qnn.hardswish", "reshape")),
                                              (SOFTMAX_INTO_DEQUANTIZE, "qnn.softmax", ("qnn.dequantize",))],
                         ids=["leaky_relu", "softmax"])
def test_what_tvm_only_fuses_with_a_requantizing_op_left_in_tvm_stays_with_it(tmp_path, found, left, mates):
    spec = ChainSpec(**found)
    mod = build_batch([spec], "aarch64-neon")[0]
    report = offload_report(partition_for_refcg(mod, target=ALL_NUMERICS["aarch64-neon"][0]))
    reasons = {name: reason for name, _, reason in report.stayed}
    assert not reasons[left].startswith("aarch64 rounding"), report  # left in TVM for a reason of its own
    for op in mates:
        assert f"{left} left in TVM" in reasons[op], report
    # batched with an independent chain (as the fuzz builds them), that chain's conv stays offloaded
    conv = ChainSpec(**{**STRIDED_1X1_NHWC, "ops": [{**STRIDED_1X1_NHWC["ops"][0], "strides": (1, 1)}]})
    both = build_batch([spec, conv], "aarch64-neon")[0]
    report = offload_report(partition_for_refcg(both, target=ALL_NUMERICS["aarch64-neon"][0]))
    assert report.offloaded_ops.get("qnn.conv2d") == 1, report
    x86 = offload_report(partition_for_refcg(mod, target="llvm"))  # no NEON: the x86 build offloads all
    assert not x86.stayed, x86
    ensure_host()
    from fuzzing.arm import EmulatedHost

    host = EmulatedHost()
    try:
        result = check_batch([spec], "aarch64-neon", tmp_path, merge=True, runner=host.runner("aarch64-neon"))
    finally:
        host.close()
    assert result["cases"] == 1 and not result["mismatches"], result


# Found 2026-12-02 by make fuzz-arm on 65a9ae8 (seed 10100, aarch64-dotprod): max diff 21. The cast to int8 of a
# uint8 qnn.quantize stays in TVM (consumers._float_casts_after_quantize: TVM-only converts the clipped float
# straight to int8, undefined in LLVM above 127); the concatenate TVM-only computes in the cast's kernel was
# offloaded, so TVM computed the cast in a kernel of its own, whose code decided the out-of-range values
# differently. Now what TVM-only fuses with such a cast stays with it, on every target.
CAST_INTO_CONCAT = dict(
    shape=(3, 16), layout="", dtype="uint8", scale=0.006117112934589386, zp=128, seed=636, shared=False, ops=[
        {"op": "lut", "form": "sigmoid", "alpha": 0.2, "out_dtype": "uint8", "out_scale": 0.2850102186203003,
         "out_zp": 128},
        {"op": "copy", "kind": "cast", "dtype": "int8"},
        {"op": "concat", "axis": 1, "extra": 1, "o_scale": 0.5, "o_zp": 0, "out_scale": 0.041251178830862045,
         "out_zp": -128}])


@pytest.mark.parametrize("numerics", ["llvm", "aarch64-dotprod"])
def test_what_tvm_only_fuses_with_an_undefined_cast_left_in_tvm_stays_with_it(tmp_path, numerics):
    spec = ChainSpec(**CAST_INTO_CONCAT)
    mod = build_batch([spec], numerics)[0]
    report = offload_report(partition_for_refcg(mod, target=ALL_NUMERICS[numerics][0]))
    reasons = {name: reason for name, _, reason in report.stayed}
    assert "cast to int8 left in TVM" in reasons["qnn.concatenate"], report
    runner = None
    if numerics != "llvm":
        ensure_host()
        from fuzzing.arm import EmulatedHost

        host = EmulatedHost()
        runner = host.runner(numerics)
    try:
        result = check_batch([spec], numerics, tmp_path, merge=True, **({"runner": runner} if runner else {}))
    finally:
        if runner:
            host.close()
    assert result["cases"] == 1 and not result["mismatches"], result


def test_partitioned_without_the_target_an_aarch64_build_refuses_what_tvm_only_fuses_with_a_tvm_op(monkeypatch):
    """Without target=, the leaky_relu's table is computable (x86) and offloaded; made to stay in TVM as
    on aarch64, the composites TVM-only fuses with it are marked and the aarch64 build refuses them."""
    import refcodegen.lut as tables

    real = tables.cannot_compute
    monkeypatch.setattr(tables, "cannot_compute",
                        lambda name, target: "kept in TVM by this test" if name == "qnn.leaky_relu" else real(name, target))
    mod = build_batch([ChainSpec(**LEAKY_INTO_TABLE)], "aarch64-neon")[0]
    partitioned = partition_for_refcg(mod)
    assert {name for name, _, _ in offload_report(partitioned).stayed} == {"qnn.leaky_relu"}
    with pytest.raises(RefcgError, match="requantizing op left in TVM.*pass target="):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partitioned, target=ALL_NUMERICS["aarch64-neon"][0])
    with tvm.transform.PassContext(opt_level=3):
        relay.build(partitioned, target="llvm")  # x86: no NEON rounding, nothing to refuse


def test_aarch64_rounding_refusals_are_bit_exact_on_the_emulated_host(tmp_path):
    """The chains armfuse cannot tell, amid two it can, against TVM-only aarch64 (QEMU cortex-a53)."""
    ensure_host()
    from fuzzing.arm import EmulatedHost

    [(good, _)] = fuzz_batches(2, 2, seed=3, numerics=st.just("aarch64-neon"), chunk=2)
    specs = [good[0], *(ChainSpec(**found) for found, _, _ in ARM_REFUSED), good[1]]
    host = EmulatedHost()
    try:
        result = check_batch(specs, "aarch64-neon", tmp_path, merge=True, runner=host.runner("aarch64-neon"))
    finally:
        host.close()
    assert result["cases"] == 2 + len(ARM_REFUSED) and not result["refcg build errors"] and not result["mismatches"], result
    assert {op for _, op, _ in ARM_REFUSED} <= {name for name, _, _ in result["stayed"]}


# Found 2026-12-01 by make fuzz (seed 2, llvm; make fuzz-arm too): a cast int8 -> uint8 (refcg.copy,
# wrapping) read by a per-axis qnn.dequantize: the float outputs differ in sign (34 of 54). TVM-only's
# SimplifyConsecutiveCast (src/relay/transforms/simplify_expr.cc:112-156 at v0.19.0) takes int8 ->
# uint8 for a widening cast (IsWidenCast: int before uint, bits <=) and folds it into the int32 cast
# the dequantize lowers to: TVM-only computes (x - zp) * scale on the int8 value, without the wrap.
# Measured alongside: cast -> qnn.add differs the same way, cast -> per-tensor dequantize, requantize,
# qnn.dense or cast(int32) in the same module did not (the fold depends on the graph around the cast).
CAST_INTO_DEQUANTIZE = dict(
    shape=(3, 18), layout="", dtype="int8", scale=0.04456445202231407, zp=-128, seed=179, ops=[
        {"op": "copy", "kind": "cast", "dtype": "uint8"}, {"op": "dequantize", "axis": -1, "per_axis": True}])


# The fix: such a cast (base.folded_cast) and any composite reading it stay in TVM, which folds them
# as TVM-only does.
FOLDED = "SimplifyConsecutiveCast drops it before a following cast"
READS_FOLDED = "reads a cast int8 -> uint8 that TVM's SimplifyConsecutiveCast folds"


def test_cast_to_unsigned_before_a_dequantize_matches_tvm(tmp_path):
    result = check_batch([ChainSpec(**CAST_INTO_DEQUANTIZE)], "llvm", tmp_path)
    assert result["cases"] == 1 and not result["mismatches"], result["mismatches"]
    stayed = {op: reason for op, _, reason in result["stayed"]}
    assert FOLDED in stayed["cast"] and READS_FOLDED in stayed["qnn.dequantize"], stayed


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_cast_to_unsigned_and_its_consumers_stay_in_tvm(tmp_path, rng, numerics):
    """cast int8 -> uint8 read by qnn.add, cast(int32), qnn.conv2d and qnn.dequantize: the casts and
    those consumers stay in TVM (reasons naming SimplifyConsecutiveCast), what follows is offloaded,
    bit-exact with TVM-only on every int8 value."""
    every = np.arange(-128, 128).astype("int8")  # 1x4x8x8: every int8 value once
    xs = [relay.var(f"x{i}", shape=(1, 4, 8, 8), dtype="int8") for i in range(4)]
    inputs = {x.name_hint: rng.permutation(every).reshape(1, 4, 8, 8) for x in xs}
    other = relay.var("other", shape=(1, 4, 8, 8), dtype="uint8")
    inputs["other"] = rng.integers(0, 256, (1, 4, 8, 8)).astype("uint8")
    casts = [relay.cast(x, "uint8") for x in xs]
    added = relay.qnn.op.add(casts[0], other, const(0.05), const(128, "int32"), const(0.04), const(120, "int32"),
                             const(0.1), const(128, "int32"))
    wide = relay.cast(casts[1], "int32")
    weight = relay.const(rng.integers(-127, 128, (8, 4, 3, 3)).astype("int8"))
    conv = relay.qnn.op.conv2d(casts[2], weight, const(128, "int32"), const(0, "int32"), const(0.05), const(0.01),
                               kernel_size=(3, 3), channels=8, padding=(1, 1))
    outputs = [relay.qnn.op.requantize(added, const(0.1), const(128, "int32"), const(0.07), const(3, "int32"),
                                       out_dtype="int8"),
               relay.clip(relay.add(wide, const(5, "int32")), -100, 300),
               relay.qnn.op.requantize(conv, const(0.0005), const(0, "int32"), const(0.05), const(0, "int32"),
                                       out_dtype="int8"),
               relay.reinterpret(relay.qnn.op.dequantize(casts[3], const([0.1, 0.2, 0.3, 0.4]),
                                                         const(128, "int32"), axis=1), "int32")]
    partitioned = compare(module([*xs, other], relay.Tuple(outputs)), inputs, tmp_path, numerics)
    report = offload_report(partitioned)
    stayed = [(op, reason) for op, _, reason in report.stayed]
    assert sum(op == "cast" and FOLDED in reason for op, reason in stayed) == 4, str(report)
    for op in ("qnn.add", "cast", "qnn.conv2d", "qnn.dequantize"):
        assert any(o == op and READS_FOLDED in reason for o, reason in stayed), (op, str(report))
    assert report.offloaded_ops["qnn.requantize"] == 2, str(report)


# Found 2026-12-02 by make fuzz-arm (seed 2500, aarch64-neon; every numerics): "max diff 200". A conv whose
# requantize ends in clip [-58, -34], then cast int8 -> uint8, then a per-channel qnn.requantize. The
# cast and the requantize stayed in TVM (FOLDED, READS_FOLDED), but the clip went into the conv's kernel.
# TVM-only, seeing clip -> cast -> the requantize's cast (SimplifyClipAndConsecutiveCast, then
# SimplifyConsecutiveCast) computes from the int8 value; after refcg's kernel, TVM's graph starts at the
# cast, which it keeps, and the requantize read the wrapped value (-50 -> 206). The fix
# (consumers._clips_before_folded_casts): a clip feeding such a cast stays in TVM with it.
CLIP_CAST_REQUANTIZE = dict(
    shape=(1, 11, 5, 8), layout="NCHW", dtype="uint8", scale=0.0036387834697961807, zp=128, seed=73625147,
    shared=True, ops=[
        {"op": "conv2d", "out_c": 12, "kernel": (1, 3), "strides": (1, 3), "pad": None, "dilation": (1, 1),
         "padding": (0, 0, 2, 0), "groups": 1, "w_dtype": "int8", "kernel_zp": 97, "per_channel": True,
         "bias": 65536, "bias_form": "bias_add", "out_dtype": "int8", "out_scale": 0.00048828125, "out_zp": -128,
         "rounding": "None", "clip": (-58, -34)},
        {"op": "copy", "kind": "cast", "dtype": "uint8"},
        {"op": "requantize", "axis": 2, "per_channel": True, "out_dtype": "int16", "out_scale": 0.001190889859572053,
         "out_zp": 118, "rounding": "TONEAREST", "clip": (-13888, 32767)}])


def test_a_clip_before_a_cast_to_unsigned_stays_with_it(tmp_path):
    result = check_batch([ChainSpec(**CLIP_CAST_REQUANTIZE)], "llvm", tmp_path)
    assert result["cases"] == 1 and not result["mismatches"], result["mismatches"]
    stayed = {op: reason for op, _, reason in result["stayed"]}
    assert "SimplifyClipAndConsecutiveCast reads the clip's bounds" in stayed["clip"], stayed
    assert result["composites"]["refcg.conv2d"] == 1, result["composites"]


# Found 2026-12-02 by make fuzz (seed 2001, float32-nofma; float32 too, not llvm): "max diff 85". A
# batch_matmul of a tensor with itself (accumulators up to 6.5e6) requantized by a ratio of 448: the
# value (2.9e9) passes int32. TVM's float requantize converts it with LLVM's fptosi, undefined there:
# TVM-only's skylake code came out clamped to the high bound, refcg (the x86 conversion) at INT32_MIN,
# then the low one. The fix (epilogue.float_conversion_reason): such a requantize stays in TVM under
# float numerics, or when the partition does not know the target.
SELF_BATCH_MATMUL_PAST_INT32 = dict(
    shape=(1, 10, 13, 11), layout="NHWC", dtype="int8", scale=0.8155822157859802, zp=112, seed=3371, ops=[
        {"op": "batch_matmul", "form": "self", "m": 5, "n": 5, "y_dtype": "int8", "y_zp": 112,
         "y_scale": 0.8155822157859802, "per_channel": False, "out_dtype": "int8",
         "out_scale": 0.0014855788322165608, "out_zp": -128, "rounding": "UPWARD", "clip": (-49, 36)},
        {"op": "copy", "kind": "reshape", "shape": [1, 1, 5, 5]}])


def test_a_float_requantize_past_int32_stays_in_tvm(tmp_path):
    result = check_batch([ChainSpec(**SELF_BATCH_MATMUL_PAST_INT32)], "float32-nofma", tmp_path)
    assert result["cases"] == 1 and not result["mismatches"], result["mismatches"]
    stayed = {op: reason for op, _, reason in result["stayed"]}
    assert "past int32, where TVM-only's conversion is undefined" in stayed["qnn.batch_matmul"], stayed


# Found 2026-12-01 by make fuzz-arm (seed 500, aarch64-neon): the worker died (SIGABRT). LLVM asserts
# ("CastInst::Create ... Invalid cast!") while TVM compiles this NHWC uint8 conv (one output channel,
# dilation (1, 2)) for aarch64; refcg leaves the whole chain in TVM there (the conv feeds a concatenate
# armfuse cannot decide), so its build aborts too. TVM's bug: the fuzz's triage counts the chain as one
# that kills TVM-only, not compared.
KILLS_TVM_AARCH64 = dict(
    shape=(2, 9, 7, 7), layout="NHWC", dtype="uint8", scale=0.0023907942231744528, zp=0, seed=19513, ops=[
        {"op": "conv2d", "out_c": 1, "kernel": (2, 1), "strides": (2, 1), "pad": None, "dilation": (1, 2),
         "padding": (1, 2, 1, 0), "groups": 1, "w_dtype": "int8", "kernel_zp": 0, "per_channel": False,
         "bias": None, "bias_form": "bias_add", "out_dtype": "uint8", "out_scale": 0.4798126816749573,
         "out_zp": 33, "rounding": "None", "clip": (193, 246)},
        {"op": "concat", "axis": 0, "extra": 1, "o_scale": 0.015625, "o_zp": 255, "out_scale": 0.18422052264213562,
         "out_zp": 128},
        {"op": "copy", "kind": "maximum", "value": 227, "flip": True}])


def test_a_chain_whose_tvm_only_build_aborts_is_triaged_as_tvms(tmp_path):
    import pickle
    import signal
    import subprocess
    import sys

    path = tmp_path / "batch.pickle"
    path.write_bytes(pickle.dumps(([ChainSpec(**KILLS_TVM_AARCH64)], "aarch64-neon")))
    done = subprocess.run([sys.executable, "-m", "fuzzing", "--replay", str(path), "tvm-only"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGABRT and "Invalid cast" in done.stderr, done.stderr[-2000:]
    with tvm.transform.PassContext(opt_level=3):
        report = offload_report(partition_for_refcg(build_batch([ChainSpec(**KILLS_TVM_AARCH64)], "aarch64-neon")[0],
                                                    target=ALL_NUMERICS["aarch64-neon"][0]))
    assert not report.partitions and all(reason.startswith("aarch64 rounding") for _, _, reason in report.stayed)


# Found 2026-12-01 by the zoo test (torchvision ShuffleNetV2, 1 output LSB): its head is dequantize ->
# float mean over H, W -> qnn.quantize, both qnn ops reading ONE scale constant (PyTorch's importer).
# A reduction in between keeps FuseOps from putting the constant in the kernel, so TVM-only loads it
# and divides by it, where a quantize whose rank-0 scale is inlined multiplies by the reciprocal
# (consumers._loaded_scale_readers). With equal scales the means land on x.5 ties the two round apart.
SCALE = 0.04327251


def mean_head(shared: bool):
    x = relay.var("x", shape=(1, 1024, 2, 2), dtype="uint8")
    scale = const(SCALE)
    mean = relay.mean(relay.qnn.op.dequantize(x, scale, const(0, "int32")), axis=[2, 3])
    y = relay.qnn.op.quantize(mean, scale if shared else const(SCALE), const(0, "int32"), out_dtype="uint8")
    w = relay.const(np.random.default_rng(0).integers(-8, 8, (16, 1024)).astype("int8"))
    y = relay.qnn.op.dense(y, w, const(0, "int32"), const(0, "int32"), const(SCALE), const(0.01), units=16)
    return module([x], y), mean


TIES = np.random.default_rng(0).integers(0, 256, (1, 1024, 2, 2)).astype("uint8")


@pytest.mark.parametrize("shared", [True, False])
def test_a_quantize_whose_scale_a_dequantize_reads_across_a_mean_divides(tmp_path, shared):
    mod, _ = mean_head(shared)
    partitioned = compare(mod, {"x": TIES}, tmp_path)  # shared: failed (max diff 12 after the dense) before
    assert offload_report(partitioned).offloaded_ops["qnn.quantize"] == 1
    assert scale_loaded_marks(partitioned) == int(shared)


def test_the_mean_head_data_rounds_ties_apart(tmp_path):
    """The data above reaches the case: dividing by the scale and multiplying by its reciprocal round
    some of its means apart."""
    mod, mean = mean_head(True)
    means = run(build_and_load(module([mod["main"].params[0]], mean), "llvm", tmp_path, "mean"), {"x": TIES})[0]
    scale = np.float32(SCALE)
    divided = np.floor(means / scale + np.float32(0.5))
    multiplied = np.floor(means * np.float32(1.0 / np.float64(scale)) + np.float32(0.5))
    assert (divided != multiplied).sum() >= 5


# Found 2026-12-01 by the x86 campaign on be352ce (float64 numerics, max diff 252): a float input
# quantized to int8, then cast to uint8. TVM's SimplifyClipAndConsecutiveCast drops the quantize's own
# cast to int8, so TVM-only casts the clipped float straight to uint8 (negative values: undefined).
CAST_AFTER_QUANTIZE = dict(shape=(2, 4, 1, 6), layout="NCHW", dtype="float32", scale=0.0013613156042993069, zp=127,
                           ops=[{"op": "quantize", "axis": -1, "per_axis": False, "out_dtype": "int8",
                                 "out_scale": 0.0015775889623910189, "out_zp": 110},
                                {"op": "copy", "kind": "cast", "dtype": "uint8"}], seed=270207)


@pytest.mark.parametrize("numerics", ["llvm", "float64"])
def test_a_quantize_whose_result_is_cast_to_another_8_bit_type_stays_in_tvm(tmp_path, numerics):
    result = check_batch([ChainSpec(**CAST_AFTER_QUANTIZE)], numerics, tmp_path)
    assert result["mismatches"] == [] and result["cases"] == 1, result
    assert [op for op, _, reason in result["stayed"] if "SimplifyClipAndConsecutiveCast" in reason] == ["qnn.quantize"]


# Found 2026-12-02 by make fuzz (seed 21001, llvm, on 0661812): "max diff 183". A float softmax's quantize
# to uint8 (values 200..206), then cast int32, then cast int8. TVM's SimplifyClipAndConsecutiveCast drops
# every cast of clip -> cast -> ... -> cast whose type holds the clip's [0, 255] (the quantize's uint8,
# then int32), so TVM-only converts the clipped float straight to int8 (200 -> 127, saturated), where
# refcg's uint8 went through int32 and wrapped (200 -> -56). consumers._float_casts_after_quantize
# followed only a cast right after the quantize; it now follows the casts TVM drops.
QUANTIZE_WIDE_NARROW = dict(
    shape=(2, 11, 4, 13), layout="NCHW", dtype="float32", scale=0.00045447368756867945, zp=252, seed=635, ops=[
        {"op": "quantize", "axis": -1, "per_axis": False, "out_dtype": "uint8", "out_scale": 0.0005427367868833244,
         "out_zp": 6},
        {"op": "softmax", "form": "float", "out_dtype": "uint8", "out_scale": 0.16694092750549316, "out_zp": 200},
        {"op": "copy", "kind": "cast", "dtype": "int32"}, {"op": "copy", "kind": "cast", "dtype": "int8"}])


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_a_quantize_cast_wide_then_narrow_stays_in_tvm(tmp_path, numerics):
    result = check_batch([ChainSpec(**QUANTIZE_WIDE_NARROW)], numerics, tmp_path)
    assert result["cases"] == 1 and not result["mismatches"], result["mismatches"]
    stayed = [(op, reason) for op, _, reason in result["stayed"]]
    through = "feeds a cast to int8 (through int32), which TVM-only applies to the clipped float"
    assert sum(op == "cast" and through in reason for op, reason in stayed) == 2, stayed
    assert any(op == "qnn.quantize" and through in reason for op, reason in stayed), stayed


# Found 2026-12-02 by make fuzz (seed 21000, float32-nofma, on 0661812): refcg's build failed in TVM's
# LLVM codegen ("location of #dbg_declare must be a pointer or int": TVM 0.19 declares debug info for
# every let-bound var, and LLVM 22 rejects a float one, which CSE made of the per-axis dequantize inside
# the resize kernel). TVM-only keeps the dequantize in the conv's kernel (a kOutEWiseFusable group takes
# no injective consumer), where refcg had left it in TVM to fuse into the resize. A dequantize ending
# TVM-only's conv/dense kernel is now offloaded: its float result is materialized there too.
DEQUANTIZE_AXIS1_RESIZE = dict(
    shape=(1, 7, 10, 6), layout="NHWC", dtype="int8", scale=0.003889544168487191, zp=-126, seed=2900, ops=[
        {"op": "conv2d", "out_c": 12, "kernel": [1, 4], "strides": [1, 2], "pad": None, "dilation": [1, 1],
         "padding": [0, 0, 1, 1], "groups": 3, "w_dtype": "int8", "kernel_zp": 0, "per_channel": True,
         "bias": 16777216, "bias_form": "bias_add", "out_dtype": "uint8", "out_scale": 0.0035163145512342453,
         "out_zp": 88, "rounding": "TONEAREST", "clip": None},
        {"op": "qdq", "dq_axis": 1, "dq_per_axis": True, "q_axis": 0, "q_per_axis": True, "out_dtype": "uint8",
         "out_scale": 1.0770384073257446, "out_zp": 0, "between": "resize", "size": [5, 2]}])


# On an FMA target the conv stays in TVM (stagewise.py) and the dequantize with it.
@pytest.mark.parametrize("numerics,dequantize", [("float32-nofma", "refcg"), ("llvm", "refcg"), ("float32", "TVM")])
def test_a_dequantize_ending_a_conv_kernel_leaves_tvm_with_it(tmp_path, numerics, dequantize):
    result = check_batch([ChainSpec(**DEQUANTIZE_AXIS1_RESIZE)], numerics, tmp_path)
    assert result["cases"] == 1 and not result["mismatches"] and not result["refcg build errors"], result
    stayed = [op for op, _, _ in result["stayed"]]
    assert "image.resize2d" in stayed and ("qnn.dequantize" in stayed) == (dequantize == "TVM"), stayed


# Found 2026-12-02 by make fuzz (seed 23000, float64, on 03417b9): "max diff 10679" on an int32 output.
# qnn.batch_matmul of x (2, 1, 8) uint8 and a broadcast y (1, 16, 8) int8: TVM's x86 batch_matmul_int8
# (N % 16 == K % 4 == 0) indexes y's packed copy by x's batch and reads past it for batch 1. refcg
# already leaves that op in TVM (ops/batch_matmul.py), so both builds read whatever lies there.
BROADCAST_BMM = dict(
    shape=(2, 8), layout="", dtype="uint8", scale=0.47646310925483704, zp=254, seed=61871, ops=[
        {"op": "requantize", "axis": 1, "per_channel": False, "out_dtype": "uint8", "out_scale": 0.5277434587478638,
         "out_zp": 59, "rounding": "UPWARD", "clip": (7, 240)},
        {"op": "batch_matmul", "form": "broadcast", "m": 1, "n": 16, "y_dtype": "int8", "y_zp": -127,
         "y_scale": 0.0017382049700245261, "per_channel": True, "out_dtype": "int32"}])


def test_tvm_only_x86_broadcast_batch_matmul_int8_is_wrong(tmp_path):
    """TVM-only's batch 1 is not the exact product. When TVM fixes it, this fails: drop the exclusion."""
    x = relay.var("x", shape=(2, 1, 8), dtype="uint8")
    y = relay.var("y", shape=(1, 16, 8), dtype="int8")
    bmm = relay.qnn.op.batch_matmul(x, y, const(3, "int32"), const(-127, "int32"), const(0.5), const(0.25))
    rng = np.random.default_rng(0)
    inputs = {"x": rng.integers(0, 256, (2, 1, 8)).astype("uint8"), "y": rng.integers(-128, 128, (1, 16, 8)).astype("int8")}
    got = run(build_and_load(module([x, y], bmm), "llvm", tmp_path, "bmm"), inputs)[0]
    want = np.einsum("bmk,nk->bmn", inputs["x"].astype(np.int64) - 3, inputs["y"][0].astype(np.int64) + 127)
    np.testing.assert_array_equal(got[0], want[0])  # batch 0 reads y's own packed copy
    assert (got[1] != want[1]).any()


def test_tvm_only_x86_broadcast_batch_matmul_int8_is_not_compared(tmp_path):
    spec = ChainSpec(**BROADCAST_BMM)
    assert "batch_matmul_int8" in tvm_only_undefined(spec, "float64")
    assert tvm_only_undefined(spec, "aarch64-neon") is None
    n15 = ChainSpec(**{**BROADCAST_BMM, "ops": [BROADCAST_BMM["ops"][0], {**BROADCAST_BMM["ops"][1], "n": 15}]})
    assert tvm_only_undefined(n15, "float64") is None  # not the packed kernel: compared
    result = check_batch([spec], "float64", tmp_path)
    assert result["cases"] == 0 and len(result["undefined"]) == 1, result
