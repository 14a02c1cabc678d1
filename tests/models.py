"""Quantized Relay test models built in code (no downloads)."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relay

CONV_KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}


def nchw_or_nhwc(layout: str, n: int, c: int, h: int, w: int) -> tuple[int, ...]:
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def conv_weight_shape(kernel_layout: str, out_c: int, in_c_per_group: int, kh: int, kw: int):
    return {"OIHW": (out_c, in_c_per_group, kh, kw), "HWIO": (kh, kw, in_c_per_group, out_c)}[kernel_layout]


def qconv_block(x, rng, *, in_c, out_c, kernel=(3, 3), strides=(1, 1), padding=(1, 1), dilation=(1, 1),
                groups=1, layout="NCHW", dtype="int8", w_dtype="int8", per_channel=False, bias=True,
                clip=None, input_zp=0, kernel_zp=0, output_zp=0, out_dtype="int8", input_scale=0.05,
                output_scale=0.1, rounding="None", weight_range=None):
    """qnn.conv2d (+bias_add) + qnn.requantize (+clip) on expression ``x``."""
    kernel_layout = CONV_KERNEL_LAYOUT[layout]
    info = np.iinfo(w_dtype)
    lo, hi = weight_range or (info.min, info.max)
    weight = rng.integers(lo, hi + 1, conv_weight_shape(kernel_layout, out_c, in_c // groups, *kernel))
    w_scale = (rng.uniform(0.002, 0.02, out_c) if per_channel else np.array(0.01)).astype("float32")
    y = relay.qnn.op.conv2d(
        x, relay.const(weight.astype(w_dtype)), relay.const(input_zp), relay.const(kernel_zp),
        relay.const(np.float32(input_scale)), relay.const(w_scale), kernel_size=kernel, channels=out_c,
        strides=strides, padding=padding, dilation=dilation, groups=groups, data_layout=layout,
        kernel_layout=kernel_layout,
    )
    axis = layout.index("C")
    if bias:
        y = relay.nn.bias_add(y, relay.const(rng.integers(-5000, 5000, out_c).astype("int32")), axis=axis)
    y = relay.qnn.op.requantize(
        y, relay.const((np.float32(input_scale) * w_scale).astype("float32")), relay.const(0),
        relay.const(np.float32(output_scale)), relay.const(output_zp), axis=axis, rounding=rounding,
        out_dtype=out_dtype,
    )
    if clip is not None:
        y = relay.clip(y, *clip)
    return y


def module(inputs, body) -> tvm.IRModule:
    return tvm.IRModule.from_expr(relay.Function(inputs, body))
