"""refcg.copy: data movement and clamping of one integer tensor (casts, reshape-like ops, transpose,
layout_transform, strided_slice, nn.pad, nn.depth_to_space, image.resize2d nearest, clip,
maximum/minimum with a constant, and a reshape -> transpose -> reshape that moves whole slices along
separate axes, such as ShuffleNet's channel shuffle): nothing is rounded, TVM's result is reproduced
(runtime refcg_copy_ref reads the input through a strided view of up to 6 axes, a nearest resize or a
shuffle through per-axis index tables).

The per-axis views read their input through its strides and write their output in its physical order,
so they take any layout the planner gives their tensors (channels last between convs: a shuffle is a
gather along each pixel's channels, a channel slice one run per pixel)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from .. import resize
from ..errors import RefcgError
from ..numerics import DTYPE_RANGE, float_lowering
from .base import (DTYPE_CODE, REQUANTIZE_DTYPES, Call, Step, any_of, check_clip, check_tensor, compact_strides,
                   const_value, dtype_of, first_reason, folded_cast, op_name, operands, out_range, prod, static_shape)

NAME = "copy"
NEON_REQUANTIZE = False
OPS = ("cast", "reshape", "squeeze", "expand_dims", "nn.batch_flatten", "transpose", "layout_transform",
       "strided_slice", "nn.pad", "nn.depth_to_space", "image.resize2d", "clip", "maximum", "minimum")
RESHAPE_OPS = ("reshape", "squeeze", "expand_dims", "nn.batch_flatten")
CLAMP_OPS = ("maximum", "minimum")
SHUFFLE = "reshape -> transpose -> reshape"
# views with an index per output axis (plan: any layout of input and output)
AXIS_VIEW_OPS = ("transpose", "layout_transform", "strided_slice", "nn.pad", "image.resize2d", SHUFFLE)


def patterns() -> list:
    """A reshape -> transpose -> reshape (one gather when it moves slices along separate axes), else one
    data-movement or clamp op (maximum/minimum with a constant on either side)."""
    shuffle = is_op("reshape")(is_op("transpose")(is_op("reshape")(wildcard())))
    single = any_of([is_op("nn.pad")(wildcard(), is_constant())]
                     + [is_op(name)(*args) for name in CLAMP_OPS
                        for args in ((wildcard(), is_constant()), (is_constant(), wildcard()))]
                     + [is_op(name)(wildcard()) for name in OPS if name not in ("nn.pad", *CLAMP_OPS)])
    return [(shuffle, Copy.parse_shuffle), (single, Copy.parse)]


def gather_tables(shape, ops) -> list | None:
    """Per output axis, the input index each output index reads along the same axis (None: itself),
    when the reshapes and transposes ``ops`` (innermost first) of a tensor of ``shape`` keep its rank and
    move whole slices along separate axes (a channel shuffle permutes the channel axis); else None."""
    src = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    for call in ops:
        if op_name(call) == "transpose":
            axes = call.attrs.axes
            src = src.transpose(None if axes is None or len(axes) == 0 else [int(a) for a in axes])
        else:
            src = src.reshape(static_shape(call))
    if src.ndim != len(shape):
        return None
    index = np.unravel_index(src, shape)  # the input index, per axis, of every output element
    tables = []
    for axis, along in enumerate(index):
        table = along[tuple(slice(None) if a == axis else 0 for a in range(src.ndim))]
        line = [1] * src.ndim
        line[axis] = -1
        if not np.array_equal(along, np.broadcast_to(table.reshape(line), src.shape)):
            return None  # the index along this axis depends on another axis
        tables.append(None if np.array_equal(table, np.arange(shape[axis])) else [int(i) for i in table])
    return tables


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


def _strided_slice_reason(call) -> str | None:
    if str(call.attrs.slice_mode) != "end":
        return f"strided_slice slice_mode {call.attrs.slice_mode}"
    attrs = call.attrs
    if attrs.strides is not None and any(int(s) <= 0 for s in attrs.strides):
        return "strided_slice with a negative stride"
    if strided_slice_spec(call) is None:
        return "strided_slice bounds are not static or not understood"
    return None


def depth_to_space_view(attrs, shape) -> tuple[list[int], list[int]]:
    """(output shape, input strides) of nn.depth_to_space as six axes: the output's y and x split into
    (block row, offset) as topi.nn.depth_to_space reads the input channel block_size * offset_y +
    offset_x (DCR: that block of the output channels; any other mode: inside each output channel)."""
    layout, bs = str(attrs.layout), int(attrs.block_size)
    n, c, h, w = (shape[layout.index(axis)] for axis in "NCHW")
    compact = compact_strides(shape)
    s_n, s_c, s_h, s_w = (compact[layout.index(axis)] for axis in "NCHW")
    out_c = c // (bs * bs)
    if str(attrs.mode) == "DCR":
        s_channel, s_iy, s_ix = s_c, out_c * bs * s_c, out_c * s_c
    else:
        s_channel, s_iy, s_ix = bs * bs * s_c, bs * s_c, s_c
    if layout == "NCHW":
        return [n, out_c, h, bs, w, bs], [s_n, s_channel, s_h, s_iy, s_w, s_ix]
    return [n, h, bs, w, bs, out_c], [s_n, s_h, s_iy, s_w, s_ix, s_channel]


def _target_fma(target) -> bool | None:
    """Whether TVM-only's code for ``target`` may contract a float multiply-add (None: not known)."""
    if target is None or str(target.kind) != "llvm":
        return None
    return float_lowering(target).fma


def resize_tables(call, target) -> tuple[list, str | None]:
    """image.resize2d nearest: the index table of its H and W axes (a None table: the identity), or why
    it stays in TVM."""
    attrs = call.attrs
    layout, method = str(attrs.layout), str(attrs.method)
    if method != "nearest_neighbor":
        return [], f"resize method {method} rounds in float (only nearest_neighbor is a copy)"
    if layout not in ("NCHW", "NHWC"):
        return [], f"resize layout {layout} is not NCHW or NHWC"
    mode, rounding = str(attrs.coordinate_transformation_mode), str(attrs.rounding_method)
    if mode == "tf_crop_and_resize":
        return [], "resize tf_crop_and_resize reads the roi and extrapolates outside it"
    shape, out = static_shape(call.args[0]), static_shape(call)
    if shape is None or out is None:
        return [], "resize shape is not static"
    tables = []
    for axis in (layout.index("H"), layout.index("W")):
        reason = resize.reason(shape[axis], out[axis], mode, rounding)
        if reason:
            return [], f"resize {reason}"
        table = resize.table(shape[axis], out[axis], mode, rounding, _target_fma(target))
        if table is None:
            why = "give partition_for_refcg the target" if target is None else \
                "LLVM fuses it for FMA targets, except where it folded the index to a constant"
            return [], (f"resize {shape[axis]} -> {out[axis]} ({mode}, rounding {rounding or 'default'}): the input "
                        f"index depends on whether TVM-only's code fuses a float multiply-add ({why})")
        tables.append(None if np.array_equal(table, np.arange(out[axis])) else table)
    return tables, None


@dataclass
class Copy:
    call: relay.Call
    op: str
    data: relay.Expr  # the tensor operand (maximum/minimum: the non-constant one)
    bound: relay.Constant | None  # the constant of maximum/minimum
    inner: tuple = ()  # SHUFFLE: its transpose and first reshape (call is the last reshape)

    @classmethod
    def parse(cls, call) -> "Copy":
        op, data, bound = op_name(call), call.args[0], None
        if op in CLAMP_OPS:
            first_constant = isinstance(call.args[0], relay.Constant)
            data, bound = (call.args[1], call.args[0]) if first_constant else (call.args[0], call.args[1])
        return cls(call, op, data, bound)

    @classmethod
    def parse_shuffle(cls, call) -> "Copy":
        transpose = call.args[0]
        first = transpose.args[0]
        return cls(call, SHUFFLE, first.args[0], None, (transpose, first))

    def members(self) -> list:
        return [self.call, *self.inner]

    def gather(self) -> list | None:
        """SHUFFLE's per-axis index tables (gather_tables), None when it is not one gather."""
        return gather_tables(static_shape(self.data), [*self.inner[::-1], self.call])

    def reason(self, ctx) -> str | None:
        call, op, data = self.call, self.op, self.data
        if isinstance(data, relay.Constant):
            return f"{op} of a constant (TVM folds it)"
        reason = first_reason(check_tensor(data, f"{op} input", dtypes=REQUANTIZE_DTYPES, min_rank=0),
                              check_tensor(call, f"{op} output", dtypes=REQUANTIZE_DTYPES))
        if reason:
            return reason
        if dtype_of(data) != dtype_of(call) and op != "cast":
            return f"{op} changes dtype"
        if folded_cast(call):
            return (f"{folded_cast(call)}: TVM's SimplifyConsecutiveCast drops it before a following cast "
                    "(IsWidenCast), so whether TVM-only wraps depends on the consumer")
        if op == "cast" and ctx.dequantize_uses.known and ctx.dequantize_uses.cast_reason(call):
            return "reads a qnn.quantize whose " + ctx.dequantize_uses.cast_reason(call).removeprefix("its ")
        if op == "clip":
            return check_clip(call, dtype_of(call))
        if op in CLAMP_OPS:
            bound = const_value(self.bound)
            if bound.size != 1 or bound.dtype != np.dtype(dtype_of(data)):
                return f"{op} operand is not a scalar {dtype_of(data)} constant"
            return None
        if op == "layout_transform":
            src, dst = str(call.attrs.src_layout), str(call.attrs.dst_layout)
            if sorted(src) != sorted(dst) or not src.isalpha() or not src.isupper():
                return f"layout_transform {src} -> {dst} is not a permutation of plain axes"
        if op == "strided_slice":
            return _strided_slice_reason(call)
        if op == SHUFFLE and self.gather() is None:
            return "reshape -> transpose -> reshape mixes axes (not a gather along each axis)"
        if op == "nn.depth_to_space" and str(call.attrs.layout) not in ("NCHW", "NHWC"):
            return f"depth_to_space layout {call.attrs.layout} is not NCHW or NHWC"
        if op == "image.resize2d":
            if dtype_of(data) == "int32":
                return "resize of int32: TVM reads the value through float32 (rounds above 2**24)"
            return resize_tables(call, ctx.target)[1]
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

    def view(self, src, target) -> dict:
        """Output shape (logical) and the strides/offset/padding/index tables that read it from ``src``
        (a Buffer, in its physical layout)."""
        call, op, shape = self.call, self.op, src.shape
        out = tuple(int(d) for d in call.checked_type.shape)
        strides = src.strides
        view = {"out_shape": list(out), "in_stride": strides, "pad_before": [0] * len(out), "in_shape": list(shape),
                "offset": 0, "take": [None] * len(out)}
        if op in RESHAPE_OPS or op in ("cast", "clip", *CLAMP_OPS):
            # compact in and out, same element order: one flat run
            size = prod(out)
            return {"out_shape": [size], "in_stride": [1], "pad_before": [0], "in_shape": [size], "offset": 0,
                    "take": [None]}
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
        if op == SHUFFLE:
            view["take"] = self.gather()
            return view
        if op == "strided_slice":
            begin, step = strided_slice_spec(call)
            view["in_stride"] = [s * k for s, k in zip(strides, step)]
            view["offset"] = int(sum(b * s for b, s in zip(begin, strides)))
            view["in_shape"] = list(out)  # every output index reads inside the input (checked)
            return view
        if op == "nn.pad":
            view["pad_before"] = [int(before) for before, _ in call.attrs.pad_width]
            return view
        if op == "nn.depth_to_space":  # a logical input (layout_ok)
            out_shape, in_stride = depth_to_space_view(call.attrs, shape)
            # every output index reads inside the input: no padding bound
            return {"out_shape": out_shape, "in_stride": in_stride, "pad_before": [0] * 6, "in_shape": out_shape,
                    "offset": 0, "take": [None] * 6}
        if op == "image.resize2d":
            tables, reason = resize_tables(call, target)
            if reason:
                raise RefcgError(op, "copy", reason)
            layout = str(call.attrs.layout)
            view["take"][layout.index("H")], view["take"][layout.index("W")] = tables
            return view
        raise RefcgError(op, "copy", "no data-movement plan for this op")

    def is_view(self) -> bool:
        """Reshape-like ops keep every byte in place (logical layouts, one dtype): the planner makes
        their result a view of the input's buffer instead of a step (``plan.build_plan``)."""
        return self.op in RESHAPE_OPS

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """The elementwise ops (one flat run): any layout their input and output share; the per-axis
        views: any layouts (``physical``)."""
        if self.op in AXIS_VIEW_OPS:
            return True
        return self.op in ("cast", "clip", *CLAMP_OPS) and list(src_perms) == [dst_perm]

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        op = self.op
        lo, hi = DTYPE_RANGE["int32" if op == "cast" else dst.dtype]  # a cast wraps, it does not saturate
        if op == "clip":
            lo, hi = out_range(dst.dtype, self.call)
        elif op == "maximum":
            lo = max(lo, int(const_value(self.bound).reshape(-1)[0]))
        elif op == "minimum":
            hi = min(hi, int(const_value(self.bound).reshape(-1)[0]))
        src = operands(func, srcs, [self.data])[0]
        pad_value = int(float(const_value(self.call.args[1]).reshape(-1)[0])) if op == "nn.pad" else 0
        params = {**physical(self.view(src, target), dst), "in_dtype": DTYPE_CODE[src.dtype],
                  "out_dtype": DTYPE_CODE[dst.dtype], "lo": lo, "hi": hi, "pad_value": pad_value}
        return Step(name, NAME, [src], dst, {"params": params, "ops": op},
                    [Call("refcg_copy", ["params"], [src], dst)])


def physical(view: dict, dst) -> dict:
    """``view`` (per logical output axis) with its axes in ``dst``'s physical order."""
    if dst.perm is None or len(view["out_shape"]) != len(dst.perm):  # logical, or one flat run
        return view
    axis_keys = ("out_shape", "in_stride", "pad_before", "in_shape", "take")
    return {**view, **{key: [view[key][axis] for axis in dst.perm] for key in axis_keys}}


def parse(body) -> Copy:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    inner = body.args[0] if op_name(body) == "reshape" else None
    if isinstance(inner, relay.Call) and op_name(inner) == "transpose":
        return Copy.parse_shuffle(body)
    return Copy.parse(body)
