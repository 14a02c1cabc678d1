"""refcg.requantize (qnn.requantize alone) and refcg.concatenate against TVM-only: bit-exact."""
import numpy as np
import pytest
from tvm import relay

from conftest import random_int
from test_ops_common import NUMERICS, Cases, const, qparams


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
