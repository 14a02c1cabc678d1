"""refcg.requantize (qnn.requantize alone), refcg.concatenate and refcg.quantize against TVM-only: bit-exact."""
import numpy as np
import pytest
from tvm import relay

from conftest import build_and_load, random_int, run, stays_in_tvm
from models import module
from refcodegen import offload_report, partition_for_refcg
from test_ops_common import NUMERICS, Cases, compare, const, qparams, scale_loaded_marks


def requantize(x, in_scale, in_zp, out_scale, out_zp, out_dtype, axis=-1, rounding="None", clip=None):
    y = relay.qnn.op.requantize(x, relay.const(np.array(in_scale, "float32")), const(in_zp, "int32"),
                                const(out_scale), const(out_zp, "int32"), axis=axis, rounding=rounding,
                                out_dtype=out_dtype)
    return relay.clip(y, *clip) if clip else y


REQUANTIZE_SWEEP = [
    # in shape, in dtype, in scale(s), in zp, out scale, out zp, out dtype, axis, rounding, clip
    ((2, 7), "int8", 0.05, 3, 0.08, 128, "uint8", -1, "None", None),
    ((1, 3, 4, 4), "uint8", [0.5, 0.02, 0.9], 128, 0.01, -3, "int8", 1, "None", None),  # ratio above 1
    ((1, 4, 4, 3), "int32", [0.001, 0.0004, 0.002], 0, 0.05, 2, "int8", -1, "None", (-20, 100)),
    ((3, 5), "int8", 0.3, -4, 0.02, 0, "int32", -1, "None", None),
    ((2, 9), "int8", 0.07, 1, 0.05, -1, "int8", -1, "TONEAREST", None),
    ((8,), "uint8", 0.2, 100, 0.2, 90, "uint8", 0, "UPWARD", None),  # equal scales: TVM skips the multiply
]


def test_requantize_matches_tvm(tmp_path, rng):
    cases = Cases()
    for shape, dtype, in_scale, in_zp, out_scale, out_zp, out_dtype, axis, rounding, clip in REQUANTIZE_SWEEP:
        x = cases.var(shape, dtype, rng, *((-40000, 40000) if dtype == "int32" else ()))
        cases.add(requantize(x, in_scale, in_zp, out_scale, out_zp, out_dtype, axis, rounding, clip))
    cases.compare(tmp_path)


def concatenate(inputs, qps, out_qp, axis):
    scales, zps = zip(*(qparams(*qp) for qp in qps))
    return relay.qnn.op.concatenate(inputs, list(scales), list(zps), *qparams(*out_qp), axis=axis)


def test_concatenate_matches_tvm(tmp_path, rng):
    cases = Cases()
    a, b = cases.var((1, 2, 3, 3), "int8", rng), cases.var((1, 5, 3, 3), "int8", rng)
    cases.add(concatenate([a, b], [(0.1, 3), (0.2, -4)], (0.15, 1), axis=1))
    c, d = cases.var((2, 3, 4), "uint8", rng), cases.var((2, 3, 1), "uint8", rng)
    k = relay.const(random_int(rng, (2, 3, 2), "uint8"))
    cases.add(concatenate([c, k, d], [(0.05, 128), (0.5, 120), (0.05, 128)], (0.05, 128), axis=-1))
    e, f = cases.var((3, 4), "int8", rng), cases.var((2, 4), "int8", rng)
    cases.add(concatenate([e, f, e], [(0.1, 0)] * 3, (0.1, 0), axis=0))  # equal qparams: a plain copy
    # Inception-v3's block outputs (issue 19): four uint8 branches, zero points 0, the widest range's
    # scale is the output's (that branch is copied, the others requantized), nested in the next one
    branches = [cases.var((1, ch, 7, 7), "uint8", rng) for ch in (4, 6, 6, 3)]
    scales = [(0.27, 0), (0.11, 0), (0.3137, 0), (0.05, 0)]
    inner = concatenate(branches[1:3], scales[1:3], (0.3137, 0), axis=1)
    cases.add(concatenate([branches[0], inner, branches[3]], [scales[0], (0.3137, 0), scales[3]], (0.3137, 0), axis=1))
    cases.compare(tmp_path)


@pytest.mark.parametrize("numerics", [n for n in NUMERICS if n != "llvm"])
def test_requantize_and_concatenate_modes(tmp_path, rng, numerics):
    """per-channel requantize int8 -> uint8, then concatenate with another uint8 input: one partition."""
    cases = Cases()
    x, z = cases.var((1, 3, 4, 4), "int8", rng), cases.var((1, 2, 4, 4), "uint8", rng)
    y = requantize(x, [0.05, 0.3, 0.011], 2, 0.07, 130, "uint8", axis=1)
    cases.add(concatenate([y, z], [(0.07, 130), (0.13, 120)], (0.09, 125), axis=1))
    cases.compare(tmp_path, numerics, expect_partitions=1)


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_quantize_dequantize_at_partition_boundaries(tmp_path, rng, numerics):
    """float32 in -> qnn.quantize -> qnn.add -> qnn.dequantize -> float32 out, in one partition."""
    cases = Cases()
    x = relay.var("x", shape=(3, 40), dtype="float32")
    cases.params.append(x)
    halves = (np.arange(-60, 60) + 0.5).astype("float32") * np.float32(0.5)  # exact ties of x / 0.5
    cases.inputs["x"] = np.concatenate([halves, rng.uniform(-80, 80, 120 - halves.size).astype("float32")]).reshape(3, 40)
    q = relay.qnn.op.quantize(x, const(0.5), const(3, "int32"), out_dtype="int8")
    u = relay.qnn.op.quantize(x, const(0.37), const(128, "int32"), out_dtype="uint8")
    y = relay.qnn.op.add(q, cases.var((1, 40), "int8", rng), *qparams(0.5, 3), *qparams(0.2, -1), *qparams(0.6, 0))
    cases.add(relay.qnn.op.dequantize(y, const(0.6), const(0, "int32")), "float32")
    cases.add(relay.qnn.op.dequantize(u, const(0.37), const(128, "int32")), "float32")
    cases.compare(tmp_path, numerics)


INT16_SWEEP = [
    # in shape, in dtype, in scale(s), in zp, out scale, out zp, out dtype, axis, clip
    ((2, 40), "int16", 0.003, 7, 0.05, -3, "int8", -1, None),
    ((1, 3, 4, 5), "int16", [0.002, 0.04, 0.0007], -20, 0.03, 128, "uint8", 1, (10, 250)),
    ((3, 16), "int16", 0.5, 0, 0.0009, 5, "int32", -1, None),  # ratio above 1
    ((2, 24), "int8", 0.05, 3, 0.0004, -100, "int16", -1, None),
    # int32 in: ratios below 1 (above, test_float_requantize_past_int32_stays_in_tvm)
    ((1, 4, 3, 3), "int32", [0.0001, 0.0009, 0.00003, 0.0007], 11, 0.001, 9, "int16", 1, (-3000, 20000)),
    ((2, 8), "uint8", 0.1, 128, 0.1, 0, "int16", -1, None),  # equal scales: TVM skips the multiply
    ((4, 9), "int16", 0.01, -2, 0.003, 1, "int16", -1, None),
]


@pytest.mark.parametrize("numerics", ["llvm", "tonearest", "float32"])
def test_requantize_int16_matches_tvm(tmp_path, rng, numerics):
    """qnn.requantize to and from int16 (+clip), alone and fused after a conv and a dense."""
    from models import qconv_block

    cases = Cases()
    for shape, dtype, in_scale, in_zp, out_scale, out_zp, out_dtype, axis, clip in INT16_SWEEP:
        x = cases.var(shape, dtype, rng, *((-3_000_000, 3_000_000) if dtype == "int32" else ()))
        cases.add(requantize(x, in_scale, in_zp, out_scale, out_zp, out_dtype, axis, clip=clip))
    x = cases.var((1, 4, 6, 6), "int8", rng)
    cases.add(qconv_block(x, rng, in_c=4, out_c=8, per_channel=True, output_scale=0.0005, out_dtype="int16",
                          clip=(-20000, 30000), weight_range=(-63, 63)))  # skylake TVM-only: vpmaddubsw saturates
    x = cases.var((3, 10), "uint8", rng)
    w = relay.const(random_int(rng, (6, 10), "int8"))
    y = relay.qnn.op.dense(x, w, const(128, "int32"), const(0, "int32"), const(0.05), const(0.01), units=6)
    cases.add(requantize(y, 0.0005, 0, 0.0001, -7, "int16"))
    cases.compare(tmp_path, numerics)


def test_float_requantize_past_int32_stays_in_tvm(tmp_path, rng):
    """A requantize whose value can pass int32 (an int32 input, scale ratio 2): TVM's float numerics
    convert it with LLVM's fptosi, undefined there, so it stays in TVM for a float32 target and
    without a target; for an int64 target it is offloaded, bit-exact."""
    x = relay.var("x", shape=(2, 16), dtype="int32")
    mod = module([x], requantize(x, 0.002, 0, 0.001, 0, "int8"))
    for target in ("llvm -mcpu=skylake", None):
        reason = stays_in_tvm(mod, "qnn.requantize", target=target)
        assert "can reach 4.29e+09, past int32" in reason, reason
    inputs = {"x": rng.integers(-2**31, 2**31, (2, 16), dtype=np.int64).astype("int32")}
    want = run(build_and_load(mod, "llvm", tmp_path, "tvm_only"), inputs)
    partitioned = partition_for_refcg(mod, target="llvm")
    assert offload_report(partitioned).offloaded_ops["qnn.requantize"] == 1
    assert np.array_equal(want[0], run(build_and_load(partitioned, "llvm", tmp_path, "refcg"), inputs)[0])


def float_input(cases, shape, rng, scales, axis):
    """Random float32 data plus exact ties of x / scale (k + 0.5) along ``axis``, where rounding decides."""
    x = relay.var(f"v{len(cases.inputs)}", shape=shape, dtype="float32")
    cases.params.append(x)
    data = rng.uniform(-300, 300, shape).astype("float32") * np.float32(np.max(scales))
    ties = (rng.integers(-120, 120, shape) + 0.5).astype("float32")
    view = [1] * len(shape)
    view[axis] = -1
    ties = ties * np.asarray(scales, "float32").reshape(view if np.size(scales) > 1 else ())
    pick = rng.random(shape) < 0.5
    cases.inputs[x.name_hint] = np.where(pick, ties, data).astype("float32")
    return x


PER_AXIS_SWEEP = [
    # shape, axis, scales, zero points, quantized dtype
    ((2, 5, 3, 4), 1, [0.5, 0.37, 0.011, 2.0, 0.093], [0, 3, -7, 100, -128], "int8"),
    ((3, 4, 6), -1, [0.02, 0.7, 0.25, 0.0049, 1.3, 0.06], 128, "uint8"),
    ((4, 7), 0, [0.1, 0.3, 0.05, 0.9], [0, 10, 250, 128], "uint8"),
    ((2, 3, 5), 1, 0.37, [1, -2, 5], "int8"),  # a scalar scale with per-channel zero points
    ((6, 2, 2), 0, [0.03] * 6, 0, "int8"),
]


@pytest.mark.parametrize("numerics", ["llvm", "tonearest", "float32"])
def test_per_axis_quantize_dequantize(tmp_path, rng, numerics):
    """ONNX QDQ per-axis: qnn.quantize / qnn.dequantize along any axis, alone and back to back."""
    cases = Cases()
    for shape, axis, scales, zps, dtype in PER_AXIS_SWEEP:
        x = float_input(cases, shape, rng, scales, axis)

        def qp():  # constants of their own: a shared rank-0 scale is another case (test below)
            return const(scales), const(zps, "int32")

        q = relay.qnn.op.quantize(x, *qp(), axis=axis, out_dtype=dtype)
        cases.add(q)
        cases.add(relay.qnn.op.dequantize(q, *qp(), axis=axis), "float32")
        xq = cases.var(shape, dtype, rng)
        cases.add(relay.qnn.op.dequantize(xq, *qp(), axis=axis), "float32")
    cases.compare(tmp_path, numerics)


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_dequantize_feeding_float_arithmetic_stays_in_tvm(tmp_path, rng, numerics):
    """TVM-only fuses dequantize's multiply with a float add (an FMA on skylake) and folds a constant
    multiply into the scale: such a dequantize stays in TVM; one feeding softmax or a reshaped output
    is offloaded. All bit-exact with TVM-only."""
    cases = Cases()
    outs = []
    consumers = [lambda y: relay.add(y, const(rng.standard_normal((4, 1)).astype("float32") * 3)),
                 lambda y: relay.multiply(y, const(np.float32(1.7))),
                 relay.nn.softmax, lambda y: relay.reshape(y, (8, 16))]
    for axis, scale in ((1, [0.05, 0.3, 0.011, 0.07]), (-1, 0.0731)):
        for consumer in consumers:  # one dequantize each: TVM-only fuses a single consumer only
            y = relay.qnn.op.dequantize(cases.var((2, 4, 16), "int8", rng), const(scale), const(3, "int32"),
                                        axis=axis)
            outs.append(consumer(y))
    mod = module(cases.params, relay.Tuple([relay.reinterpret(o, "int32") for o in outs]))
    partitioned = compare(mod, cases.inputs, tmp_path, numerics)
    report = offload_report(partitioned)
    assert report.offloaded_ops["qnn.dequantize"] == 4, str(report)
    reasons = [reason for op, _, reason in report.stayed if op == "qnn.dequantize"]
    assert len(reasons) == 4 and all("TVM-only computes together" in r for r in reasons), str(report)


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_quantize_after_float_arithmetic(tmp_path, rng, numerics):
    """TVM-only fuses x * a + b (an FMA on skylake) with the quantize's division; refcg quantizes the
    result TVM computed for the same producer: division does not contract, the results agree."""
    cases = Cases()
    x = float_input(cases, (2, 4, 16), rng, [0.1] * 4, 1)
    y = relay.add(relay.multiply(x, const(np.float32(0.77))), const(rng.standard_normal((4, 1)).astype("float32")))
    q = relay.qnn.op.quantize(y, const([0.05, 0.11, 0.3, 0.021]), const([1, 0, -3, 7], "int32"), axis=1)
    partitioned = compare(module(cases.params, q), cases.inputs, tmp_path, numerics)
    assert offload_report(partitioned).offloaded_ops["qnn.quantize"] == 1


def round_away(q):
    return np.sign(q) * np.floor(np.abs(q.astype("float64")) + 0.5)


def reciprocal_ties(scale: float, size: int) -> np.ndarray:
    """float32 values within 2 ulp of (k + 0.5) * scale, where round(x / scale) and
    round(x * float32(1 / scale)) can differ."""
    ties = (np.arange(size) % 200 - 100 + 0.5).astype("float32") * np.float32(scale)
    steps = (np.arange(size) // 200 % 5 - 2).astype("int32")  # -2..2 ulp, each over all k
    return (ties.view("int32") + steps).view("float32")


# Scales whose float32 reciprocal is not exact: TVM multiplies by it for a rank-0 scale (an immediate
# its TIR simplifier rewrites x / c for), divides by a tensor scale.
RECIPROCAL_SCALES = [0.46656, 1 / 3, 0.0123, 0.4665601849555969]


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_quantize_divides_or_multiplies_by_the_reciprocal_like_tvm(tmp_path, numerics):
    """Per tensor (rank-0 scale: x * float32(1 / scale)), per axis and a (1,) scale on an axis of 1
    (a tensor: x / scale), int8 and uint8, on values where the two round differently."""
    cases = Cases()
    for i, scale in enumerate(RECIPROCAL_SCALES):
        dtype, zp = ("int8", 0) if i % 2 else ("uint8", 128)
        data = reciprocal_ties(scale, 2000)
        s, r = np.float32(scale), np.float32(1 / np.float64(np.float32(scale)))
        assert (round_away(data / s) != round_away(data * r)).sum() >= 8  # the inputs tell the two apart
        x = relay.var(f"v{len(cases.inputs)}", shape=(4, 1, 500), dtype="float32")
        cases.params.append(x)
        cases.inputs[x.name_hint] = data.reshape(4, 1, 500)
        cases.add(relay.qnn.op.quantize(x, const(scale), const(zp, "int32"), out_dtype=dtype))
        cases.add(relay.qnn.op.quantize(x, const([scale]), const([zp], "int32"), axis=1, out_dtype=dtype))
        per_axis = [scale, 0.37, scale, 1.1]  # the ties are scale's: channels 0 and 2 tell the two apart
        cases.add(relay.qnn.op.quantize(x, const(per_axis), const([zp] * 4, "int32"), axis=0, out_dtype=dtype))
    cases.compare(tmp_path, numerics)


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_a_quantize_divides_by_a_scale_constant_other_kernels_read(tmp_path, rng, numerics):
    """One rank-0 scale constant read by several ops: TVM-only inlines it (and multiplies by its
    reciprocal) only when FuseOps puts all its readers in one kernel; otherwise it loads it and divides
    (consumers._loaded_scale_readers), and so does refcg. On ties where the two round apart, each
    branch of that rule, for refcg.quantize, a lookup table and the float softmax."""
    scale = RECIPROCAL_SCALES[0]
    cases = Cases()

    def ties(positive=False):
        x = relay.var(f"v{len(cases.inputs)}", shape=(4, 1, 500), dtype="float32")
        cases.params.append(x)
        data = reciprocal_ties(scale, 2000).reshape(4, 1, 500)
        cases.inputs[x.name_hint] = np.abs(data) if positive else data
        return x

    def quantize(x, s):
        return relay.qnn.op.quantize(x, s, const(0, "int32"), out_dtype="int8")

    def dequantize(x, s):
        return relay.qnn.op.dequantize(x, s, const(0, "int32"))

    int8 = (4, 1, 500), "int8", rng
    s = const(scale)  # read by a quantize and by a dequantize of another tensor: two kernels, loaded
    cases.add(quantize(ties(), s))
    cases.add(dequantize(cases.var(*int8), s), "float32")
    s = const(scale)  # two quantizes of different tensors: loaded
    cases.add(quantize(ties(), s))
    cases.add(quantize(ties(positive=True), s))
    s = const(scale)  # quantize -> dequantize, the quantized tensor also an output: two kernels, loaded
    q = quantize(ties(), s)
    cases.add(q)
    cases.add(dequantize(q, s), "float32")
    s = const(scale)  # a table and a float softmax whose quantizes share their scale: loaded
    cases.add(quantize(relay.sigmoid(dequantize(cases.var(*int8), const(0.05))), s))
    cases.add(quantize(relay.nn.softmax(dequantize(cases.var(*int8), const(0.05))), s))
    marked = 6
    # inlined: quantize -> dequantize alone (one fused kernel; positive: TVM's fused kernel keeps the
    # sign of a value rounding to -0.0, refcg's int8 does not), dequantize -> sigmoid -> quantize
    s = const(scale)
    cases.add(dequantize(quantize(ties(positive=True), s), s), "float32")
    s = const(scale)
    cases.add(quantize(relay.sigmoid(dequantize(cases.var(*int8), s)), s))
    assert scale_loaded_marks(cases.compare(tmp_path, numerics)) == marked


def test_a_scale_shared_with_a_quantize_left_in_tvm_stays_in_tvm(tmp_path, rng):
    """A quantize refcg leaves in TVM (int16 output) divides by its scale only while another kernel reads
    the constant: the dequantize reading it stays in TVM too (failed by 1 when it was offloaded)."""
    s = const(RECIPROCAL_SCALES[0])
    x = relay.var("x", shape=(4, 1, 500), dtype="float32")
    y = relay.var("y", shape=(4, 1, 500), dtype="int8")
    q = relay.qnn.op.quantize(x, s, const(0, "int32"), out_dtype="int16")
    shared = relay.qnn.op.dequantize(y, s, const(0, "int32"))
    alone = relay.qnn.op.dequantize(y, const(RECIPROCAL_SCALES[0]), const(0, "int32"))
    mod = module([x, y], relay.Tuple([q, relay.reinterpret(shared, "int32"), relay.reinterpret(alone, "int32")]))
    inputs = {"x": reciprocal_ties(RECIPROCAL_SCALES[0], 2000).reshape(4, 1, 500), "y": random_int(rng, (4, 1, 500), "int8")}
    report = offload_report(compare(mod, inputs, tmp_path, "llvm"))
    assert report.offloaded_ops["qnn.dequantize"] == 1, str(report)
    reasons = [reason for op, _, reason in report.stayed if op == "qnn.dequantize"]
    assert len(reasons) == 1 and "a qnn.quantize left in TVM" in reasons[0], str(report)


def test_a_quantize_feeding_a_cast_that_cannot_hold_its_values_stays_in_tvm(tmp_path, rng):
    """uint8 -> int8 (values above 127) stays in TVM with its cast (TVM-only casts the clipped float);
    int8 -> int32 holds every value: offloaded. The int8 -> uint8 case is test_fuzz_regressions'."""
    x = relay.var("x", shape=(4, 64), dtype="float32")
    data = rng.uniform(-2, 2, (4, 64)).astype("float32")
    u8 = relay.qnn.op.quantize(x, const(0.01), const(128, "int32"), out_dtype="uint8")
    i8 = relay.qnn.op.quantize(x, const(0.02), const(3, "int32"), out_dtype="int8")
    mod = module([x], relay.Tuple([relay.cast(u8, "int8"), relay.cast(i8, "int32")]))
    report = offload_report(compare(mod, {"x": data}, tmp_path, "llvm"))
    stayed = [(op, reason) for op, _, reason in report.stayed if op == "qnn.quantize"]
    assert len(stayed) == 1 and "cast to int8" in stayed[0][1], str(report)
    assert report.offloaded_ops["qnn.quantize"] == 1, str(report)
