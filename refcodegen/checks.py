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
from .softmax import overflow_reason, x0_of
from .packing import pack_conv2d_weight

QUANT_DTYPES = ("int8", "uint8")
CONV_LAYOUTS = {("NCHW", "OIHW"), ("NHWC", "HWIO"), ("NHWC", "HWOI")}
# int16: TVM 0.19 computes it in int16 (wrapping) or in int32 then narrows; both equal int32 wrapped
CONV_OUT_DTYPES = ("int32", "int16")


def op_name(expr) -> str | None:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def epilogue_parts(root: relay.Call) -> dict:
    """Split a matched chain (cast? <- clip? <- requantize? <- bias? <- anchor) into its calls."""
    parts = {"cast": None, "clip": None, "requantize": None, "bias": None, "anchor": None}
    expr = root
    if op_name(expr) == "cast":
        parts["cast"], expr = expr, expr.args[0]
    if op_name(expr) == "clip":
        parts["clip"], expr = expr, expr.args[0]
    if op_name(expr) == "qnn.requantize":
        parts["requantize"], expr = expr, expr.args[0]
    if op_name(expr) in ("nn.bias_add", "add"):
        parts["bias"], expr = expr, expr.args[0]
    parts["anchor"] = expr
    return parts


def conv2d_parts(root: relay.Call) -> dict:
    """Split a matched conv chain (clip? <- requantize? <- bias? <- qnn.conv2d <- nn.pad?) into its calls.

    ``pad`` is the conv's input when that is an ``nn.pad`` (inside a composite: the fused one).
    """
    parts = epilogue_parts(root)
    parts["conv"] = parts.pop("anchor")
    data = parts["conv"].args[0]
    parts["pad"] = data if op_name(data) == "nn.pad" else None
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
    if dtype not in DTYPE_RANGE:
        return f"{what} is for dtype {dtype}, which refcg does not compute"
    lo, hi = DTYPE_RANGE[dtype]
    if not lo <= int(value.reshape(-1)[0]) <= hi:
        return f"{what} {int(value.reshape(-1)[0])} is outside the {dtype} range"
    return None


def channel_axis(layout: str) -> int:
    return layout.index("C")


def check_clip(clip, dtype: str) -> str | None:
    if dtype not in DTYPE_RANGE:
        return f"clip of a {dtype} tensor"
    lo, hi = DTYPE_RANGE[dtype]
    a_min, a_max = float(clip.attrs.a_min), float(clip.attrs.a_max)
    if not (math.isfinite(a_min) and math.isfinite(a_max)):
        return "clip bounds must be finite"
    if not lo <= a_min <= a_max <= hi:
        return f"clip bounds [{a_min}, {a_max}] are outside the {dtype} range"
    return None


REQUANTIZE_DTYPES = ("int8", "uint8", "int16", "int32")  # what TVM 0.19 accepts, less int64 inputs


def check_requantize(req, channels: int, axis: int, rank: int) -> str | None:
    _, in_scale, in_zp, out_scale, out_zp = req.args
    if req.attrs.out_dtype not in REQUANTIZE_DTYPES:
        return f"requantize out_dtype {req.attrs.out_dtype} is not supported"
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
    if attrs.out_dtype not in CONV_OUT_DTYPES:
        return f"conv out_dtype {attrs.out_dtype} is not int32 or int16"
    if attrs.out_dtype != "int32" and (req is not None or parts["bias"] is not None):
        return f"bias or requantize after a conv with out_dtype {attrs.out_dtype}"
    if not is_constant_subgraph(weight):
        return "weight is not constant"
    if min(in_shape) <= 0:
        return "zero-sized tensor"
    if min(out_shape) <= 0:  # Relay infers a negative output size for it
        return f"the kernel is larger than the padded input (output shape {out_shape})"
    reason = first_reason(check_elements(in_shape, "conv input"), check_elements(out_shape, "conv output"))
    if reason:
        return reason
    for reason in (
        check_zero_point(in_zp, dtype_of(data), "input_zero_point"),
        check_zero_point(k_zp, dtype_of(weight), "kernel_zero_point", allow_vector=True),
        check_scale(in_scale, "input_scale"),
        check_scale(k_scale, "kernel_scale"),
    ):
        if reason:
            return reason
    axis = channel_axis(attrs.data_layout)
    channels, groups = out_shape[axis], int(attrs.groups)
    depthwise = groups > 1 and groups == in_shape[axis] == w_shape[attrs.kernel_layout.index("O")]
    if attrs.kernel_layout == "HWOI" and not depthwise:
        return "kernel layout HWOI is only supported for depthwise (groups == input channels)"
    if parts["bias"] is not None:
        reason = check_bias(parts["bias"], channels, axis, 4)
        if reason:
            return reason
    w = const_value(weight)
    ohwi = None if w is None else pack_conv2d_weight(w, attrs.kernel_layout, groups, in_shape[axis])
    reason = check_accumulator("qnn.conv2d", data, in_zp, weight, k_zp, math.prod(w_shape) // channels, 0,
                               parts["bias"], values=ohwi)
    if reason:
        return reason
    if req is None:
        return None  # the int32 (or int16) accumulator is the output
    reason = check_requantize(req, channels, axis, 4)
    if reason:
        return reason
    if parts["clip"] is not None:
        return check_clip(parts["clip"], req.attrs.out_dtype) or check_output_cast(parts)
    return None


def check_output_cast(parts: dict) -> str | None:
    """A cast after requantize-to-int32 + clip (PyTorch's conv and linear): the kernel stores the
    narrow type directly when the clip keeps every value inside it (the cast then changes nothing)."""
    cast, clip = parts["cast"], parts["clip"]
    if cast is None:
        return None
    if clip is None or parts["requantize"] is None:
        return "cast without a requantize and clip in front"
    dtype = dtype_of(cast)
    if dtype not in QUANT_DTYPES:
        return f"cast to {dtype} after the requantize"
    lo, hi = DTYPE_RANGE[dtype]
    if not lo <= int(float(clip.attrs.a_min)) <= int(float(clip.attrs.a_max)) <= hi:
        return f"clip [{clip.attrs.a_min}, {clip.attrs.a_max}] before a cast to {dtype} lets values wrap"
    return None


def check_padded_conv2d(root) -> str | None:
    """``nn.pad`` + a conv chain that ``check_conv2d`` accepts: the pad folds into the conv's padding
    when it pads only H and W, by non-negative widths, with the input zero point (which qnn.conv2d
    pads with too). nn.pad casts its pad value to the data dtype: equal to an in-range zero point,
    that cast is exact."""
    parts = conv2d_parts(root)
    pad, conv = parts["pad"], parts["conv"]
    reason = check_conv2d(root)
    if reason:
        return reason
    if pad.attrs.pad_mode != "constant":
        return f"pad_mode {pad.attrs.pad_mode} is not constant"
    layout = conv.attrs.data_layout
    for axis, (before, after) in zip(layout, pad.attrs.pad_width):
        before, after = int(before), int(after)
        if axis in "NC" and (before or after):
            return f"pad on the {axis} axis"
        if before < 0 or after < 0:
            return f"negative pad width ({before}, {after}) on the {axis} axis"
    value, zero_point = const_value(pad.args[1]), int(const_value(conv.args[2]).reshape(-1)[0])
    if value.size != 1 or not np.isfinite(value).all() or value.reshape(-1)[0] != zero_point:
        return f"pad value {value.reshape(-1).tolist()} differs from the input zero point {zero_point}"
    return None


def first_reason(*reasons) -> str | None:
    return next((r for r in reasons if r), None)


def check_qparams(scale, zero_point, dtype: str, what: str) -> str | None:
    """A per-tensor (scalar) scale and zero point, as the elementwise kernels take them."""
    reason = first_reason(check_scale(scale, f"{what} scale"), check_zero_point(zero_point, dtype, f"{what} zero point"))
    if reason is None and const_value(scale).size != 1:
        return f"{what} scale must be a scalar"
    return reason


def check_tensor(expr, what: str, dtypes=QUANT_DTYPES, max_rank: int = 6, min_rank: int = 1) -> str | None:
    shape = static_shape(expr)
    if shape is None:
        return f"{what} shape must be static"
    if not min_rank <= len(shape) <= max_rank:
        return f"{what} rank {len(shape)} is not between {min_rank} and {max_rank}"
    if min(shape, default=1) <= 0:
        return f"{what} is zero-sized"
    if check_elements(shape, what):
        return check_elements(shape, what)
    if dtype_of(expr) not in dtypes:
        return f"{what} dtype {dtype_of(expr)} is not one of {'/'.join(dtypes)}"
    return None


INT32_MAX = 2**31 - 1


def check_elements(shape, what: str) -> str | None:
    """Kernel parameters hold dimensions as int32: bigger tensors stay in TVM."""
    count = math.prod(shape)
    return f"{what} has {count} elements, more than int32 indexing allows" if count > INT32_MAX else None


def check_accumulator(op: str, data, in_zp, weight, k_zp, reduction: int, out_axis: int, bias=None,
                      values: np.ndarray | None = None) -> str | None:
    """The int32 accumulator must not wrap: reject when the worst case of sum (x - zx)(w - zw) (+ bias) can.

    With constant weights the bound is exact per output channel (max |x - zx| times sum |w - zw|);
    weights not folded yet (e.g. qnn.quantize(const)) get the dtype-range bound. ``values``: the
    constant weights rearranged so that ``out_axis`` indexes output channels (default: ``weight``'s).
    """
    lo, hi = DTYPE_RANGE[dtype_of(data)]
    zx, zw = int(const_value(in_zp).reshape(-1)[0]), int(const_value(k_zp).reshape(-1)[0])
    max_x = max(abs(lo - zx), abs(hi - zx))
    w = const_value(weight) if values is None else values
    if w is None:
        w_lo, w_hi = DTYPE_RANGE[dtype_of(weight)]
        bound = reduction * max_x * max(abs(w_lo - zw), abs(w_hi - zw))
    else:
        sums = np.abs(w.astype(np.int64) - zw).sum(axis=tuple(a for a in range(w.ndim) if a != out_axis))
        bound = max_x * int(sums.max(initial=0))
    b = const_value(bias.args[1]) if bias is not None else None
    bound += int(np.abs(b.astype(np.int64)).max(initial=0)) if b is not None else 0
    if bound > INT32_MAX:
        return f"{op} int32 accumulator can overflow (worst case {bound} over reduction length {reduction})"
    return None


def check_epilogue(parts: dict, channels: int, axis: int, rank: int, require_requantize: bool) -> str | None:
    """bias (per channel), requantize and clip of a matched chain."""
    if parts["bias"] is not None:
        reason = check_bias(parts["bias"], channels, axis, rank)
        if reason:
            return reason
    req = parts["requantize"]
    if req is None:
        return "no qnn.requantize after the op" if require_requantize else None
    reason = check_requantize(req, channels, axis, rank)
    if reason is None and parts["clip"] is not None:
        return check_clip(parts["clip"], req.attrs.out_dtype) or check_output_cast(parts)
    return reason or check_output_cast(parts)


def check_dense(root) -> str | None:
    """qnn.dense (+bias) (+requantize (+clip)) as ``refcg.dense`` computes it; int32 output kept."""
    parts = epilogue_parts(root)
    dense = parts["anchor"]
    data, weight, in_zp, k_zp, in_scale, k_scale = dense.args
    if op_name(data) in ("reshape", "nn.batch_flatten"):
        reason = check_tensor(data.args[0], "dense input")  # the flatten is free on a compact tensor
        if reason:
            return reason
    reason = first_reason(check_tensor(data, "dense input", max_rank=2), check_tensor(weight, "dense weight", max_rank=2))
    if reason:
        return reason
    if len(static_shape(data)) != 2:
        return "dense input must be 2-D"
    if dense.attrs.out_dtype not in ("", "int32"):
        return f"dense out_dtype {dense.attrs.out_dtype} is not int32"
    if not is_constant_subgraph(weight):
        return "weight is not constant"
    reason = first_reason(
        check_zero_point(in_zp, dtype_of(data), "input_zero_point"),
        check_zero_point(k_zp, dtype_of(weight), "kernel_zero_point", allow_vector=True),
        check_scale(in_scale, "input_scale"),
        check_scale(k_scale, "kernel_scale"),
    )
    reason = reason or check_accumulator("qnn.dense", data, in_zp, weight, k_zp, static_shape(weight)[1], 0,
                                         parts["bias"])
    if reason:
        return reason
    return check_epilogue(parts, static_shape(dense)[1], 1, 2, require_requantize=False)


BINARY_OPS = ("qnn.add", "qnn.subtract", "qnn.mul")


def binary_parts(root) -> dict:
    return {"clip": root if op_name(root) == "clip" else None,
            "op": root.args[0] if op_name(root) == "clip" else root}


def check_binary(root) -> str | None:
    """qnn.add / qnn.subtract / qnn.mul (+clip) with per-tensor qparams and broadcasting."""
    parts = binary_parts(root)
    call = parts["op"]
    lhs, rhs, lhs_scale, lhs_zp, rhs_scale, rhs_zp, out_scale, out_zp = call.args
    # a rank-0 operand (TFLite's hard-swish and x/6 constants) broadcasts like shape (1,)
    reason = first_reason(check_tensor(lhs, "lhs", min_rank=0), check_tensor(rhs, "rhs", min_rank=0),
                          check_tensor(call, "output"))
    if reason:
        return reason
    out_dtype = dtype_of(call)
    reason = first_reason(
        check_qparams(lhs_scale, lhs_zp, dtype_of(lhs), "lhs"),
        check_qparams(rhs_scale, rhs_zp, dtype_of(rhs), "rhs"),
        check_qparams(out_scale, out_zp, out_dtype, "output"),
    )
    if reason is None and parts["clip"] is not None:
        return check_clip(parts["clip"], out_dtype)
    return reason


def check_requantize_alone(root) -> str | None:
    """qnn.requantize (+clip) on its own, per-tensor or along any axis."""
    parts = epilogue_parts(root)
    req = parts["requantize"]
    reason = check_tensor(req.args[0], "requantize input", dtypes=REQUANTIZE_DTYPES)
    if reason:
        return reason
    shape = static_shape(req.args[0])
    axis = int(req.attrs.axis) % len(shape)
    return check_epilogue(parts, shape[axis], axis, len(shape), require_requantize=True)


def check_concatenate(call) -> str | None:
    """qnn.concatenate: each input requantized to the output qparams, then joined."""
    data, scales, zero_points, out_scale, out_zp = call.args
    reason = check_tensor(call, "output")
    for i, (x, scale, zp) in enumerate(zip(data.fields, scales.fields, zero_points.fields)):
        reason = reason or check_tensor(x, f"input {i}") or check_qparams(scale, zp, dtype_of(x), f"input {i}")
    return reason or check_qparams(out_scale, out_zp, dtype_of(call), "output")


POOL_LAYOUTS = ("NCHW", "NHWC")


def pool_parts(root) -> dict:
    """max_pool2d, or cast(avg_pool2d|global_avg_pool2d(cast(x, int32))) split into its calls."""
    if op_name(root) == "nn.max_pool2d":
        return {"pool": root, "data": root.args[0], "out": root}
    pool = root.args[0]
    return {"pool": pool, "data": pool.args[0].args[0], "inner_cast": pool.args[0], "out": root}


def pool_padding(attrs) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from the 1-, 2- or 4-value padding attribute."""
    pad = [int(p) for p in getattr(attrs, "padding", [0])]
    if len(pad) == 1:
        pad = pad * 4
    elif len(pad) == 2:
        pad = pad * 2
    return tuple(pad)


def check_pool(root) -> str | None:
    parts = pool_parts(root)
    pool, data, out = parts["pool"], parts["data"], parts["out"]
    attrs = pool.attrs
    reason = first_reason(check_tensor(data, "pool input", max_rank=4), check_tensor(out, "pool output", max_rank=4))
    if reason:
        return reason
    if len(static_shape(data)) != 4:
        return "pool input must be 4-D"
    if attrs.layout not in POOL_LAYOUTS:
        return f"pool layout {attrs.layout} is not supported"
    if str(getattr(attrs, "out_layout", "")) not in ("", attrs.layout):
        return f"out_layout {attrs.out_layout} differs from layout"
    if "inner_cast" in parts and dtype_of(parts["inner_cast"]) != "int32":
        return f"average pooling computed in {dtype_of(parts['inner_cast'])}, not int32"
    if op_name(pool) == "nn.avg_pool2d" and bool(attrs.count_include_pad) and bool(attrs.ceil_mode):
        top, left, bottom, right = pool_padding(attrs)
        layout, in_shape, out_shape = attrs.layout, static_shape(data), static_shape(pool)
        for i, (axis, pad_head, pad_tail) in enumerate((("H", top, bottom), ("W", left, right))):
            last_start = (out_shape[layout.index(axis)] - 1) * int(attrs.strides[i]) - pad_head
            if last_start > in_shape[layout.index(axis)] + pad_tail - 1:
                return "ceil_mode window entirely outside the padded input (TVM divides by a non-positive count)"
    return None


def check_axis_qparams(call, shape, scale, zero_point, dtype: str, what: str) -> str | None:
    """Scale and zero point of qnn.quantize/dequantize: each a scalar or one value per element of
    the ``axis`` dimension (zero points may differ per channel), zero points in the ``dtype`` range."""
    reason = check_scale(scale, f"{what} scale")
    if reason:
        return reason
    zp = const_value(zero_point)
    if zp is None or zp.dtype != np.int32:
        return f"{what} zero point is not an int32 constant"
    channels = shape[int(call.attrs.axis) % len(shape)]
    for name, value in (("scale", const_value(scale)), ("zero point", zp)):
        if value.size not in (1, channels):
            return f"{what} {name} has {value.size} values for an axis of length {channels}"
    lo, hi = DTYPE_RANGE[dtype]
    if zp.size == 0 or zp.min() < lo or zp.max() > hi:
        return f"{what} zero point outside the {dtype} range"
    return None


def check_quantize(call) -> str | None:
    """qnn.quantize of a computed float32 tensor, or qnn.dequantize, per tensor or along any axis."""
    data, scale, zero_point = call.args
    if op_name(call) == "qnn.quantize":
        if is_constant_subgraph(data):
            return "constant input: the scoped fold evaluates it"
        reason = check_tensor(data, "quantize input", dtypes=("float32",)) or check_tensor(call, "quantize output")
        quant_dtype = dtype_of(call)
    else:
        reason = check_tensor(data, "dequantize input") or check_tensor(call, "dequantize output", dtypes=("float32",))
        quant_dtype = dtype_of(data)
    return reason or check_axis_qparams(call, static_shape(data), scale, zero_point, quant_dtype, op_name(call)[4:])


# qnn unary ops TVM 0.19 canonicalizes to a function of each 8-bit value (a lookup table)
LUT_QNN_OPS = ("qnn.sigmoid", "qnn.tanh", "qnn.hardswish", "qnn.leaky_relu")


def lut_parts(root) -> dict:
    """A matched unary chain: ``qnn.<op>(x, qparams)`` or ``qnn.quantize(f(qnn.dequantize(x)))``.

    ``op`` is the call the report names, ``input`` the 8-bit tensor, ``calls`` every call of
    the chain and ``qparams`` its (scale, zero point, quantized dtype) triples.
    """
    if op_name(root) in LUT_QNN_OPS:
        data, in_scale, in_zp, out_scale, out_zp = root.args
        dtype = dtype_of(data)
        return {"op": root, "input": data, "calls": [root],
                "qparams": [(in_scale, in_zp, dtype, "input"), (out_scale, out_zp, dtype, "output")]}
    calls, dequantize = [], None

    def walk(expr):
        nonlocal dequantize
        if op_name(expr) == "qnn.dequantize":
            dequantize = expr
        elif isinstance(expr, relay.Call) and expr not in calls:
            calls.append(expr)
            for arg in expr.args:
                walk(arg)

    walk(root.args[0])
    data = dequantize.args[0]
    return {"op": root.args[0], "input": data, "calls": [root, dequantize, *calls],
            "qparams": [(dequantize.args[1], dequantize.args[2], dtype_of(data), "dequantize"),
                        (root.args[1], root.args[2], dtype_of(root), "quantize")]}


def check_lut(root, cannot_run=None) -> str | None:
    """An elementwise function of one int8/uint8 tensor with scalar qparams and constants.

    ``cannot_run``: why the table cannot be computed for the partition's target (lut.cannot_compute).
    """
    parts = lut_parts(root)
    data = parts["input"]
    reason = first_reason(check_tensor(data, "input"), check_tensor(root, "output"))
    if reason:
        return reason
    if static_shape(data) != static_shape(root):
        return f"output shape {static_shape(root)} differs from input shape {static_shape(data)}"
    for scale, zero_point, dtype, what in parts["qparams"]:
        reason = check_qparams(scale, zero_point, dtype, what)
        if reason:
            return reason
    for call in parts["calls"]:
        for arg in call.args:
            value = const_value(arg)
            if value is not None and value.size != 1:
                return f"{op_name(call)} has a constant of shape {value.shape}, not a scalar"
    return cannot_run


def check_softmax(call) -> str | None:
    """qnn.softmax (int8) as TVM's integer algorithm computes it without leaving int32."""
    data, scale, zero_point, out_scale, out_zp = call.args
    reason = first_reason(
        check_tensor(data, "softmax input", dtypes=("int8",)),
        check_qparams(scale, zero_point, "int8", "input"),
        check_qparams(out_scale, out_zp, "int8", "output"),
    )
    if reason:
        return reason
    shape = static_shape(data)
    return overflow_reason(x0_of(float(const_value(scale).reshape(-1)[0])), shape[int(call.attrs.axis) % len(shape)])


def check_float_softmax(root) -> str | None:
    """qnn.dequantize -> nn.softmax (last axis) -> qnn.quantize, per-tensor qparams."""
    softmax = root.args[0]
    dequantize = softmax.args[0]
    data = dequantize.args[0]
    reason = first_reason(
        check_tensor(data, "softmax input"), check_tensor(root, "softmax output"),
        check_qparams(dequantize.args[1], dequantize.args[2], dtype_of(data), "dequantize"),
        check_qparams(root.args[1], root.args[2], dtype_of(root), "quantize"),
    )
    if reason:
        return reason
    rank = len(static_shape(data))
    if int(softmax.attrs.axis) % rank != rank - 1:
        return f"float softmax over axis {int(softmax.attrs.axis)}, not the last one (TVM schedules it differently)"
    return None


REDUCE_OPS = ("mean", "sum", "nn.adaptive_avg_pool2d", "nn.global_avg_pool2d")


def reduce_parts(root) -> dict:
    """(cast(...))? <- mean|sum|adaptive/global avg pool <- cast(x, int32), split into its calls."""
    out_cast = root if op_name(root) == "cast" else None
    reduce = root.args[0] if out_cast is not None else root
    inner_cast = reduce.args[0]
    return {"out_cast": out_cast, "reduce": reduce, "inner_cast": inner_cast, "data": inner_cast.args[0],
            "out": root}


def reduce_axes(reduce) -> list[int]:
    """The input axes a matched reduction sums over, sorted."""
    shape = static_shape(reduce.args[0])
    rank = len(shape)
    if op_name(reduce) in ("mean", "sum"):
        axes = list(range(rank)) if reduce.attrs.axis is None else sorted(int(a) % rank for a in reduce.attrs.axis)
        return [a for a in range(rank) if a not in axes] if bool(reduce.attrs.exclude) else axes
    layout = str(reduce.attrs.layout)
    return sorted(layout.index(axis) for axis in "HW")


def check_reduce(root) -> str | None:
    """A sum or mean of an 8-bit tensor computed in int32 (the cast-int32 forms of TFLite MEAN and
    PyTorch's quantized adaptive_avg_pool2d), optionally cast back to an integer type."""
    parts = reduce_parts(root)
    reduce, data = parts["reduce"], parts["data"]
    reason = first_reason(check_tensor(data, "reduce input", dtypes=QUANT_DTYPES + ("int16",)),
                          check_tensor(parts["out"], "reduce output", dtypes=REQUANTIZE_DTYPES, min_rank=0))
    if reason:
        return reason
    if dtype_of(parts["inner_cast"]) != "int32" or dtype_of(reduce) != "int32":
        return f"{op_name(reduce)} computed in {dtype_of(reduce)}, not int32"
    if op_name(reduce) in ("nn.adaptive_avg_pool2d", "nn.global_avg_pool2d"):
        attrs = reduce.attrs
        if str(attrs.layout) not in POOL_LAYOUTS or str(getattr(attrs, "out_layout", "")) not in ("", attrs.layout):
            return f"pool layout {attrs.layout} is not supported"
        out_shape = static_shape(reduce)
        if len(out_shape) != 4 or any(out_shape[str(attrs.layout).index(a)] != 1 for a in "HW"):
            return f"{op_name(reduce)} output {out_shape} is not 1x1"
    axes = reduce_axes(reduce)
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return f"reduction over axes {axes}, not one contiguous run"
    shape = static_shape(data)
    count = math.prod(shape[a] for a in axes)
    lo, hi = DTYPE_RANGE[dtype_of(data)]
    if count * max(abs(lo), hi) > INT32_MAX:
        return f"int32 sum over {count} elements can overflow"
    return None


COPY_OPS = ("cast", "reshape", "squeeze", "expand_dims", "nn.batch_flatten", "transpose", "layout_transform",
            "strided_slice", "nn.pad", "clip", "maximum", "minimum")
RESHAPE_OPS = ("reshape", "squeeze", "expand_dims", "nn.batch_flatten")


def copy_data(call):
    """The tensor operand of a matched data-movement or clamp op (maximum/minimum: the non-constant one)."""
    if op_name(call) in ("maximum", "minimum") and isinstance(call.args[0], relay.Constant):
        return call.args[1]
    return call.args[0]


def copy_bound(call) -> int:
    """The constant of maximum/minimum as an integer."""
    other = call.args[0] if isinstance(call.args[0], relay.Constant) else call.args[1]
    return int(const_value(other).reshape(-1)[0])


def check_copy(call) -> str | None:
    """Data movement and clamping of one integer tensor: nothing is rounded, TVM's result is reproduced."""
    op, data = op_name(call), copy_data(call)
    if isinstance(data, relay.Constant):
        return f"{op} of a constant (TVM folds it)"
    reason = first_reason(check_tensor(data, f"{op} input", dtypes=REQUANTIZE_DTYPES, min_rank=0),
                          check_tensor(call, f"{op} output", dtypes=REQUANTIZE_DTYPES))
    if reason:
        return reason
    if dtype_of(data) != dtype_of(call) and op != "cast":
        return f"{op} changes dtype"
    if op == "clip":
        return check_clip(call, dtype_of(call))
    if op in ("maximum", "minimum"):
        bound = const_value(call.args[0] if isinstance(call.args[0], relay.Constant) else call.args[1])
        if bound.size != 1 or bound.dtype != np.dtype(dtype_of(data)):
            return f"{op} operand is not a scalar {dtype_of(data)} constant"
        return None
    if op == "layout_transform":
        src, dst = str(call.attrs.src_layout), str(call.attrs.dst_layout)
        if sorted(src) != sorted(dst) or not src.isalpha() or not src.isupper():
            return f"layout_transform {src} -> {dst} is not a permutation of plain axes"
    if op == "strided_slice":
        return check_strided_slice(call)
    if op == "nn.pad":
        value = const_value(call.args[1])
        lo, hi = DTYPE_RANGE[dtype_of(data)]
        if str(call.attrs.pad_mode) != "constant":
            return f"pad mode {call.attrs.pad_mode} is not constant"
        if value is None or value.size != 1 or not float(value.reshape(-1)[0]).is_integer() or \
                not lo <= float(value.reshape(-1)[0]) <= hi:
            return f"pad value is not a constant integer in the {dtype_of(data)} range"
        if any(int(w) < 0 for pair in call.attrs.pad_width for w in pair):
            return "negative pad width"
    return None


def strided_slice_spec(call) -> tuple[list[int], list[int]] | None:
    """(begin, step) per input axis of a strided_slice, or None when not static."""
    attrs = call.attrs
    shape, out = static_shape(call.args[0]), static_shape(call)
    if attrs.begin is None or any(not isinstance(b, (int, tvm.tir.IntImm)) for b in attrs.begin):
        return None
    rank = len(shape)
    axes = list(range(rank)) if attrs.axes is None else [int(a) % rank for a in attrs.axes]
    given = [] if attrs.strides is None else [int(s) for s in attrs.strides]
    strides = given + [1] * (len(axes) - len(given))  # TVM takes a missing stride as 1
    begin, step, end = [0] * rank, [1] * rank, list(shape)
    ends = [] if attrs.end is None else list(attrs.end)
    for i, axis in enumerate(axes):
        if i >= len(attrs.begin):
            break
        dim, s = shape[axis], strides[i]
        b = int(attrs.begin[i])
        begin[axis] = min(max(b + dim if b < 0 else b, 0), dim)
        if i < len(ends) and isinstance(ends[i], (int, tvm.tir.IntImm)):
            e = int(ends[i])
            end[axis] = min(max(e + dim if e < 0 else e, 0), dim)
        step[axis] = s
    for axis in range(rank):
        # this reading of the attributes must give the inferred shape, else TVM reads them differently
        if step[axis] <= 0 or out[axis] != max(0, -(-(end[axis] - begin[axis]) // step[axis])):
            return None
    return begin, step


def check_strided_slice(call) -> str | None:
    if str(call.attrs.slice_mode) != "end":
        return f"strided_slice slice_mode {call.attrs.slice_mode}"
    attrs = call.attrs
    if attrs.strides is not None and any(int(s) <= 0 for s in attrs.strides):
        return "strided_slice with a negative stride"
    if strided_slice_spec(call) is None:
        return "strided_slice bounds are not static or not understood"
    return None
