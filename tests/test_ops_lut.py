"""refcg.lut (table-driven unary ops) against TVM-only: bit-exact on every 8-bit input value."""
import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import random_int, slow_params
from models import module, qconv_block
from refcodegen import RefcgError, lut, offload_report, partition_for_refcg
from refcodegen.partition import refcg_functions
from test_ops_common import compare, const, qparams

ZERO_POINT = {"int8": (3, -128), "uint8": (131, 0)}  # (input, output) zero points per dtype


def tflite_hardswish(x):
    return x * relay.clip(x + const(3.0), 0.0, 6.0) / const(6.0)


def pytorch_hardswish(x):
    return x * (relay.clip(x + const(3.0), 0.0, 6.0) / const(6.0))


def onnx_hardswish(x):
    return x * relay.clip(x * const(1 / 6) + const(0.5), 0.0, 1.0)


def pytorch_hardsigmoid(x):  # TVM's PyTorch frontend (quantized aten::hardsigmoid)
    return relay.clip(x + const(3.0), 0.0, 6.0) / const(6.0)


def onnx_hardsigmoid(x):  # TVM's ONNX frontend (HardSigmoid, alpha 0.2, beta 0.5 by default)
    return relay.clip(x * const(0.2) + const(0.5), 0.0, 1.0)


QNN_FORMS = {
    "sigmoid": lambda x, qi, qo: relay.qnn.op.sigmoid(x, *qi, *qo),
    "tanh": lambda x, qi, qo: relay.qnn.op.tanh(x, *qi, *qo),
    "hardswish": lambda x, qi, qo: relay.qnn.op.hardswish(x, *qi, *qo),
    "leaky_relu": lambda x, qi, qo: relay.qnn.op.leaky_relu(x, 0.1, *qi, *qo),
    "exp": lambda x, qi, qo: relay.qnn.op.exp(x, *qi, *qo),
    "log": lambda x, qi, qo: relay.qnn.op.log(x, *qi, *qo),  # NaN for x <= zero point: TVM's numpy table decides
    "abs": lambda x, qi, qo: relay.qnn.op.abs(x, *qi, *qo),
}
FLOAT_FORMS = {  # what frontends emit between qnn.dequantize and qnn.quantize
    "sigmoid": relay.sigmoid,
    "tanh": relay.tanh,
    "leaky_relu": lambda x: relay.nn.leaky_relu(x, 0.2),
    "tflite_hardswish": tflite_hardswish,
    "pytorch_hardswish": pytorch_hardswish,
    "onnx_hardswish": onnx_hardswish,
    "pytorch_hardsigmoid": pytorch_hardsigmoid,
    "onnx_hardsigmoid": onnx_hardsigmoid,
}


EVERY_VALUE = np.arange(257, dtype="uint16").astype("uint8")  # all 256, plus one: no multiple of a vector width


def output_qparams(op: str, dtype: str):
    zo = ZERO_POINT[dtype][1]
    if op == "sigmoid":  # the output ranges TFLite fixes
        return qparams(1 / 256, zo)
    if op == "tanh":
        return qparams(1 / 128, zo + 128 * (dtype == "uint8"))
    if op == "exp":  # exp(x) of x in about [-9, 9]: up to ~64 before saturating
        return qparams(0.25, zo)
    return qparams(0.05, zo + 20)


def as_int8(y, dtype: str):
    """uint8 -> int8 by a zero-point shift only (equal scales: TVM skips the multiply), a bijection."""
    if dtype == "int8":
        return y
    return relay.qnn.op.requantize(y, *qparams(1.0, 0), *qparams(1.0, -128), out_dtype="int8")


# Only qnn.leaky_relu's lowering holds a requantize, the one thing the rounding config changes: the
# other forms' TVM code is the same under TONEAREST. The host-table ops (lut.HOST_TABLE_OPS) do not
# depend on the target either (test_host_computed_tables_do_not_depend_on_the_target).
LEAKY = {"leaky_relu": QNN_FORMS["leaky_relu"]}
SWEEPS = {"llvm": (QNN_FORMS, FLOAT_FORMS), "float32": (LEAKY, FLOAT_FORMS), "tonearest": (LEAKY, {})}


def every_form_on_every_value(qnn_forms=QNN_FORMS, float_forms=FLOAT_FORMS):
    """Each form on all 8-bit values of int8 and uint8 inputs, joined by one qnn.concatenate with
    equal qparams (a plain copy in TVM and refcg) so all of them build into a single partition."""
    params, inputs, outputs = [], {}, []
    for dtype in ("int8", "uint8"):
        qi = qparams(0.07, ZERO_POINT[dtype][0])
        out_dtype = "uint8" if dtype == "int8" else "int8"  # the float forms' quantize changes signedness
        forms = [(form, dtype, output_qparams(op, dtype)) for op, form in qnn_forms.items()]
        forms += [(form, out_dtype, None) for form in float_forms.values()]
        for form, y_dtype, qo in forms:
            x = relay.var(f"x{len(params)}", shape=EVERY_VALUE.shape, dtype=dtype)
            params.append(x)
            inputs[x.name_hint] = EVERY_VALUE.view(dtype)
            if qo is not None:
                y = form(x, qi, qo)
            else:
                zo = 5 if y_dtype == "int8" else 120
                y = relay.qnn.op.quantize(form(relay.qnn.op.dequantize(x, *qi)), *qparams(0.03, zo), out_dtype=y_dtype)
            outputs.append(as_int8(y, y_dtype))
    return module(params, join(outputs)), inputs, len(outputs)


def join(tensors):
    """qnn.concatenate with equal qparams everywhere, nested: refcg's pattern takes up to 8 inputs."""
    while len(tensors) > 1:
        groups = [tensors[i:i + 8] for i in range(0, len(tensors), 8)]
        tensors = [relay.qnn.op.concatenate(g, [const(1.0)] * len(g), [const(0, "int32")] * len(g),
                                            *qparams(1.0, 0), axis=0) if len(g) > 1 else g[0] for g in groups]
    return tensors[0]


@pytest.mark.parametrize("numerics", slow_params(SWEEPS, "float32", "tonearest"))
def test_lut_ops_match_tvm_on_every_value(tmp_path, numerics):
    mod, inputs, forms = every_form_on_every_value(*SWEEPS[numerics])
    partitioned = compare(mod, inputs, tmp_path, numerics, expect_partitions=1)
    report = offload_report(partitioned)
    assert not report.stayed, str(report)
    composites = [c for kernels in report.partitions.values() for c, _ in kernels]
    assert composites.count("refcg.lut") == forms == 2 * sum(map(len, SWEEPS[numerics])), composites


def test_lut_ops_chain_with_convs_in_one_partition(tmp_path, rng, numerics="float32"):
    """conv -> hardswish (TFLite form) -> conv -> qnn.sigmoid -> qnn.leaky_relu run back to back in one C function."""
    shape = (1, 4, 7, 7)
    x = relay.var("x", shape=shape, dtype="int8")
    w_range = (-63, 63)  # TVM-only's float32 target uses vpmaddubsw (saturates on full-range data)
    y = qconv_block(x, rng, in_c=4, out_c=6, weight_range=w_range, output_scale=0.06, output_zp=-3)
    y = relay.qnn.op.quantize(tflite_hardswish(relay.qnn.op.dequantize(y, *qparams(0.06, -3))), *qparams(0.04, -10))
    y = qconv_block(y, rng, in_c=6, out_c=4, input_scale=0.04, input_zp=-10, weight_range=w_range, output_scale=0.1)
    y = relay.qnn.op.sigmoid(y, *qparams(0.1, 0), *qparams(1 / 256, -128))
    y = relay.qnn.op.leaky_relu(y, 0.3, *qparams(1 / 256, -128), *qparams(1 / 200, -100))
    partitioned = compare(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, numerics,
                          expect_partitions=1)
    report = offload_report(partitioned)
    assert not report.stayed, str(report)
    assert [c for c, _ in next(iter(report.partitions.values()))] == [
        "refcg.conv2d", "refcg.lut", "refcg.conv2d", "refcg.lut", "refcg.lut"], str(report)


BINARY = {"qnn.mul": relay.qnn.op.mul, "qnn.add": relay.qnn.op.add, "qnn.subtract": relay.qnn.op.subtract}


def with_its_table_op(x, dtype: str, op: str, table_first: bool, qnn_form: bool):
    """``op`` of ``x`` and a table op of ``x`` (swish is ``x * sigmoid(x)``): one table in refcg."""
    qi = qparams(0.07, ZERO_POINT[dtype][0])
    if qnn_form:
        qt = output_qparams("sigmoid", dtype)
        t = QNN_FORMS["sigmoid"](x, qi, qt)
    else:
        qt = qparams(0.03, ZERO_POINT[dtype][1] + 7)
        t = relay.qnn.op.quantize(relay.sigmoid(relay.qnn.op.dequantize(x, *qi)), *qt, out_dtype=dtype)
    operands = [(t, *qt), (x, *qi)] if table_first else [(x, *qi), (t, *qt)]
    (a, sa, za), (b, sb, zb) = operands
    return BINARY[op](a, b, sa, za, sb, zb, *qparams(0.045, ZERO_POINT[dtype][0] - 9))


@pytest.mark.parametrize("numerics", slow_params(("llvm", "float32", "float32-nofma"), "float32", "float32-nofma"))
def test_binary_op_of_a_tensor_and_its_table_op_is_one_table(tmp_path, numerics):
    params, inputs, outputs = [], {}, []
    for dtype in ("int8", "uint8"):
        for op in BINARY:
            for table_first in (False, True):
                for qnn_form in (False, True):
                    x = relay.var(f"x{len(params)}", shape=EVERY_VALUE.shape, dtype=dtype)
                    params.append(x)
                    inputs[x.name_hint] = EVERY_VALUE.view(dtype)
                    outputs.append(with_its_table_op(x, dtype, op, table_first, qnn_form))
    # a tuple, not one concatenation: on FMA targets TVM-only's concatenate kernel rounds some of the
    # requantizes FuseOps moves into it differently (1 LSB at a boundary), whichever kernel refcg runs
    partitioned = compare(module(params, relay.Tuple(outputs)), inputs, tmp_path, numerics)
    report = offload_report(partitioned)
    assert not report.stayed, str(report)
    kernels = [ops for kernels in report.partitions.values() for c, ops in kernels if c == "refcg.lut"]
    assert len(kernels) == len(outputs) and all(ops[-1] in BINARY for ops in kernels), str(report)


def test_swish_between_convs_runs_as_one_table(tmp_path, rng, numerics="float32"):
    """conv -> x * sigmoid(x) (TFLite's form) -> conv: the swish is one table step on the channels-last tensor."""
    shape = (1, 8, 9, 9)
    x = relay.var("x", shape=shape, dtype="int8")
    w_range = (-63, 63)  # TVM-only's float32 target uses vpmaddubsw (saturates on full-range data)
    y = qconv_block(x, rng, in_c=8, out_c=16, weight_range=w_range, output_scale=0.06, output_zp=-3)
    y = with_its_table_op(y, "int8", "qnn.mul", False, False)
    y = qconv_block(y, rng, in_c=16, out_c=8, input_scale=0.045, input_zp=-6, weight_range=w_range, output_scale=0.1)
    partitioned = compare(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, numerics,
                          expect_partitions=1)
    report = offload_report(partitioned)
    assert [c for c, _ in next(iter(report.partitions.values()))] == [
        "refcg.conv2d", "refcg.lut", "refcg.conv2d"], str(report)


def stay_reason(mod, op: str, **partition_options) -> str:
    """The offload report's line for ``op`` staying in TVM."""
    text = str(offload_report(partition_for_refcg(mod, **partition_options)))
    lines = [line for line in text.splitlines() if line.lstrip().startswith("TVM") and f" {op} " in line]
    assert lines, text
    return lines[0]


def test_lut_rejections_show_in_the_report():
    x = relay.var("x", shape=(2, 3), dtype="int8")
    per_channel = relay.qnn.op.dequantize(x, relay.const(np.array([0.1, 0.2, 0.3], "float32")), const(0, "int32"),
                                          axis=1)
    y = relay.qnn.op.quantize(relay.sigmoid(per_channel), *qparams(1 / 256, -128))
    assert "dequantize scale must be a scalar" in stay_reason(module([x], y), "sigmoid")
    dq = relay.qnn.op.dequantize(x, *qparams(0.1, 0))
    y = dq * relay.clip(dq + relay.const(np.full(3, 3.0, "float32")), 0.0, 6.0) / const(6.0)  # per-channel offset
    y = relay.qnn.op.quantize(y, *qparams(0.1, 0))
    assert "add has a constant of shape (3,), not a scalar" in stay_reason(module([x], y), "divide")


ARM = "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon"


def test_lut_ops_whose_table_needs_the_target_stay_in_tvm_for_a_target_this_host_cannot_run():
    """leaky_relu and the float forms are compiled for the build target: refcg does not guess them for aarch64."""
    x = relay.var("x", shape=(8,), dtype="int8")
    leaky = relay.qnn.op.leaky_relu(x, 0.1, *qparams(0.1, 0), *qparams(0.05, 0))
    floating = relay.qnn.op.quantize(relay.sigmoid(relay.qnn.op.dequantize(x, *qparams(0.1, 0))), *qparams(0.1, 0))
    for op, y in (("qnn.leaky_relu", leaky), ("sigmoid", floating)):
        assert "aarch64-linux-gnu does not run on this x86_64 host" in stay_reason(module([x], y), op, target=ARM)
        assert refcg_functions(partition_for_refcg(module([x], y), target="llvm -mcpu=skylake"))
    with pytest.raises(RefcgError, match="pass target= to partition_for_refcg"):  # target known only at build time
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(module([x], leaky)), target=ARM)


def test_lut_target_check_needs_only_instruction_set_extensions(monkeypatch):
    """A host lacking system features (ermsb, invpcid: not instructions TVM's kernels emit) runs a
    skylake table; one lacking an extension the skylake code may use (avx2) does not."""
    skylake = "llvm -mcpu=skylake"
    wanted = set(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(skylake)))
    assert {"ermsb", "invpcid", "avx2", "fma"} <= wanted
    for dropped, expected in (({"ermsb", "invpcid"}, None), ({"ermsb", "avx2"}, "lacks (avx2)")):
        monkeypatch.setattr(lut, "_host_features", lambda: frozenset(wanted - dropped))
        lut._cannot_run.cache_clear()
        reason = lut.cannot_run(skylake)
        assert reason == expected if expected is None else expected in reason, reason
    lut._cannot_run.cache_clear()


@pytest.mark.parametrize("op", sorted(lut.HOST_TABLE_OPS))
def test_host_computed_tables_do_not_depend_on_the_target(op):
    """TVM legalizes qnn.sigmoid/tanh/hardswish/exp/log/abs to a table computed on the build host for any target:
    the table TVM embeds in an aarch64 build equals the one refcg computes here."""
    x = relay.var("x", shape=(16,), dtype="int8")
    name = op.split(".")[1]
    mod = module([x], QNN_FORMS[name](x, qparams(0.07, 3), output_qparams(name, "int8")))
    with tvm.target.Target(ARM), tvm.transform.PassContext(opt_level=3):
        legalized = relay.qnn.transform.Legalize()(relay.transform.InferType()(mod))
    tables = []
    relay.analysis.post_order_visit(legalized["main"].body, lambda e: tables.append(e.args[0].data.numpy()) if (
        isinstance(e, relay.Call) and getattr(e.op, "name", "") == "take") else None)
    (_, partition), = refcg_functions(partition_for_refcg(mod, target=ARM))
    with tvm.transform.PassContext(opt_level=3):
        ours = lut.lookup_table(partition.body.op, tvm.target.Target(ARM))
    assert len(tables) == 1 and np.array_equal(tables[0], ours)
