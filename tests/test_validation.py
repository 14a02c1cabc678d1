"""Bad or unusual input: each case keeps the op in TVM with a reason in the offload report, or
raises a ``RefcgError`` naming op, attribute and reason. Where TVM-only can build the graph, the
fallback result equals TVM-only; nothing runs wrong."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import compare_with_tvm, load, random_int, run, stays_in_tvm
from models import module, qconv_block
from refcodegen import RefcgError, objcache, offload_report, partition_for_refcg
from refcodegen.partition import refcg_functions
from test_ops_common import const, qadd, qparams, reason_for


def qconv(x, weight, *, input_zp=0, kernel_zp=0, input_scale=0.05, kernel_scale=0.01, layout="NCHW", **attrs):
    """qnn.conv2d + qnn.requantize to int8 on raw (possibly hostile) arguments."""
    kernel_layout = {"NCHW": "OIHW", "NHWC": "HWIO"}[layout]
    w = weight if isinstance(weight, relay.Expr) else relay.const(weight)
    out_c = w.checked_type.shape[kernel_layout.index("O")] if isinstance(weight, relay.Expr) else weight.shape[
        kernel_layout.index("O")]
    scale = lambda v: v if isinstance(v, relay.Expr) else const(v)  # noqa: E731
    zp = lambda v: v if isinstance(v, relay.Expr) else const(v, "int32")  # noqa: E731
    y = relay.qnn.op.conv2d(x, w, zp(input_zp), zp(kernel_zp), scale(input_scale), scale(kernel_scale),
                            kernel_size=weight.shape[2:] if layout == "NCHW" else weight.shape[:2],
                            channels=int(out_c), data_layout=layout, kernel_layout=kernel_layout, **attrs)
    return relay.qnn.op.requantize(y, const(0.0005), const(0, "int32"), const(0.1), const(0, "int32"))


def weights(rng, shape, dtype="int8"):
    return random_int(rng, shape, dtype)


# ---- shapes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [relay.Any(), tvm.tir.Var("n", "int64")], ids=["any", "symbolic"])
def test_dynamic_or_symbolic_shapes_stay_in_tvm(rng, dim):
    x = relay.var("x", shape=(dim, 4, 6, 6), dtype="int8")
    assert "shapes must be static" in reason_for(module([x], qconv(x, weights(rng, (4, 4, 3, 3)))), "qnn.conv2d")
    a = relay.var("a", shape=(dim, 8), dtype="int8")
    assert "lhs shape must be static" in reason_for(module([a], qadd(a, a)), "qnn.add")


def test_batch_above_one_runs_in_refcg(tmp_path, rng):
    """Batch 3 through conv, pool and dense (a flatten in front): offloaded, bit-exact."""
    x = relay.var("x", shape=(3, 4, 6, 6), dtype="int8")
    y = qconv_block(x, rng, in_c=4, out_c=6, clip=(-128, 127))
    y = relay.nn.max_pool2d(y, (2, 2), (2, 2))
    y = relay.nn.batch_flatten(y)
    y = relay.qnn.op.dense(y, relay.const(weights(rng, (5, 54))), const(0, "int32"), const(0, "int32"),
                           const(0.1), const(0.01), units=5)
    partitioned = compare_with_tvm(module([x], y), {"x": random_int(rng, (3, 4, 6, 6), "int8")}, tmp_path,
                                   expect_partitions=1)
    assert not [op for op in offload_report(partitioned).stayed_ops if op != "tuple"]


def test_ranks_the_kernels_do_not_take_stay_in_tvm(rng):
    """qnn.add on rank 7 and with a rank-0 output (scalars on both sides; one scalar operand is offloaded,
    test_ops_eltwise); qnn.dense on a 3-D input; fallback equals TVM-only."""
    high = relay.var("high", shape=(1, 2, 1, 2, 1, 2, 3), dtype="int8")
    scalar = relay.var("scalar", shape=(), dtype="int8")
    assert "rank 7 is not between 0 and 6" in reason_for(module([high], qadd(high, high)), "qnn.add")
    assert "output rank 0 is not between 1 and 6" in reason_for(module([scalar], qadd(scalar, scalar)), "qnn.add")
    d3 = relay.var("d3", shape=(2, 3, 8), dtype="int8")
    dense = relay.qnn.op.dense(d3, relay.const(weights(rng, (4, 8))), const(0, "int32"), const(0, "int32"),
                               const(0.1), const(0.01), units=4)
    assert "dense input rank 3" in reason_for(module([d3], dense), "qnn.dense")
    # TVM-only cannot build a 3-D qnn.dense either (x86 dense_alter_layout expects 2-D)
    assert "rank 7 is not between 0 and 6" in stays_in_tvm(module([high], qadd(high, high, so=0.3)), "qnn.add")


# ---- dtypes and quantization parameters ---------------------------------------------------------

def test_int16_conv_and_add_stay_in_tvm(tmp_path, rng):
    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int16")
    conv = qconv(x, weights(rng, (4, 4, 3, 3)), padding=(1, 1))
    assert "dtypes int16/int8 are not int8/uint8" in reason_for(module([x], conv), "qnn.conv2d")
    a = relay.var("a", shape=(2, 3), dtype="int16")
    assert "dtype int16 is not one of int8/uint8" in reason_for(module([a], qadd(a, a)), "qnn.add")
    # the requantize behind the rejected conv runs in refcg on its own
    compare_with_tvm(module([x], conv), {"x": random_int(rng, (1, 4, 5, 5), "int16", -300, 300)}, tmp_path,
                     expect_partitions=1)


def test_int4_and_float16_are_rejected(rng):
    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int8")
    w16 = relay.const(weights(rng, (4, 4, 3, 3)).astype("float16"))
    with pytest.raises(tvm.TVMError):  # Relay's own type relation refuses a float16 QNN weight
        partition_for_refcg(module([x], qconv(x, weights(rng, (4, 4, 3, 3)), kernel_scale=w16)))
    half = relay.const(np.float16(0.05))
    mod = module([x], qconv(x, weights(rng, (4, 4, 3, 3)), input_scale=half))
    with pytest.raises(tvm.TVMError):
        partition_for_refcg(mod)


def test_qparams_computed_at_run_time_stay_in_tvm(tmp_path, rng):
    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int8")
    s = relay.var("s", shape=(), dtype="float32")
    conv = qconv(x, weights(rng, (4, 4, 3, 3)), input_scale=s * const(0.5))
    assert "needs constant weights and qparams" in reason_for(module([x, s], conv), "qnn.conv2d")
    a = relay.var("a", shape=(2, 3), dtype="int8")
    add = relay.qnn.op.add(a, a, s, const(0, "int32"), *qparams(0.1, 0), *qparams(0.2, 0))
    assert "qnn.add" in str(offload_report(partition_for_refcg(module([a, s], add))))
    assert not refcg_functions(partition_for_refcg(module([a, s], add)))


@pytest.mark.parametrize("zp,what", [(300, "input_zero_point 300 is outside the int8 range"),
                                     (-129, "input_zero_point -129 is outside the int8 range")])
def test_zero_point_outside_dtype_range_stays_in_tvm(tmp_path, rng, zp, what):
    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int8")
    mod = module([x], qconv(x, weights(rng, (4, 4, 3, 3)), input_zp=zp, padding=(1, 1)))
    assert what in reason_for(mod, "qnn.conv2d")
    compare_with_tvm(mod, {"x": random_int(rng, (1, 4, 5, 5), "int8")}, tmp_path, expect_partitions=1)


def test_output_zero_point_outside_range_stays_in_tvm():
    a = relay.var("a", shape=(2, 3), dtype="uint8")
    assert "output zero point 256 is outside the uint8 range" in reason_for(module([a], qadd(a, a, zo=256)), "qnn.add")


@pytest.mark.parametrize("scale", [0.0, -0.05, float("inf"), float("nan")], ids=["zero", "negative", "inf", "nan"])
def test_bad_scales_stay_in_tvm(scale, rng):
    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int8")
    assert "input_scale must be finite and positive" in reason_for(
        module([x], qconv(x, weights(rng, (4, 4, 3, 3)), input_scale=scale)), "qnn.conv2d")
    a = relay.var("a", shape=(2, 3), dtype="int8")
    assert "output scale must be finite and positive" in reason_for(module([a], qadd(a, a, so=scale)), "qnn.add")


def test_negative_scale_fallback_equals_tvm():
    a = relay.var("a", shape=(2, 3), dtype="int8")
    assert "lhs scale must be finite and positive" in stays_in_tvm(module([a], qadd(a, a, sa=-0.1)), "qnn.add")


# ---- sizes --------------------------------------------------------------------------------------

def test_zero_sized_tensors_stay_in_tvm(tmp_path, rng):
    a = relay.var("a", shape=(2, 0, 3), dtype="int8")
    assert "lhs is zero-sized" in reason_for(module([a], qadd(a, a)), "qnn.add")
    x = relay.var("x", shape=(0, 4, 5, 5), dtype="int8")
    assert "zero-sized tensor" in reason_for(module([x], qconv(x, weights(rng, (4, 4, 3, 3)))), "qnn.conv2d")


def test_kernel_larger_than_padded_input_stays_in_tvm(rng):
    """Relay infers a negative output size; the check says why (TVM itself cannot build this graph)."""
    x = relay.var("x", shape=(1, 4, 3, 3), dtype="int8")
    mod = module([x], qconv(x, weights(rng, (4, 4, 5, 5)), padding=(0, 0)))
    assert "the kernel is larger than the padded input (output shape (1, 4, -1, -1))" in reason_for(mod, "qnn.conv2d")
    assert not refcg_functions(partition_for_refcg(mod))


def test_kernel_larger_than_input_but_not_padded_input_runs_in_refcg(tmp_path, rng):
    x = relay.var("x", shape=(1, 4, 3, 3), dtype="int8")
    mod = module([x], qconv(x, weights(rng, (4, 4, 5, 5)), padding=(1, 1, 1, 1)))
    compare_with_tvm(mod, {"x": random_int(rng, (1, 4, 3, 3), "int8")}, tmp_path, expect_partitions=1)


def test_huge_tensors_stay_in_tvm(rng):
    """Over 2^31 - 1 elements the kernels' int32 dimensions would overflow (checked, not built)."""
    a = relay.var("a", shape=(1, 65536, 32769), dtype="int8")
    assert "more than int32 indexing allows" in reason_for(module([a], qadd(a, a)), "qnn.add")
    x = relay.var("x", shape=(1, 2, 46341, 23171), dtype="int8")
    assert "more than int32 indexing allows" in reason_for(
        module([x], qconv(x, weights(rng, (4, 2, 1, 1)))), "qnn.conv2d")


def test_large_constant_data_is_stored_once_in_compact_c(tmp_path, rng):
    """What keeps a ResNet-50-sized weight set compilable (``make fuzz-large``: 26M int8 weights -> 106 MB
    of C, g++ peak 436 MB): each weight is emitted once, packed, as ~4 bytes of C. 2.4M weights here; the
    library compiles, loads and runs."""
    x = relay.var("x", shape=(1, 256, 7, 7), dtype="int8")
    y = x
    for _ in range(4):
        y = qconv_block(y, rng, in_c=256, out_c=256, input_scale=0.1)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partition_for_refcg(module([x], y)), target="llvm")
    [partition] = [m for m in lib.get_lib().imported_modules if m.type_key == "c"]
    assert len(partition.get_source()) / (4 * 256 * 256 * 9) < 4.5  # bytes of C per weight (4.1 measured)
    lib.export_library(str(tmp_path / "large.so"), fcompile=objcache.create_shared)
    out = run(load(str(tmp_path / "large.so")), {"x": random_int(rng, (1, 256, 7, 7), "int8")})
    assert out[0].shape == (1, 256, 7, 7) and out[0].dtype == np.int8


# ---- accumulator overflow -----------------------------------------------------------------------

def test_dense_accumulator_overflow_is_rejected():
    """40000 products of (x - (-128)) * (w - 0), each up to 255 * 255, overflow int32: stays in TVM."""
    x = relay.var("x", shape=(1, 40000), dtype="int8")
    w = relay.const(np.full((2, 40000), 255, "uint8"))
    dense = relay.qnn.op.dense(x, w, const(-128, "int32"), const(0, "int32"), const(0.1), const(0.01), units=2)
    assert "qnn.dense int32 accumulator can overflow (worst case 2601000000" in reason_for(module([x], dense),
                                                                                              "qnn.dense")


def test_conv_accumulator_bound_uses_the_actual_weights(rng):
    """Same reduction length, small weights: no overflow possible, offloaded; full-range ones stay."""
    x = relay.var("x", shape=(1, 4096, 3, 3), dtype="int8")
    small = np.full((1, 4096, 3, 3), 1, "uint8")
    assert refcg_functions(partition_for_refcg(module([x], qconv(x, small, input_zp=-128))))
    big = np.full((1, 4096, 3, 3), 255, "uint8")
    assert "qnn.conv2d int32 accumulator can overflow" in reason_for(module([x], qconv(x, big, input_zp=-128)),
                                                                     "qnn.conv2d")


def test_accumulator_bound_counts_the_bias(rng):
    x = relay.var("x", shape=(1, 8), dtype="int8")
    w = relay.const(np.full((2, 8), 127, "int8"))
    y = relay.qnn.op.dense(x, w, const(0, "int32"), const(0, "int32"), const(0.1), const(0.01), units=2)
    y = relay.nn.bias_add(y, relay.const(np.array([2**31 - 1000, 0], "int32")))
    assert "accumulator can overflow" in reason_for(module([x], y), "qnn.dense")


def test_accumulator_overflow_fallback_equals_tvm(rng):
    x = relay.var("x", shape=(1, 40000), dtype="int8")
    dense = relay.qnn.op.dense(x, relay.const(random_int(rng, (2, 40000), "uint8", 200, 255)), const(-128, "int32"),
                               const(0, "int32"), const(0.1), const(0.01), units=2)
    assert "accumulator can overflow" in stays_in_tvm(module([x], dense), "qnn.dense")


# ---- errors from the codegen itself ------------------------------------------------------------

def test_refcg_error_names_op_attribute_reason():
    error = RefcgError("qnn.conv2d", "weight", "did not fold to a constant")
    assert isinstance(error, tvm.TVMError)
    assert str(error) == "refcg: qnn.conv2d: weight: did not fold to a constant"
    assert (error.op, error.attribute, error.reason) == ("qnn.conv2d", "weight", "did not fold to a constant")


# ---- hostile names ------------------------------------------------------------------------------

HOSTILE = 'x"; refcg_pwned(); /* */ #include <pwned.h>\n'


def refcg_sources(lib) -> list[str]:
    return [m.get_source() for m in lib.get_lib().imported_modules if "Generated by refcg" in m.get_source()]


def test_hostile_names_and_target_never_reach_c_unescaped(tmp_path, rng):
    """Variable names, mod_name and a target attribute crafted to close the header comment and inject
    a declaration: the C only holds sanitized identifiers and escaped comment text; results exact."""
    x = relay.var(HOSTILE, shape=(1, 4, 5, 5), dtype="int8")
    mod = module([x], qconv(x, weights(rng, (4, 4, 3, 3)), padding=(1, 1)))
    target = "llvm -model=*/int_injected=1;/*"
    partitioned = partition_for_refcg(mod)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partitioned, target=target, mod_name="evil_mod")
    (source,) = refcg_sources(lib)
    assert "pwned" not in source and "evil_mod" not in source
    assert "-model=* /int_injected=1;/*" in source.splitlines()[1]
    assert source.index("*/") > source.index("int_injected")  # the header comment is not closed early
    data = random_int(rng, (1, 4, 5, 5), "int8")
    compare_with_tvm(mod, {HOSTILE: data}, tmp_path, target=target, expect_partitions=1)


@pytest.mark.parametrize("name", ["a b", "x;y", "1abc", "", "a" * 201, "\u00fcn", "abc\n", "f(){}", "x/*"])
def test_c_identifier_rejects_hostile_names(name):
    from refcodegen.emit import c_identifier

    with pytest.raises(RefcgError) as error:
        c_identifier(name, "partition")
    assert (error.value.op, error.value.attribute) == ("partition", "name")
    assert c_identifier("tvmgen_default_refcg_main_0", "partition") == "tvmgen_default_refcg_main_0"


def _folded_partition(rng):
    from refcodegen.scoped_fold import scoped_fold

    x = relay.var("x", shape=(1, 4, 5, 5), dtype="int8")
    (_, func), = refcg_functions(partition_for_refcg(module([x], qconv(x, weights(rng, (4, 4, 3, 3))))))
    return scoped_fold(func)


def test_hostile_global_symbol_is_a_refcg_error(rng):
    from refcodegen.emit import render
    from refcodegen.plan import build_plan

    plan = build_plan(_folded_partition(rng), HOSTILE, tvm.target.Target("llvm"))
    with pytest.raises(RefcgError, match="is not a valid C identifier"):
        render(plan)


def test_hostile_composite_name_is_a_refcg_error(rng):
    from refcodegen.plan import build_plan

    func = _folded_partition(rng)
    call = func.body
    hostile = call.op.with_attr("Composite", "refcg.conv2d */ refcg_pwned(); /*")
    func = relay.Function(func.params, relay.Call(hostile, call.args), func.ret_type)
    func = relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]
    with pytest.raises(RefcgError) as error:
        build_plan(func, "p", tvm.target.Target("llvm"))
    assert error.value.attribute == "composite" and "no kernel planner" in error.value.reason
