"""refcg.softmax (qnn.softmax, TVM's integer algorithm) against TVM-only: bit-exact; what stays in TVM."""
import numpy as np
import pytest
from tvm import relay

from conftest import random_int
from models import module
from refcodegen import offload_report
from test_ops_common import compare, const, qparams
from test_ops_lut import as_int8, join, stay_reason

CASES = [
    # rows, axis, (input scale, zero point), (output scale, zero point), input values; shape (rows, 1000)
    (4, 1, (1.0, 0), (1 / 256, -128), "every"),  # x0 = 1: q clipped at 20, negative exps
    (4, 1, (0.01, 7), (1 / 128, 0), "every"),  # x0 = 100; 1/128 -> 1/128: TVM skips the multiply
    (3, 0, (0.5, 0), (0.003, -100), "random"),  # x0 = 2, along the outer axis (inner stride 1000)
    (8, 0, (0.1, -5), (1 / 256, -128), "random"),
    (2, 1, (0.02, 3), (0.01, 10), "narrow"),  # values close together: every q is 0
]

# dequantize -> nn.softmax -> quantize, TVM's x86 float code (in-order sum, libm expf, division). The
# quantized output hides ulp-level differences; the float softmax itself was measured bit-exact (0 of
# 133k floats differ under llvm and skylake, where a reciprocal multiply or a reversed sum differ in
# 20-95% of them).
FLOAT_CASES = [
    # rows, input dtype, (scale, zero point), output dtype, (scale, zero point); shape (rows, 1000)
    (6, "int8", (0.1, 2), "int8", (1 / 256, -128)),
    (3, "uint8", (0.05, 120), "uint8", (1 / 255, 0)),
    (3, "int8", (0.3, -7), "uint8", (0.0005, 3)),  # fine output steps
]


def softmax_cases(rng):
    """Every case as one module, joined by an exact qnn.concatenate so it builds into one partition."""
    params, inputs, outputs = [], {}, []
    for rows, axis, qi, qo, values in CASES:
        shape = (rows, 1000)
        x = relay.var(f"x{len(params)}", shape=shape, dtype="int8")
        params.append(x)
        if values == "every":  # every row holds all 256 int8 values
            data = np.stack([np.resize(rng.permutation(256), 1000) - 128 for _ in range(rows)]).astype("int8")
        else:
            data = random_int(rng, shape, "int8", *((-4, 5) if values == "narrow" else (None, None)))
        inputs[x.name_hint] = data
        outputs.append(relay.qnn.op.softmax(x, *qparams(*qi), *qparams(*qo), axis=axis))
    for rows, dtype, qi, out_dtype, qo in FLOAT_CASES:
        x = relay.var(f"x{len(params)}", shape=(rows, 1000), dtype=dtype)
        params.append(x)
        inputs[x.name_hint] = random_int(rng, (rows, 1000), dtype)
        y = relay.nn.softmax(relay.qnn.op.dequantize(x, *qparams(*qi)))
        outputs.append(as_int8(relay.qnn.op.quantize(y, *qparams(*qo), out_dtype=out_dtype), out_dtype))
    # a chain: dense -> requantize -> qnn.softmax over 1000 units
    x = relay.var("features", shape=(4, 16), dtype="int8")
    params.append(x)
    inputs[x.name_hint] = random_int(rng, (4, 16), "int8")
    w = relay.const(random_int(rng, (1000, 16), "int8", -63, 63))  # vpmaddubsw saturation, see test_ops_common
    y = relay.qnn.op.dense(x, w, const(1, "int32"), const(0, "int32"), const(0.05), const(0.01), units=1000)
    y = relay.qnn.op.requantize(y, const(0.0005), const(0, "int32"), const(0.02), const(-3, "int32"))
    y = relay.qnn.op.softmax(y, *qparams(0.02, -3), *qparams(1 / 256, -128))
    outputs.append(y)
    return module(params, join(outputs)), inputs


@pytest.mark.parametrize("numerics", ["llvm", "tonearest", "float32"])
def test_softmax_matches_tvm(tmp_path, rng, numerics):
    """qnn.softmax, a dense -> qnn.softmax chain and the float form in one partition."""
    mod, inputs = softmax_cases(rng)
    partitioned = compare(mod, inputs, tmp_path, numerics, expect_partitions=1)
    report = offload_report(partitioned)
    composites = [c for kernels in report.partitions.values() for c, _ in kernels]
    assert composites.count("refcg.softmax") == len(CASES) + 1 and not report.stayed, str(report)
    assert composites.count("refcg.float_softmax") == len(FLOAT_CASES), str(report)
    assert composites.index("refcg.dense") + 1 == composites.index("refcg.softmax", len(CASES)), composites


@pytest.mark.parametrize("shape, scale, reason", [
    ((2, 10), 2.5, "round(1 / input_scale) is 0: TVM's integer softmax divides by it"),
    ((1, 1000), 0.1, "int32 sum of exps can overflow in TVM's integer softmax for an axis of 1000"),
])
def test_qnn_softmax_outside_int32_stays_in_tvm(shape, scale, reason):
    x = relay.var("x", shape=shape, dtype="int8")
    y = relay.qnn.op.softmax(x, *qparams(scale, 0), *qparams(1 / 256, -128))
    assert reason in stay_reason(module([x], y), "qnn.softmax")


def test_softmax_not_over_the_last_axis_or_not_for_x86_stays_in_tvm():
    x = relay.var("x", shape=(4, 6), dtype="int8")
    y = relay.nn.softmax(relay.qnn.op.dequantize(x, *qparams(0.1, 0)), axis=0)
    y = relay.qnn.op.quantize(y, *qparams(1 / 256, -128))
    assert "float softmax over axis 0, not the last one" in stay_reason(module([x], y), "nn.softmax")
    y = relay.qnn.op.quantize(relay.nn.softmax(relay.qnn.op.dequantize(x, *qparams(0.1, 0))), *qparams(1 / 256, -128))
    arm = "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon"
    assert "x86 llvm targets only" in stay_reason(module([x], y), "nn.softmax", target=arm)
    y = relay.qnn.op.softmax(x, *qparams(0.1, 0), *qparams(1 / 256, -128))
    assert "x86 llvm targets only" in stay_reason(module([x], y), "qnn.softmax", target=arm)


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_float_softmax_quantizes_by_the_reciprocal_like_tvm(tmp_path, rng, numerics):
    """TVM-only's quantize after the float softmax multiplies by float32(1 / scale) (a rank-0 scale: an
    immediate its TIR simplifier rewrites x / c for). Rows with m equal maxima, the rest underflowing
    (input scale 1), give y = 1/m exactly where y / scale and y * (1 / scale) round differently."""
    params, inputs, outputs = [], {}, []
    for m, out_dtype, (scale, zp) in ((170, "uint8", (1 / 255, 0)), (170, "int8", (1 / 255, -128)),
                                      (160, "int8", (0.0005, -128))):
        y, s = np.float32(1) / np.float32(m), np.float32(scale)
        r = np.float32(1 / np.float64(s))
        assert np.floor(np.float64(y / s) + 0.5) != np.floor(np.float64(y * r) + 0.5)  # round half away
        data = random_int(rng, (4, 1000), "int8")
        data[:2] = -128
        data[0, :m] = data[1, -m:] = 127
        x = relay.var(f"x{len(params)}", shape=data.shape, dtype="int8")
        params.append(x)
        inputs[x.name_hint] = data
        y = relay.nn.softmax(relay.qnn.op.dequantize(x, *qparams(1.0, 0)))
        outputs.append(as_int8(relay.qnn.op.quantize(y, *qparams(scale, zp), out_dtype=out_dtype), out_dtype))
    partitioned = compare(module(params, join(outputs)), inputs, tmp_path, numerics, expect_partitions=1)
    report = offload_report(partitioned)
    assert [c for kernels in report.partitions.values() for c, _ in kernels].count("refcg.float_softmax") == 3
