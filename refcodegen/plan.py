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

from . import checks
from .errors import RefcgError
from .numerics import Requantize, make_requantize, resolve_mode
from .packing import pack_conv2d_weight

DTYPE_CODE = {"int8": "REFCG_S8", "uint8": "REFCG_U8", "int32": "REFCG_S32"}


@dataclass
class Buffer:
    """A tensor the generated function reads or writes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input", "output" or "scratch"
    index: int  # argument position for inputs/outputs, slot for scratch

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


@dataclass
class KernelPlan:
    symbol: str
    target: str
    inputs: list[Buffer]
    outputs: list[Buffer]
    scratch: list[Buffer] = field(default_factory=list)
    steps: list = field(default_factory=list)


def _layout_dims(shape, layout: str) -> dict:
    return {axis: shape[layout.index(axis)] for axis in "NHWC"}


def _strides(shape, layout: str) -> list[int]:
    """Element strides in batch, height, width, channel order for a compact tensor."""
    compact = np.cumprod((shape[1:] + (1,))[::-1])[::-1]
    return [int(compact[layout.index(axis)]) for axis in "NHWC"]


def _padding(pad) -> tuple[int, int]:
    pad = [int(p) for p in pad]
    return (pad[0], pad[0]) if len(pad) == 1 else (pad[0], pad[1])


def plan_conv2d(name: str, body: relay.Expr, src: Buffer, dst: Buffer, target) -> Conv2D:
    parts = checks.conv2d_parts(body)
    conv, req, bias, clip = parts["conv"], parts["requantize"], parts["bias"], parts["clip"]
    attrs = conv.attrs
    data, weight, in_zp, k_zp, _, _ = conv.args
    if not isinstance(weight, relay.Constant):
        raise RefcgError("qnn.conv2d", "weight", "did not fold to a constant in the scoped fold")
    in_dims = _layout_dims(src.shape, attrs.data_layout)
    out_dims = _layout_dims(dst.shape, attrs.data_layout)
    w = weight.data.numpy()
    packed = pack_conv2d_weight(w, attrs.kernel_layout)
    pad_top, pad_left = _padding(attrs.padding)
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
        if not isinstance(bias.args[1], relay.Constant):
            raise RefcgError("qnn.conv2d", "bias", "did not fold to a constant in the scoped fold")
        bias_value = bias.args[1].data.numpy().reshape(-1).astype("int32")
    _, rq_in_scale, rq_in_zp, rq_out_scale, rq_out_zp = req.args
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target)
    clip_range = (float(clip.attrs.a_min), float(clip.attrs.a_max)) if clip is not None else None
    requant = make_requantize(
        checks.const_value(rq_in_scale), checks.const_value(rq_out_scale),
        int(checks.const_value(rq_in_zp).reshape(-1)[0]), int(checks.const_value(rq_out_zp)),
        req.attrs.out_dtype, rounding, compute, clip_range,
    )
    return Conv2D(name, src, dst, params, packed, bias_value, requant)


PLANNERS = {"refcg.conv2d": plan_conv2d}


def _buffer_for(expr, kind: str, index: int, name: str) -> Buffer:
    ttype = expr.checked_type
    return Buffer(name, tuple(int(d) for d in ttype.shape), str(ttype.dtype), kind, index)


def build_plan(func: relay.Function, symbol: str, target) -> KernelPlan:
    """Walk the folded partition in dataflow order and describe each composite call."""
    inputs = [_buffer_for(p, "input", i, f"in{i}") for i, p in enumerate(func.params)]
    body_fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    outputs = [_buffer_for(e, "output", len(inputs) + i, f"out{i}") for i, e in enumerate(body_fields)]
    plan = KernelPlan(symbol, str(target), inputs, outputs)
    done = dict(zip(func.params, inputs))  # expr -> buffer holding its value
    output_of = dict(zip(body_fields, outputs))
    if any(expr in done for expr in output_of):
        raise RefcgError(symbol, "output", "a partition input is returned unchanged")

    def visit(expr) -> Buffer:
        if expr in done:
            return done[expr]
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function)):
            raise RefcgError(symbol, "body", f"unexpected {type(expr).__name__} between kernels")
        composite = str(expr.op.attrs["Composite"])
        if composite not in PLANNERS or len(expr.args) != 1:
            raise RefcgError(composite, "composite", "no kernel planner for this composite")
        src = visit(expr.args[0])
        dst = output_of.get(expr)
        if dst is None:
            dst = _buffer_for(expr, "scratch", len(plan.scratch), f"tmp{len(plan.scratch)}")
            plan.scratch.append(dst)
        done[expr] = dst
        plan.steps.append(PLANNERS[composite](f"k{len(plan.steps)}", expr.op.body, src, dst, target))
        return dst

    for expr in body_fields:
        visit(expr)
    return plan
