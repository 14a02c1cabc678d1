"""refcg.dense (qnn.dense + bias + requantize + clip) against TVM-only: bit-exact."""
import numpy as np
import pytest
from tvm import relay

from test_ops_common import NUMERICS, Cases, const


def dense_block(x, rng, *, in_f, units, w_dtype="int8", input_zp=0, kernel_zp=0, per_channel=False,
                bias=True, requantize="int8", output_zp=0, clip=None, rounding="None", weight_range=None):
    info = np.iinfo(w_dtype)
    lo, hi = weight_range or (info.min, info.max)
    w = relay.const(rng.integers(lo, hi + 1, (units, in_f)).astype(w_dtype))
    w_scale = (rng.uniform(0.002, 0.02, units) if per_channel else np.array(0.01)).astype("float32")
    y = relay.qnn.op.dense(x, w, const(input_zp, "int32"), const(kernel_zp, "int32"), const(0.05),
                           relay.const(w_scale), units=units)
    if bias:
        y = relay.nn.bias_add(y, relay.const(rng.integers(-3000, 3000, units).astype("int32")), axis=1)
    if requantize is None:
        return y
    y = relay.qnn.op.requantize(y, relay.const((np.float32(0.05) * w_scale).astype("float32")),
                                const(0, "int32"), const(0.08), const(output_zp, "int32"), axis=1,
                                rounding=rounding, out_dtype=requantize)
    return relay.clip(y, *clip) if clip else y


SWEEP = [
    # batch, in_f, units, in dtype, w dtype, zps (in, kernel, out), per_channel, bias, out dtype, clip, rounding
    (1, 16, 8, "int8", "int8", (0, 0, 0), False, True, "int8", None, "None"),
    (3, 33, 7, "int8", "int8", (5, 0, -3), True, True, "int8", (0, 127), "None"),
    (2, 20, 12, "uint8", "int8", (128, 0, 10), True, False, "uint8", None, "None"),
    (1, 9, 5, "int8", "uint8", (-4, 120, 0), False, True, "int8", (-50, 60), "None"),
    (4, 12, 6, "uint8", "uint8", (3, 7, 128), True, True, "uint8", (10, 250), "None"),
    (2, 17, 9, "int8", "int8", (2, 0, 0), True, True, None, None, "None"),  # int32 output kept
    (1, 16, 8, "int8", "int8", (1, 0, 2), True, True, "int8", None, "TONEAREST"),  # the op's own attribute
]


def test_dense_matches_tvm(tmp_path, rng):
    cases = Cases()
    for batch, in_f, units, dtype, w_dtype, zps, per_channel, bias, out_dtype, clip, rounding in SWEEP:
        x = cases.var((batch, in_f), dtype, rng)
        cases.add(dense_block(x, rng, in_f=in_f, units=units, w_dtype=w_dtype, input_zp=zps[0], kernel_zp=zps[1],
                              output_zp=zps[2], per_channel=per_channel, bias=bias, requantize=out_dtype,
                              clip=clip, rounding=rounding))
    cases.compare(tmp_path)


@pytest.mark.parametrize("numerics", [n for n in NUMERICS if n != "llvm"])
def test_dense_requantize_modes(tmp_path, rng, numerics):
    """per-tensor dense -> per-channel dense (+clip) in one partition, under each numerics."""
    cases = Cases()
    x = cases.var((2, 24), "int8", rng)
    # weights in [-63, 63]: TVM-only's sse4.2 dense (vpmaddubsw) saturates int16 on full-range weights
    y = dense_block(x, rng, in_f=24, units=16, input_zp=3, output_zp=-7, weight_range=(-63, 63))
    y = dense_block(y, rng, in_f=16, units=10, input_zp=-7, output_zp=4, per_channel=True,
                    weight_range=(-63, 63), clip=(-100, 100))
    cases.add(y)
    cases.compare(tmp_path, numerics, expect_partitions=1)
