"""Kernel plan: a typed description of every kernel one partition runs, in order.

Input is the partition after the scoped fold, where every composite call holds its
QNN ops with constant qparams and constant (folded) weights. Output is plain
Python data: buffers, and per kernel its shapes, dtypes, layouts, quantization
parameters and packed constants. ``emit.py`` turns the plan into C.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relay

from . import checks, lut, softmax
from .armfuse import FusionContext
from .errors import RefcgError
from .numerics import (DTYPE_RANGE, Requantize, float_lowering, is_arm_cpu_aarch64, make_requantize, no_requantize,
                       resolve_mode)
from .packing import ConvFast, pack_conv2d_fast, pack_conv2d_weight, pack_gemm_weights

DTYPE_CODE = {"int8": "REFCG_S8", "uint8": "REFCG_U8", "int16": "REFCG_S16", "int32": "REFCG_S32"}


@dataclass
class Buffer:
    """A tensor the generated function reads or writes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input", "output", "scratch" or "const"
    index: int  # argument position for inputs/outputs, slot for scratch
    data: np.ndarray | None = None  # the value of a "const" buffer, embedded in the C source

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass
class Conv2D:
    """qnn.conv2d + bias + requantize + clip, as ``refcg_conv2d_*`` computes it."""

    name: str
    input: Buffer
    output: Buffer
    params: dict
    weight: np.ndarray
    bias: np.ndarray | None
    requant: Requantize
    template: str = "conv2d.c.j2"
    fast: ConvFast | None = None  # data for the accelerated kernels (None: reference only)

    @property
    def reference_weights(self) -> bool:
        """Whether the C needs the reference layout too: not when every variant (the scalar one
        included) runs the packed GEMM, so those weights are stored once."""
        return self.fast is None or self.fast.gemm is None


@dataclass
class Kernel:
    """One call of a scalar reference kernel in ``runtime/``: its buffers, C struct fields, constants."""

    name: str
    inputs: list[Buffer]
    output: Buffer
    params: dict
    template: str
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    requant: Requantize | None = None
    fast: object | None = None  # packed data of an accelerated kernel (None: reference only)


@dataclass
class KernelPlan:
    symbol: str
    target: str
    inputs: list[Buffer]
    outputs: list[Buffer]
    scratch: list[Buffer] = field(default_factory=list)
    steps: list = field(default_factory=list)
    constants: list[Buffer] = field(default_factory=list)


def _layout_dims(shape, layout: str) -> dict:
    return {axis: shape[layout.index(axis)] for axis in "NHWC"}


def _strides(shape, layout: str) -> list[int]:
    """Element strides in batch, height, width, channel order for a compact tensor."""
    compact = np.cumprod((shape[1:] + (1,))[::-1])[::-1]
    return [int(compact[layout.index(axis)]) for axis in "NHWC"]


def _padding(pad) -> tuple[int, int]:
    pad = [int(p) for p in pad]
    return (pad[0], pad[0]) if len(pad) == 1 else (pad[0], pad[1])


def _fused_pad(pad, layout: str) -> tuple[int, int]:
    """(top, left) widths of an ``nn.pad`` fused in front of the conv (check_padded_conv2d)."""
    if pad is None:
        return 0, 0
    widths = [int(before) for before, _ in pad.attrs.pad_width]
    return widths[layout.index("H")], widths[layout.index("W")]


def plan_conv2d(name: str, body: relay.Expr, src: Buffer, dst: Buffer, target, ask=None) -> Conv2D:
    parts = checks.conv2d_parts(body)
    conv, req, bias, clip = parts["conv"], parts["requantize"], parts["bias"], parts["clip"]
    attrs = conv.attrs
    data, weight, in_zp, k_zp, _, _ = conv.args
    in_dims = _layout_dims(src.shape, attrs.data_layout)
    out_dims = _layout_dims(dst.shape, attrs.data_layout)
    w = _constant(weight, "qnn.conv2d", "weight")
    packed = pack_conv2d_weight(w, attrs.kernel_layout, int(attrs.groups), in_dims["C"])
    # the fused pad and the conv's own padding both pad with the input zero point: they add up
    pad_top, pad_left = _padding(attrs.padding)
    fused_top, fused_left = _fused_pad(parts["pad"], attrs.data_layout)
    pad_top, pad_left = pad_top + fused_top, pad_left + fused_left
    params = {
        "batch": in_dims["N"], "in_h": in_dims["H"], "in_w": in_dims["W"], "in_c": in_dims["C"],
        "out_h": out_dims["H"], "out_w": out_dims["W"], "out_c": out_dims["C"],
        "kernel_h": packed.shape[1], "kernel_w": packed.shape[2],
        "stride_h": int(attrs.strides[0]), "stride_w": int(attrs.strides[1]),
        "dilation_h": int(attrs.dilation[0]), "dilation_w": int(attrs.dilation[1]),
        "pad_top": pad_top, "pad_left": pad_left, "groups": int(attrs.groups),
        "in_dtype": DTYPE_CODE[checks.dtype_of(data)], "w_dtype": DTYPE_CODE[str(w.dtype)],
        "out_dtype": DTYPE_CODE[dst.dtype],
        "input_zp": int(checks.const_value(in_zp)),
        "kernel_zp": int(checks.const_value(k_zp).reshape(-1)[0]),
        "in_stride": _strides(src.shape, attrs.data_layout),
        "out_stride": _strides(dst.shape, attrs.data_layout),
    }
    bias_value = None
    if bias is not None:
        bias_value = _constant(bias.args[1], "qnn.conv2d", "bias").reshape(-1).astype("int32")
    requant = _requantize_step(req, clip, target, ask) if req is not None else no_requantize()
    # int16 (accumulator or requantized): the C core's fast epilogues store int8/uint8/int32 only
    fast = pack_conv2d_fast(packed, params, checks.dtype_of(data), bias_value) if dst.dtype != "int16" else None
    return Conv2D(name, src, dst, params, packed, bias_value, requant, fast=fast)


def _constant(expr, op: str, what: str) -> np.ndarray:
    if not isinstance(expr, relay.Constant):
        raise RefcgError(op, what, "did not fold to a constant in the scoped fold")
    return expr.data.numpy()


def _out_range(dtype: str, clip) -> tuple[int, int]:
    lo, hi = DTYPE_RANGE[dtype]
    if clip is None:
        return lo, hi
    return max(lo, int(clip.attrs.a_min)), min(hi, int(clip.attrs.a_max))  # TVM truncates clip bounds


def _q31x4(rounding: str, compute: str, in_scale, out_scale, ask) -> bool:
    """Whether TVM-only rounds this requantize with NEON (``ask``: ``FusionContext.q31x4`` for it,
    None off aarch64). Asked only where it changes the arithmetic: a per-tensor UPWARD int64
    requantize that multiplies (equal scales skip tir.q_multiply_shift, requantize.cc:230)."""
    if ask is None or (rounding, compute) != ("UPWARD", "int64"):
        return False
    in_scale = np.asarray(in_scale, dtype="float32")
    if in_scale.ndim != 0 or float(in_scale) == float(np.asarray(out_scale, dtype="float32")):
        return False
    return ask()


def _requantize_step(req, clip, target, ask=None) -> Requantize:
    """The Requantize constants of a ``qnn.requantize`` call (+clip) under the build target.

    ``ask``: the aarch64 rounding question for this requantize (see ``_q31x4``)."""
    _, in_scale, in_zp, out_scale, out_zp = req.args
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target)
    neon = _q31x4(rounding, compute, checks.const_value(in_scale), checks.const_value(out_scale), ask)
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target, neon)
    clip_range = (float(clip.attrs.a_min), float(clip.attrs.a_max)) if clip is not None else None
    return make_requantize(
        checks.const_value(in_scale), checks.const_value(out_scale),
        int(checks.const_value(in_zp).reshape(-1)[0]), int(checks.const_value(out_zp)),
        req.attrs.out_dtype, rounding, compute, clip_range, float_lowering(target),
    )


def _scalar(expr) -> float | int:
    return checks.const_value(expr).reshape(-1)[0]


def plan_dense(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target, ask=None) -> Kernel:
    body = func.body
    parts = checks.epilogue_parts(body)
    dense, req, bias = parts["anchor"], parts["requantize"], parts["bias"]
    data, weight, in_zp, k_zp, _, _ = dense.args
    w = np.ascontiguousarray(_constant(weight, "qnn.dense", "weight"))
    params = {
        "batch": dst.shape[0], "in_features": w.shape[1], "units": dst.shape[1],
        "in_dtype": DTYPE_CODE[srcs[0].dtype], "w_dtype": DTYPE_CODE[str(w.dtype)], "out_dtype": DTYPE_CODE[dst.dtype],
        "input_zp": int(_scalar(in_zp)), "kernel_zp": int(_scalar(k_zp)),
    }
    bias_value = None
    if bias is not None:
        bias_value = _constant(bias.args[1], "qnn.dense", "bias").reshape(-1).astype("int32")
    requant = _requantize_step(req, parts["clip"], target, ask) if req is not None else no_requantize()
    fast = None  # int16 output: the reference kernel (fast epilogues store 8-bit and int32 only)
    if dst.dtype != "int16":
        fast = pack_gemm_weights(w, params["kernel_zp"], params["input_zp"], srcs[0].dtype, bias_value)
    return Kernel(name, srcs, dst, params, "dense.c.j2", weight=w, bias=bias_value, requant=requant, fast=fast)


def _operands(func: relay.Function, srcs: list[Buffer], exprs) -> list[Buffer]:
    """Buffers of composite-body operands: one tensor used twice is a single composite parameter."""
    by_param = dict(zip(func.params, srcs))
    return [by_param[e] for e in exprs]


def _param_index(func: relay.Function, expr) -> int | None:
    """Position of a composite-body operand among the composite's parameters (None: a constant)."""
    return next((i for i, param in enumerate(func.params) if param.same_as(expr)), None)


def _broadcast_strides(shape, out_shape) -> list[int]:
    """Element strides of a compact ``shape`` broadcast to ``out_shape`` (0 where broadcast)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step if dim != 1 else 0)
        step *= dim
    return strides[::-1]


def plan_binary(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target, ask=None) -> Kernel:
    """qnn.add/subtract/mul as TVM 0.19 canonicalizes them (see refcg_eltwise_ref.c)."""
    body = func.body
    parts = checks.binary_parts(body)
    call, clip = parts["op"], parts["clip"]
    _, _, lhs_scale, lhs_zp, rhs_scale, rhs_zp, out_scale, out_zp = call.args
    a, b = _operands(func, srcs, call.args[:2])
    # the canonical form's requantizes carry no rounding/compute attrs: config and target decide
    rounding, compute = resolve_mode("None", "None", target)
    lowering = float_lowering(target)
    out_scale, out_zp = checks.const_value(out_scale), int(_scalar(out_zp))
    lo, hi = _out_range(dst.dtype, clip)
    op = checks.op_name(call)

    def mode(scale, operand=None) -> str:  # the compute dtype, NEON where TVM-only rounds so
        index = None if operand is None else _param_index(func, operand)
        if ask is None or (operand is not None and index is None):
            return compute  # a constant operand: TVM-only folds its requantize on the host
        return "int64-neon" if _q31x4(rounding, compute, scale, out_scale, lambda: ask(index)) else compute

    if op == "qnn.mul":
        product = np.float32(_scalar(lhs_scale)) * np.float32(_scalar(rhs_scale))  # float32, as mul.cc
        rq_a = make_requantize(product, out_scale, 0, out_zp, dst.dtype, rounding, mode(product), (lo, hi), lowering)
        rq_b = rq_a
    else:
        lhs, rhs = call.args[:2]
        rq_a = make_requantize(checks.const_value(lhs_scale), out_scale, int(_scalar(lhs_zp)), out_zp, "int32",
                               rounding, mode(checks.const_value(lhs_scale), lhs), None, lowering)
        rq_b = make_requantize(checks.const_value(rhs_scale), out_scale, int(_scalar(rhs_zp)), out_zp, "int32",
                               rounding, mode(checks.const_value(rhs_scale), rhs), None, lowering)
    params = {
        "op": {"qnn.add": "REFCG_BIN_ADD", "qnn.subtract": "REFCG_BIN_SUB", "qnn.mul": "REFCG_BIN_MUL"}[op],
        "ndim": len(dst.shape), "shape": list(dst.shape),
        "a_stride": _broadcast_strides(a.shape, dst.shape), "b_stride": _broadcast_strides(b.shape, dst.shape),
        "a_dtype": DTYPE_CODE[a.dtype], "b_dtype": DTYPE_CODE[b.dtype], "out_dtype": DTYPE_CODE[dst.dtype],
        "a_zp": int(_scalar(lhs_zp)), "b_zp": int(_scalar(rhs_zp)), "out_zp": out_zp, "out_min": lo, "out_max": hi,
        "rq": [rq_a, rq_b],
    }
    return Kernel(name, [a, b], dst, params, "binary.c.j2")


def _requantize_part(src: Buffer, axis: int, out_channels: int, offset: int, dst: Buffer, rq: Requantize) -> dict:
    """One refcg_requantize_params: ``src`` viewed as [outer][channels][inner] around ``axis``."""
    inner = int(np.prod(src.shape[axis + 1:], dtype=np.int64))
    return {
        "input": src, "outer": int(np.prod(src.shape[:axis], dtype=np.int64)), "channels": src.shape[axis],
        "inner": inner, "out_outer_stride": out_channels * inner, "out_offset": offset * inner,
        "in_dtype": DTYPE_CODE[src.dtype], "out_dtype": DTYPE_CODE[dst.dtype], "rq": rq,
    }


def plan_requantize(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target, ask=None) -> Kernel:
    body = func.body
    parts = checks.epilogue_parts(body)
    req = parts["requantize"]
    axis = int(req.attrs.axis) % len(srcs[0].shape)
    rq = _requantize_step(req, parts["clip"], target, ask)
    part = _requantize_part(srcs[0], axis, srcs[0].shape[axis], 0, dst, rq)
    return Kernel(name, srcs, dst, {"parts": [part]}, "requantize.c.j2")


def plan_concatenate(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target, ask=None) -> Kernel:
    """qnn.concatenate: each input requantized to the output qparams into its slab of the output."""
    body = func.body
    _, scales, zero_points, out_scale, out_zp = body.args
    axis = int(body.attrs.axis) % len(dst.shape)
    rounding, compute = resolve_mode("None", "None", target)
    parts, offset = [], 0
    inputs = _operands(func, srcs, body.args[0].fields)
    for src, field, scale, zp in zip(inputs, body.args[0].fields, scales.fields, zero_points.fields):
        index = _param_index(func, field)
        question = (lambda index=index: ask(index)) if ask and index is not None else None
        neon = _q31x4(rounding, compute, checks.const_value(scale), checks.const_value(out_scale), question)
        rq = make_requantize(checks.const_value(scale), checks.const_value(out_scale), int(_scalar(zp)),
                             int(_scalar(out_zp)), dst.dtype, rounding, "int64-neon" if neon else compute, None,
                             float_lowering(target))
        parts.append(_requantize_part(src, axis, dst.shape[axis], offset, dst, rq))
        offset += src.shape[axis]
    return Kernel(name, srcs, dst, {"parts": parts}, "requantize.c.j2")


def plan_pool2d(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    body = func.body
    parts = checks.pool_parts(body)
    pool = parts["pool"]
    attrs, src = pool.attrs, srcs[0]
    layout = str(attrs.layout)
    in_dims, out_dims = _layout_dims(src.shape, layout), _layout_dims(dst.shape, layout)
    is_global = checks.op_name(pool) == "nn.global_avg_pool2d"
    kernel = (in_dims["H"], in_dims["W"]) if is_global else tuple(int(k) for k in attrs.pool_size)
    strides = (1, 1) if is_global else tuple(int(v) for v in attrs.strides)
    dilation = (1, 1) if is_global else tuple(int(v) for v in attrs.dilation)
    top, left, bottom, right = checks.pool_padding(attrs) if not is_global else (0, 0, 0, 0)
    params = {
        "batch": in_dims["N"], "in_h": in_dims["H"], "in_w": in_dims["W"], "channels": in_dims["C"],
        "out_h": out_dims["H"], "out_w": out_dims["W"], "kernel_h": kernel[0], "kernel_w": kernel[1],
        "stride_h": strides[0], "stride_w": strides[1], "dilation_h": dilation[0], "dilation_w": dilation[1],
        "pad_top": top, "pad_left": left, "pad_bottom": bottom, "pad_right": right,
        "is_avg": int(checks.op_name(pool) != "nn.max_pool2d"),
        "count_include_pad": int(bool(getattr(attrs, "count_include_pad", False))),
        "in_dtype": DTYPE_CODE[src.dtype], "out_dtype": DTYPE_CODE[dst.dtype],
        "in_stride": _strides(src.shape, layout), "out_stride": _strides(dst.shape, layout),
    }
    return Kernel(name, srcs, dst, params, "pool2d.c.j2")


def plan_reduce(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """A sum or mean over one contiguous run of axes: the input viewed as [outer][reduce][inner]."""
    parts = checks.reduce_parts(func.body)
    reduce, shape = parts["reduce"], srcs[0].shape
    axes = checks.reduce_axes(reduce)
    params = {
        "outer": int(np.prod(shape[:axes[0]], dtype=np.int64)),
        "reduce": int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64)),
        "inner": int(np.prod(shape[axes[-1] + 1:], dtype=np.int64)),
        "is_mean": int(checks.op_name(reduce) != "sum"),
        "in_dtype": DTYPE_CODE[srcs[0].dtype], "out_dtype": DTYPE_CODE[dst.dtype],
        "ops": " -> ".join(checks.op_name(c) for c in (parts["inner_cast"], reduce, parts["out_cast"]) if c is not None),
    }
    return Kernel(name, srcs, dst, params, "reduce.c.j2")


def _compact_strides(shape) -> list[int]:
    return [int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape))]


def _copy_view(call, shape) -> dict:
    """Output shape and the input strides/offset/padding that read it, for one data-movement op."""
    op, out = checks.op_name(call), tuple(int(d) for d in call.checked_type.shape)
    strides = _compact_strides(shape)
    view = {"out_shape": list(out), "in_stride": strides, "pad_before": [0] * len(out), "in_shape": list(shape),
            "offset": 0}
    if op in checks.RESHAPE_OPS or op in ("cast", "clip", "maximum", "minimum"):
        # compact in and out, same element order: one flat run
        size = int(np.prod(out, dtype=np.int64))
        return {"out_shape": [size], "in_stride": [1], "pad_before": [0], "in_shape": [size], "offset": 0}
    if op in ("transpose", "layout_transform"):
        if op == "transpose":
            axes = call.attrs.axes
            order = list(range(len(shape)))[::-1] if axes is None or len(axes) == 0 else \
                [int(a) % len(shape) for a in axes]
        else:
            src, dst = str(call.attrs.src_layout), str(call.attrs.dst_layout)
            order = [src.index(axis) for axis in dst]
        view["in_stride"] = [strides[a] for a in order]
        view["in_shape"] = [shape[a] for a in order]
        return view
    if op == "strided_slice":
        begin, step = checks.strided_slice_spec(call)
        view["in_stride"] = [s * k for s, k in zip(strides, step)]
        view["offset"] = int(sum(b * s for b, s in zip(begin, strides)))
        view["in_shape"] = list(out)  # every output index reads inside the input (checked)
        return view
    if op == "nn.pad":
        view["pad_before"] = [int(before) for before, _ in call.attrs.pad_width]
        return view
    raise RefcgError(op, "copy", "no data-movement plan for this op")


def plan_copy(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """Integer casts, reshape-like ops, transpose, layout_transform, strided_slice, nn.pad, clip, maximum,
    minimum."""
    call = func.body
    op = checks.op_name(call)
    lo, hi = DTYPE_RANGE["int32" if op == "cast" else dst.dtype]  # a cast wraps, it does not saturate
    if op == "clip":
        lo, hi = _out_range(dst.dtype, call)
    elif op == "maximum":
        lo = max(lo, checks.copy_bound(call))
    elif op == "minimum":
        hi = min(hi, checks.copy_bound(call))
    src = _operands(func, srcs, [checks.copy_data(call)])[0]
    params = {**_copy_view(call, src.shape), "in_dtype": DTYPE_CODE[src.dtype], "out_dtype": DTYPE_CODE[dst.dtype],
              "lo": lo, "hi": hi, "ops": op,
              "pad_value": int(float(checks.const_value(call.args[1]).reshape(-1)[0])) if op == "nn.pad" else 0}
    return Kernel(name, [src], dst, params, "copy.c.j2")


def plan_quantize(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """qnn.quantize / qnn.dequantize, per tensor or along ``axis`` (scale and zero point broadcast
    along it as TVM's ExpandBiasToMatchAxis does)."""
    body = func.body
    _, scale, zero_point = body.args
    op = checks.op_name(body)[4:]
    shape = dst.shape
    scales, zps = checks.const_value(scale).reshape(-1), checks.const_value(zero_point).reshape(-1)
    axis = int(body.attrs.axis) % len(shape)
    per_axis = max(scales.size, zps.size) > 1
    channels = shape[axis] if per_axis else 1  # per tensor: one channel spanning the whole tensor
    params = {
        "op": op, "outer": int(np.prod(shape[:axis], dtype=np.int64)) if per_axis else 1, "channels": channels,
        "inner": int(np.prod(shape[axis + 1:] if per_axis else shape, dtype=np.int64)),
        "quant_dtype": DTYPE_CODE[dst.dtype if op == "quantize" else srcs[0].dtype],
        "scales": np.broadcast_to(scales, (channels,)).astype("float32").tolist(),
        "zero_points": np.broadcast_to(zps, (channels,)).astype("int64").tolist(),
    }
    return Kernel(name, srcs, dst, params, "quantize.c.j2")


def plan_lut(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """A unary op as the 256-entry table TVM-only computes for it under this build (lut.py)."""
    ops = []
    relay.analysis.post_order_visit(func.body, lambda e: ops.append(checks.op_name(e)) if checks.op_name(e) else None)
    params = {"size": int(np.prod(dst.shape, dtype=np.int64)), "ops": " -> ".join(ops)}
    return Kernel(name, srcs, dst, params, "lut.c.j2", weight=lut.lookup_table(func, target))


def _check_softmax_build(target, op: str):
    reason = softmax.x86_target_reason(target)
    if reason:
        raise RefcgError(op, "target", reason + "; pass target= to partition_for_refcg to keep it in TVM")


def plan_softmax(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """qnn.softmax: TVM's integer algorithm (softmax.py), ending in a requantize from scale 1/128."""
    _check_softmax_build(target, "qnn.softmax")
    call = func.body
    _, scale, zero_point, out_scale, out_zp = call.args
    shape = srcs[0].shape
    axis = int(call.attrs.axis) % len(shape)
    rounding, compute = resolve_mode("None", "None", target)  # its Requantize carries no attrs
    rq = make_requantize(np.float32(1.0 / 128), checks.const_value(out_scale), 0, int(_scalar(out_zp)), "int8",
                         rounding, compute, None, float_lowering(target))
    params = {
        "outer": int(np.prod(shape[:axis], dtype=np.int64)), "axis": shape[axis],
        "inner": int(np.prod(shape[axis + 1:], dtype=np.int64)),
        "input_zp": int(_scalar(zero_point)), "x0": softmax.x0_of(float(_scalar(scale))), "rq": rq,
    }
    return Kernel(name, srcs, dst, params, "softmax.c.j2")


def plan_float_softmax(name: str, func: relay.Function, srcs: list[Buffer], dst: Buffer, target) -> Kernel:
    """qnn.dequantize -> nn.softmax (last axis) -> qnn.quantize in float32, as TVM's x86 code."""
    _check_softmax_build(target, "nn.softmax")
    if softmax.fast_math_reason():
        raise RefcgError("nn.softmax", "PassContext", softmax.fast_math_reason() + "; build at opt_level 3")
    quantize = func.body
    dequantize = quantize.args[0].args[0]
    params = {
        "rows": int(np.prod(dst.shape[:-1], dtype=np.int64)), "axis": dst.shape[-1],
        "in_dtype": DTYPE_CODE[srcs[0].dtype], "out_dtype": DTYPE_CODE[dst.dtype],
        "input_zp": int(_scalar(dequantize.args[2])), "output_zp": int(_scalar(quantize.args[2])),
        "input_scale": float(_scalar(dequantize.args[1])), "output_scale": float(_scalar(quantize.args[1])),
    }
    return Kernel(name, srcs, dst, params, "softmax.c.j2")


PLANNERS = {
    "refcg.lut": plan_lut,
    "refcg.float_softmax": plan_float_softmax,
    "refcg.softmax": plan_softmax,
    "refcg.conv2d": lambda name, func, srcs, dst, target, ask=None: plan_conv2d(name, func.body, srcs[0], dst,
                                                                               target, ask),
    "refcg.dense": plan_dense,
    "refcg.binary": plan_binary,
    "refcg.pool2d": plan_pool2d,
    "refcg.concatenate": plan_concatenate,
    "refcg.requantize": plan_requantize,
    "refcg.quantize": plan_quantize,
    "refcg.reduce": plan_reduce,
    "refcg.copy": plan_copy,
}
# Planners whose requantizes TVM-only may round with NEON on aarch64: they take ``ask``.
ASKS_AARCH64 = ("refcg.conv2d", "refcg.dense", "refcg.binary", "refcg.requantize", "refcg.concatenate")


def _buffer_for(expr, kind: str, index: int, name: str) -> Buffer:
    ttype = expr.checked_type
    return Buffer(name, tuple(int(d) for d in ttype.shape), str(ttype.dtype), kind, index)


def _consumers(body_fields) -> dict:
    """How many composite calls read each expression (scratch is freed after the last one)."""
    count: dict = {}

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function):
            for arg in node.args:
                count[arg] = count.get(arg, 0) + 1

    for expr in body_fields:
        relay.analysis.post_order_visit(expr, visit)
    return count


class _ScratchPool:
    """Workspace slots for intermediate tensors, reused once their last reader has run."""

    def __init__(self, plan: KernelPlan):
        self.plan, self.free = plan, []

    def take(self, expr) -> Buffer:
        ttype = expr.checked_type
        shape, dtype = tuple(int(d) for d in ttype.shape), str(ttype.dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self.free:
            slot = self.free.pop()
        else:
            slot = Buffer(f"tmp{len(self.plan.scratch)}", (0,), "uint8", "scratch", len(self.plan.scratch))
            self.plan.scratch.append(slot)
        slot.shape = (max(slot.shape[0], nbytes),)
        return Buffer(slot.name, shape, dtype, "scratch", slot.index)

    def release(self, buf: Buffer):
        self.free.append(self.plan.scratch[buf.index])


def build_plan(func: relay.Function, symbol: str, target) -> KernelPlan:
    """Walk the folded partition in dataflow order and describe each composite call.

    Composites may take several inputs (partition inputs, other composites' results,
    constants embedded in the C source) and the partition may return a tuple.
    """
    inputs = [_buffer_for(p, "input", i, f"in{i}") for i, p in enumerate(func.params)]
    body_fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    outputs = [_buffer_for(e, "output", len(inputs) + i, f"out{i}") for i, e in enumerate(body_fields)]
    plan = KernelPlan(symbol, str(target), inputs, outputs)
    done = dict(zip(func.params, inputs))  # expr -> buffer holding its value
    output_of = dict(zip(body_fields, outputs))
    if any(expr in done or isinstance(expr, relay.Constant) for expr in output_of):
        raise RefcgError(symbol, "output", "a partition input or constant is returned unchanged")
    if len(output_of) != len(outputs):
        raise RefcgError(symbol, "output", "the same value is returned twice")
    readers = _consumers(body_fields)
    lut.prepare(func, target)  # one TVM build computes every lookup table of the partition
    scratch = _ScratchPool(plan)
    fusion = FusionContext(func, target) if is_arm_cpu_aarch64(target) else None

    def visit(expr) -> Buffer:
        if expr in done:
            return done[expr]
        if isinstance(expr, relay.Constant):
            buf = _buffer_for(expr, "const", len(plan.constants), f"c{len(plan.constants)}")
            buf.data = expr.data.numpy()
            plan.constants.append(buf)
            done[expr] = buf
            return buf
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function)):
            raise RefcgError(symbol, "body", f"unexpected {type(expr).__name__} between kernels")
        composite = str(expr.op.attrs["Composite"])
        if composite not in PLANNERS:
            raise RefcgError(composite, "composite", "no kernel planner for this composite")
        srcs = [visit(arg) for arg in expr.args]
        dst = output_of.get(expr) or scratch.take(expr)
        done[expr] = dst
        extra = {}
        if fusion is not None and composite in ASKS_AARCH64:
            extra["ask"] = lambda operand=None, call=expr: fusion.q31x4(call, operand)
        plan.steps.append(PLANNERS[composite](f"k{len(plan.steps)}", expr.op, srcs, dst, target, **extra))
        for arg, src in zip(expr.args, srcs):
            readers[arg] -= 1
            if src.kind == "scratch" and readers[arg] == 0:
                scratch.release(src)
        return dst

    for expr in body_fields:
        visit(expr)
    return plan
