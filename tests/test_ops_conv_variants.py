"""refcg.conv2d variants beyond the base sweep (test_conv2d.py): dtype mixes, zero points,
groups and depthwise with channel multiplier, dilation. Bit-exact against TVM-only."""
import numpy as np
from tvm import relay

from models import nchw_or_nhwc, qconv_block
from test_ops_common import Cases, const

VARIANTS = [
    # layout, in dtype, w dtype, in_c, out_c, groups, kernel, dilation, zps (in, kernel, out), out dtype, clip
    ("NCHW", "uint8", "int8", 4, 6, 1, (3, 3), (1, 1), (128, 0, 128), "uint8", None),
    ("NHWC", "uint8", "uint8", 3, 5, 1, (3, 3), (1, 1), (120, 130, 0), "int8", (0, 127)),
    ("NCHW", "int8", "uint8", 4, 4, 1, (2, 3), (2, 1), (-5, 128, 3), "int8", None),
    ("NCHW", "int8", "int8", 8, 8, 8, (3, 3), (1, 1), (3, 2, -1), "int8", (0, 100)),  # depthwise
    ("NCHW", "int8", "int8", 4, 8, 4, (3, 3), (2, 2), (0, 0, 0), "int8", None),  # depthwise, multiplier 2
    ("NHWC", "int8", "int8", 8, 12, 4, (3, 3), (1, 1), (1, 0, 0), "uint8", None),  # grouped
    ("NHWC", "uint8", "int8", 6, 6, 6, (3, 3), (1, 2), (128, 0, 5), "uint8", (10, 200)),  # depthwise
]


def test_conv2d_variants_match_tvm(tmp_path, rng):
    cases = Cases()
    for layout, dtype, w_dtype, in_c, out_c, groups, kernel, dilation, zps, out_dtype, clip in VARIANTS:
        x = cases.var(nchw_or_nhwc(layout, 1, in_c, 9, 8), dtype, rng)
        cases.add(qconv_block(x, rng, in_c=in_c, out_c=out_c, groups=groups, kernel=kernel, dilation=dilation,
                              layout=layout, w_dtype=w_dtype, input_zp=zps[0], kernel_zp=zps[1],
                              output_zp=zps[2], out_dtype=out_dtype, clip=clip, per_channel=True))
    cases.compare(tmp_path)


def test_conv2d_vector_of_equal_kernel_zero_points(tmp_path, rng):
    """ONNX QOperator per-channel imports give kernel_zero_point as a vector of equal values."""
    cases = Cases()
    x = cases.var((1, 4, 7, 7), "uint8", rng)
    w = relay.const(rng.integers(0, 256, (6, 4, 3, 3)).astype("uint8"))
    w_scale = rng.uniform(0.002, 0.02, 6).astype("float32")
    y = relay.qnn.op.conv2d(x, w, const(128, "int32"), relay.const(np.full(6, 131, "int32")), const(0.05),
                            relay.const(w_scale), kernel_size=(3, 3), channels=6, padding=(1, 1))
    y = relay.qnn.op.requantize(y, relay.const(np.float32(0.05) * w_scale), const(0, "int32"), const(0.1),
                                const(128, "int32"), axis=1, out_dtype="uint8")
    cases.add(y)
    cases.compare(tmp_path)
