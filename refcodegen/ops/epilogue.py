"""The epilogue shared by conv2d, dense and requantize: ``anchor -> bias? -> qnn.requantize? ->
clip? -> cast?``, parsed once into an ``Epilogue``, checked by ``reason`` and lowered to the C
core's ``refcg_requant`` constants by ``requant``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relay
from tvm.relay.dataflow_pattern import is_op

from ..numerics import (DTYPE_RANGE, FloatLowering, Requantize, float_lowering, make_requantize, no_requantize,
                        resolve_mode, without_fma)
from .base import (QUANT_DTYPES, REQUANTIZE_DTYPES, check_clip, check_scale, check_zero_point, const_value,
                   constant_subgraph, constants, dtype_of, folded_constant, is_constant_subgraph, op_name, scalar,
                   static_shape)


# ops whose result is no larger in magnitude than their (first) input: the integer means and pools of
# refcg.reduce / refcg.pool2d (topi divides the int32 sum) and data movement
_BOUNDED_BY_INPUT = ("mean", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.adaptive_avg_pool2d", "nn.max_pool2d",
                     "reshape", "squeeze", "expand_dims", "transpose", "nn.batch_flatten", "layout_transform")


def requantized_magnitude(req, magnitude: int) -> float:
    """A bound on |req's result before its clamp| when |its input| <= ``magnitude``."""
    _, in_scale, in_zp, out_scale, out_zp = req.args
    ratio = float(np.max(const_value(in_scale).astype(np.float64)) / np.min(const_value(out_scale).astype(np.float64)))
    return (magnitude + abs(int(scalar(in_zp)))) * ratio + abs(int(scalar(out_zp))) + 1


def value_bound(expr) -> int:
    """A bound on |values| of an integer expression, from the ops that produced it (TFLite's MEAN and
    PyTorch's pools reach a requantize as cast(8-bit) -> mean -> int32); else its dtype's range."""
    name = op_name(expr)
    if name == "cast" and dtype_of(expr.args[0]) in DTYPE_RANGE and dtype_of(expr) == "int32":
        return value_bound(expr.args[0])  # a widening cast keeps the values
    if name in _BOUNDED_BY_INPUT:
        return value_bound(expr.args[0])
    if name == "qnn.requantize" and all(const_value(a) is not None for a in expr.args[1:]):
        # to int32, as FakeQuantizationToInteger writes ONNX's pools
        lo, hi = DTYPE_RANGE[dtype_of(expr)]
        return min(max(-lo, hi), int(requantized_magnitude(expr, value_bound(expr.args[0]))))
    if name == "sum":
        count = int(np.prod(static_shape(expr.args[0]))) // max(1, int(np.prod(static_shape(expr) or (1,))))
        return value_bound(expr.args[0]) * count
    lo, hi = DTYPE_RANGE.get(dtype_of(expr), DTYPE_RANGE["int32"])
    return max(-lo, hi)


def float_conversion_reason(req, magnitude: int, target) -> str | None:
    """Why ``req`` stays in TVM when |its input| can reach ``magnitude``: TVM's float requantize
    (RequantizeLowerFP, src/relay/qnn/op/requantize.cc) converts the scaled value to int32 before
    clamping it, and past the int32 range LLVM's fptosi is poison, so TVM-only's result depends on how
    LLVM folded the clamp around it (measured, skylake: a value of 2.9e9 came out clamped to the high
    bound, where the x86 conversion refcg reproduces gives INT32_MIN, then the low one). Only float
    numerics; with no target given they may apply."""
    if req is None:
        return None
    if target is not None:
        _, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target)
        if not compute.startswith("float"):
            return None
    worst = requantized_magnitude(req, magnitude)
    if worst < 2.0 ** 31:
        return None
    return (f"in float32/float64 numerics the requantized value can reach {worst:.3g}, past int32, where TVM-only's "
            "conversion is undefined (LLVM fptosi)" + ("" if target is not None else
                                                       " (give partition_for_refcg an int64 target to offload it)"))


def bias_of(x):
    return is_op("nn.bias_add")(x, constant_subgraph()) | is_op("add")(x, constant_subgraph())


def requantize_of(x):
    return is_op("qnn.requantize")(x, *constants(4))


@dataclass
class Epilogue:
    """The calls of a matched chain (cast? <- clip? <- requantize? <- bias? <- anchor); absent ones are None."""

    anchor: relay.Expr
    bias: relay.Call | None = None
    requantize: relay.Call | None = None
    clip: relay.Call | None = None
    cast: relay.Call | None = None

    @classmethod
    def parse(cls, root) -> "Epilogue":
        found = {}
        expr = root
        for key, names in (("cast", ("cast",)), ("clip", ("clip",)), ("requantize", ("qnn.requantize",)),
                           ("bias", ("nn.bias_add", "add"))):
            if op_name(expr) in names:
                found[key], expr = expr, expr.args[0]
        return cls(anchor=expr, **found)

    def calls(self) -> list:
        return [c for c in (self.cast, self.clip, self.requantize, self.bias) if c is not None]

    # ---- checks ----

    def reason(self, channels: int, axis: int, rank: int, require_requantize: bool = False) -> str | None:
        """bias (per channel), requantize and clip, with ``channels`` along ``axis`` of a rank-``rank`` result."""
        return self.bias_reason(channels, axis, rank) or \
            self.requantize_reason(channels, axis, rank, require_requantize)

    def bias_reason(self, channels: int, axis: int, rank: int) -> str | None:
        return None if self.bias is None else check_bias(self.bias, channels, axis, rank)

    def requantize_reason(self, channels: int, axis: int, rank: int, require_requantize: bool = False) -> str | None:
        req = self.requantize
        if req is None:
            return "no qnn.requantize after the op" if require_requantize else None
        reason = check_requantize(req, channels, axis, rank)
        if reason is None and self.clip is not None:
            return check_clip(self.clip, req.attrs.out_dtype) or self.cast_reason()
        return reason or self.cast_reason()

    def cast_reason(self) -> str | None:
        """A cast after requantize-to-int32 + clip (PyTorch's conv and linear): the kernel stores the
        narrow type directly when the clip keeps every value inside it (the cast then changes nothing)."""
        cast, clip = self.cast, self.clip
        if cast is None:
            return None
        if clip is None or self.requantize is None:
            return "cast without a requantize and clip in front"
        dtype = dtype_of(cast)
        if dtype not in QUANT_DTYPES:
            return f"cast to {dtype} after the requantize"
        lo, hi = DTYPE_RANGE[dtype]
        if not lo <= int(float(clip.attrs.a_min)) <= int(float(clip.attrs.a_max)) <= hi:
            return f"clip [{clip.attrs.a_min}, {clip.attrs.a_max}] before a cast to {dtype} lets values wrap"
        return None

    # ---- plan ----

    def bias_value(self, op: str) -> np.ndarray | None:
        if self.bias is None:
            return None
        return folded_constant(self.bias.args[1], op, "bias").reshape(-1).astype("int32")

    def requant(self, target, ask=None, stagewise: bool = False) -> Requantize:
        """The requantize (+clip) constants under the build target; the identity without a requantize.
        ``stagewise``: TVM-only rounds each of its float operations apart (stagewise.conv_stagewise)."""
        if self.requantize is None:
            return no_requantize()
        return requantize_step(self.requantize, self.clip, target, ask, stagewise)


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


def q31x4(rounding: str, compute: str, in_scale, out_scale, ask) -> bool:
    """Whether TVM-only rounds this requantize with NEON (``ask``: ``FusionContext.q31x4`` for it,
    None off aarch64). Asked only where it changes the arithmetic: a per-tensor UPWARD int64
    requantize that multiplies (equal scales skip tir.q_multiply_shift, requantize.cc:230)."""
    if ask is None or (rounding, compute) != ("UPWARD", "int64"):
        return False
    in_scale = np.asarray(in_scale, dtype="float32")
    if in_scale.ndim != 0 or float(in_scale) == float(np.asarray(out_scale, dtype="float32")):
        return False
    return ask()


def requantize_step(req, clip, target, ask=None, stagewise: bool = False) -> Requantize:
    """The Requantize constants of a ``qnn.requantize`` call (+clip) under the build target.

    ``ask``: the aarch64 rounding question for this requantize (see ``q31x4``); ``stagewise``: no FMA
    contraction whatever the target."""
    _, in_scale, in_zp, out_scale, out_zp = req.args
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target)
    neon = q31x4(rounding, compute, const_value(in_scale), const_value(out_scale), ask)
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target, neon)
    clip_range = (float(clip.attrs.a_min), float(clip.attrs.a_max)) if clip is not None else None
    return make_requantize(
        const_value(in_scale), const_value(out_scale),
        int(const_value(in_zp).reshape(-1)[0]), int(const_value(out_zp)),
        req.attrs.out_dtype, rounding, compute, clip_range, _lowering(target, stagewise),
    )


def _lowering(target, stagewise: bool) -> FloatLowering:
    lowering = float_lowering(target)
    return without_fma(lowering) if stagewise else lowering
