"""Check predicates for the pattern table: pure functions of a matched Relay expression.

Each ``check_*`` returns ``None`` when refcg computes the match exactly, or a short
reason why it stays in TVM. The reasons feed the offload report; MergeComposite
only sees the boolean (see ``patterns.py``).
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relay

from .numerics import DTYPE_RANGE

QUANT_DTYPES = ("int8", "uint8")
CONV_LAYOUTS = {("NCHW", "OIHW"), ("NHWC", "HWIO")}


def op_name(expr) -> str | None:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def conv2d_parts(root: relay.Call) -> dict:
    """Split a matched conv chain (clip? <- requantize <- bias? <- qnn.conv2d) into its calls."""
    parts = {"clip": None, "requantize": None, "bias": None, "conv": None}
    expr = root
    if op_name(expr) == "clip":
        parts["clip"], expr = expr, expr.args[0]
    if op_name(expr) == "qnn.requantize":
        parts["requantize"], expr = expr, expr.args[0]
    if op_name(expr) in ("nn.bias_add", "add"):
        parts["bias"], expr = expr, expr.args[0]
    parts["conv"] = expr
    return parts


def const_value(expr) -> np.ndarray | None:
    return expr.data.numpy() if isinstance(expr, relay.Constant) else None


def static_shape(expr) -> tuple[int, ...] | None:
    ttype = expr.checked_type
    if not isinstance(ttype, relay.TensorType):
        return None
    if not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
        return None
    return tuple(int(d) for d in ttype.shape)


def dtype_of(expr) -> str:
    return expr.checked_type.dtype


def is_constant_subgraph(expr) -> bool:
    """True when ``expr`` depends on no variable, so the scoped fold can evaluate it."""
    return not relay.analysis.free_vars(expr)


def check_scale(expr, what: str) -> str | None:
    value = const_value(expr)
    if value is None:
        return f"{what} is not a constant"
    if value.dtype != np.float32:
        return f"{what} has dtype {value.dtype}, expected float32"
    if value.size == 0 or not np.all(np.isfinite(value)) or not np.all(value > 0):
        return f"{what} must be finite and positive"
    return None


def check_zero_point(expr, dtype: str, what: str, allow_vector: bool = False) -> str | None:
    value = const_value(expr)
    if value is None:
        return f"{what} is not a constant"
    if value.ndim > 0 and not allow_vector:
        return f"{what} must be a scalar"
    if value.size == 0 or np.any(value != value.reshape(-1)[0]):
        return f"{what} varies per channel"
    lo, hi = DTYPE_RANGE[dtype]
    if not lo <= int(value.reshape(-1)[0]) <= hi:
        return f"{what} {int(value.reshape(-1)[0])} is outside the {dtype} range"
    return None


def channel_axis(layout: str) -> int:
    return layout.index("C")


def check_clip(clip, dtype: str) -> str | None:
    lo, hi = DTYPE_RANGE[dtype]
    a_min, a_max = float(clip.attrs.a_min), float(clip.attrs.a_max)
    if not (math.isfinite(a_min) and math.isfinite(a_max)):
        return "clip bounds must be finite"
    if not lo <= a_min <= a_max <= hi:
        return f"clip bounds [{a_min}, {a_max}] are outside the {dtype} range"
    return None


def check_requantize(req, channels: int, axis: int, rank: int) -> str | None:
    _, in_scale, in_zp, out_scale, out_zp = req.args
    for reason in (
        check_scale(in_scale, "requantize input_scale"),
        check_scale(out_scale, "requantize output_scale"),
        check_zero_point(in_zp, "int32", "requantize input_zero_point", allow_vector=True),
        check_zero_point(out_zp, req.attrs.out_dtype, "requantize output_zero_point"),
    ):
        if reason:
            return reason
    if const_value(out_scale).size != 1:
        return "requantize output_scale must be a scalar"
    n = const_value(in_scale).size
    if n not in (1, channels):
        return f"requantize input_scale has {n} values for {channels} channels"
    req_axis = int(req.attrs.axis)
    if n > 1 and (req_axis + rank if req_axis < 0 else req_axis) != axis:
        return f"per-channel requantize on axis {req_axis}, expected the channel axis {axis}"
    if req.attrs.out_dtype not in ("int8", "uint8", "int32"):
        return f"requantize out_dtype {req.attrs.out_dtype} is not supported"
    return None


def check_bias(bias, channels: int, axis: int, rank: int) -> str | None:
    value_expr = bias.args[1]
    if not is_constant_subgraph(value_expr):
        return "bias is not constant"
    if dtype_of(value_expr) != "int32":
        return f"bias dtype {dtype_of(value_expr)} is not int32"
    shape = static_shape(value_expr)
    if op_name(bias) == "nn.bias_add":
        bias_axis = int(bias.attrs.axis)
        if (bias_axis + rank if bias_axis < 0 else bias_axis) != axis or shape != (channels,):
            return "bias_add is not per output channel"
        return None
    # add: accept shapes that broadcast along the channel axis only
    expected = [1] * (rank - axis)
    expected[0] = channels
    if shape is None or list(shape[-(rank - axis):]) != expected or any(d != 1 for d in shape[: -(rank - axis)]):
        return f"add of shape {shape} is not a per-channel bias"
    return None


def check_conv2d(root) -> str | None:
    """qnn.conv2d (+bias) + qnn.requantize (+clip) as ``refcg.conv2d`` computes it."""
    parts = conv2d_parts(root)
    conv, req = parts["conv"], parts["requantize"]
    attrs = conv.attrs
    data, weight, in_zp, k_zp, in_scale, k_scale = conv.args
    layouts = (attrs.data_layout, attrs.kernel_layout)
    if layouts not in CONV_LAYOUTS:
        return f"layout {layouts[0]}/{layouts[1]} is not supported"
    if attrs.out_layout not in ("", attrs.data_layout):
        return f"out_layout {attrs.out_layout} differs from data_layout"
    in_shape, w_shape, out_shape = static_shape(data), static_shape(weight), static_shape(conv)
    if in_shape is None or w_shape is None or out_shape is None:
        return "shapes must be static"
    if len(in_shape) != 4:
        return f"input rank {len(in_shape)} is not 4"
    if dtype_of(data) not in QUANT_DTYPES or dtype_of(weight) not in QUANT_DTYPES:
        return f"dtypes {dtype_of(data)}/{dtype_of(weight)} are not int8/uint8"
    if attrs.out_dtype != "int32":
        return f"conv out_dtype {attrs.out_dtype} is not int32"
    if not is_constant_subgraph(weight):
        return "weight is not constant"
    if min(in_shape + out_shape) <= 0:
        return "zero-sized tensor"
    for reason in (
        check_zero_point(in_zp, dtype_of(data), "input_zero_point"),
        check_zero_point(k_zp, dtype_of(weight), "kernel_zero_point", allow_vector=True),
        check_scale(in_scale, "input_scale"),
        check_scale(k_scale, "kernel_scale"),
    ):
        if reason:
            return reason
    axis = channel_axis(attrs.data_layout)
    channels = out_shape[axis]
    if parts["bias"] is not None:
        reason = check_bias(parts["bias"], channels, axis, 4)
        if reason:
            return reason
    if req is None:
        return "no qnn.requantize after the conv"
    reason = check_requantize(req, channels, axis, 4)
    if reason:
        return reason
    if parts["clip"] is not None:
        return check_clip(parts["clip"], req.attrs.out_dtype)
    return None
