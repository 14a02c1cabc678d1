"""refcg.conv2d: ``nn.pad? -> qnn.conv2d -> bias? -> qnn.requantize? -> clip? -> cast?`` (runtime refcg_conv2d)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from ..numerics import DTYPE_RANGE, FLIPPABLE_MODES
from ..packing import pack_conv2d_fast, pack_conv2d_weight
from ..stagewise import conv_stagewise
from .base import (DTYPE_CODE, INT32_MAX, QUANT_DTYPES, Call, Step, check_elements, check_scale, check_zero_point,
                   const_value, constant_subgraph, constants, dtype_of, first_reason, folded_constant,
                   is_constant_subgraph, layout_dims, layout_strides, op_name, static_shape)
from .epilogue import Epilogue, bias_of, float_conversion_reason, requantize_of

NAME = "conv2d"
NEON_REQUANTIZE = True  # TVM-only may round its requantize with NEON on aarch64: plan takes ``ask``
LAYOUTS = {("NCHW", "OIHW"), ("NHWC", "HWIO"), ("NHWC", "HWOI")}
# int16: TVM 0.19 computes it in int16 (wrapping) or in int32 then narrows; both equal int32 wrapped
OUT_DTYPES = ("int32", "int16")


def _chain(padded: bool) -> list:
    """With a clip and a cast (PyTorch), a clip, then without, then the accumulator kept (no
    requantize): MergeComposite does not retry a smaller match at the same ops."""
    data = is_op("nn.pad")(wildcard(), is_constant()) if padded else wildcard()
    conv = is_op("qnn.conv2d")(data, constant_subgraph(), *constants(4))
    biased = conv.optional(bias_of)
    requantized = requantize_of(biased)
    clipped = is_op("clip")(requantized)
    return [is_op("cast")(clipped), clipped, requantized, biased]


def patterns() -> list:
    # a pad in front first: when its check rejects it, the plain conv still matches and the pad stays
    return [(p, lambda e: Conv2D.parse(e, padded=True)) for p in _chain(True)] + \
           [(p, lambda e: Conv2D.parse(e, padded=False)) for p in _chain(False)]


def check_accumulator(op: str, data, in_zp, weight, k_zp, reduction: int, out_axis: int, bias=None,
                      values: np.ndarray | None = None, requantize=None, target=None) -> str | None:
    """The int32 accumulator must not wrap: reject when the worst case of sum (x - zx)(w - zw) (+ bias) can;
    nor may ``requantize`` carry it past int32 in float numerics (epilogue.float_conversion_reason).

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
    return float_conversion_reason(requantize, bound, target)


def _padding(pad) -> tuple[int, int]:
    pad = [int(p) for p in pad]
    return (pad[0], pad[0]) if len(pad) == 1 else (pad[0], pad[1])


@dataclass
class Conv2D:
    """A matched conv chain: the conv, its fused ``nn.pad`` (None when the input is not padded inside
    the match) and its epilogue."""

    conv: relay.Call
    pad: relay.Call | None
    epilogue: Epilogue
    writes_strided = True  # its output may be stored inside a halo (plan.plan_halos)

    @classmethod
    def parse(cls, root, padded: bool | None = None) -> "Conv2D":
        """``padded``: whether the match includes an ``nn.pad`` in front (None: an ``nn.pad`` input
        is part of it, as inside a composite)."""
        epilogue = Epilogue.parse(root)
        data = epilogue.anchor.args[0]
        has_pad = op_name(data) == "nn.pad" if padded is None else padded
        return cls(epilogue.anchor, data if has_pad else None, epilogue)

    def members(self) -> list:
        return [c for c in (*self.epilogue.calls(), self.conv, self.pad) if c is not None]

    def reason(self, ctx) -> str | None:
        return self.conv_reason(ctx.target) or self.pad_reason()

    def conv_reason(self, target=None) -> str | None:
        """qnn.conv2d (+bias) + qnn.requantize (+clip) as ``refcg.conv2d`` computes it."""
        conv, ep = self.conv, self.epilogue
        attrs = conv.attrs
        data, weight, in_zp, k_zp, in_scale, k_scale = conv.args
        if (attrs.data_layout, attrs.kernel_layout) not in LAYOUTS:
            return f"layout {attrs.data_layout}/{attrs.kernel_layout} is not supported"
        if attrs.out_layout not in ("", attrs.data_layout):
            return f"out_layout {attrs.out_layout} differs from data_layout"
        in_shape, w_shape, out_shape = static_shape(data), static_shape(weight), static_shape(conv)
        if in_shape is None or w_shape is None or out_shape is None:
            return "shapes must be static"
        if len(in_shape) != 4:
            return f"input rank {len(in_shape)} is not 4"
        if dtype_of(data) not in QUANT_DTYPES or dtype_of(weight) not in QUANT_DTYPES:
            return f"dtypes {dtype_of(data)}/{dtype_of(weight)} are not int8/uint8"
        if attrs.out_dtype not in OUT_DTYPES:
            return f"conv out_dtype {attrs.out_dtype} is not int32 or int16"
        if attrs.out_dtype != "int32" and (ep.requantize is not None or ep.bias is not None):
            return f"bias or requantize after a conv with out_dtype {attrs.out_dtype}"
        if not is_constant_subgraph(weight):
            return "weight is not constant"
        if min(in_shape) <= 0:
            return "zero-sized tensor"
        if min(out_shape) <= 0:  # Relay infers a negative output size for it
            return f"the kernel is larger than the padded input (output shape {out_shape})"
        reason = first_reason(
            check_elements(in_shape, "conv input"), check_elements(out_shape, "conv output"),
            check_zero_point(in_zp, dtype_of(data), "input_zero_point"),
            check_zero_point(k_zp, dtype_of(weight), "kernel_zero_point", allow_vector=True),
            check_scale(in_scale, "input_scale"),
            check_scale(k_scale, "kernel_scale"),
        )
        if reason:
            return reason
        axis = attrs.data_layout.index("C")
        channels, groups = out_shape[axis], int(attrs.groups)
        depthwise = groups > 1 and groups == in_shape[axis] == w_shape[attrs.kernel_layout.index("O")]
        if attrs.kernel_layout == "HWOI" and not depthwise:
            return "kernel layout HWOI is only supported for depthwise (groups == input channels)"
        reason = ep.bias_reason(channels, axis, 4)
        if reason:
            return reason
        w = const_value(weight)
        ohwi = None if w is None else pack_conv2d_weight(w, attrs.kernel_layout, groups, in_shape[axis])
        return check_accumulator("qnn.conv2d", data, in_zp, weight, k_zp, math.prod(w_shape) // channels, 0,
                                 ep.bias, values=ohwi, requantize=ep.requantize, target=target) or \
            ep.requantize_reason(channels, axis, 4)

    def pad_reason(self) -> str | None:
        """The pad folds into the conv's padding when it pads only H and W, by non-negative widths, with
        the input zero point (which qnn.conv2d pads with too). nn.pad casts its pad value to the data
        dtype: equal to an in-range zero point, that cast is exact."""
        pad, conv = self.pad, self.conv
        if pad is None:
            return None
        if pad.attrs.pad_mode != "constant":
            return f"pad_mode {pad.attrs.pad_mode} is not constant"
        for axis, (before, after) in zip(conv.attrs.data_layout, pad.attrs.pad_width):
            before, after = int(before), int(after)
            if axis in "NC" and (before or after):
                return f"pad on the {axis} axis"
            if before < 0 or after < 0:
                return f"negative pad width ({before}, {after}) on the {axis} axis"
        value, zero_point = const_value(pad.args[1]), int(const_value(conv.args[2]).reshape(-1)[0])
        if value.size != 1 or not np.isfinite(value).all() or value.reshape(-1)[0] != zero_point:
            return f"pad value {value.reshape(-1).tolist()} differs from the input zero point {zero_point}"
        return None

    def fused_pad(self) -> tuple[int, int]:
        """(top, left) widths of the fused ``nn.pad``."""
        if self.pad is None:
            return 0, 0
        widths = [int(before) for before, _ in self.pad.attrs.pad_width]
        layout = self.conv.attrs.data_layout
        return widths[layout.index("H")], widths[layout.index("W")]

    def layout(self) -> str:
        return str(self.conv.attrs.data_layout)

    def flippable_output(self, target) -> bool:
        """Its int8 output can be stored flipped (plan.plan_flips): requantized in int64 numerics."""
        return self.epilogue.requantize is not None and self.epilogue.requant(target).mode in FLIPPABLE_MODES

    def reads_flipped(self, target) -> bool:
        """Its input may be stored flipped (plan.plan_flips): read as uint8 at zero point + 128, which the
        integer accumulation subtracts exactly."""
        return True

    def in_place_halo(self) -> tuple[int, int, int, int] | None:
        """(top, left, bottom, right): the border a depthwise conv (channel multiplier 1, channels a
        multiple of 16: its kernels' pixels) reads of its input, which stored inside it is the
        conv's padded copy (plan.plan_halos); None for other convs."""
        attrs, layout = self.conv.attrs, str(self.conv.attrs.data_layout)
        data = self.pad.args[0] if self.pad is not None else self.conv.args[0]  # the composite's input
        in_dims, out_dims = layout_dims(static_shape(data), layout), layout_dims(static_shape(self.conv), layout)
        if int(attrs.groups) != in_dims["C"] or out_dims["C"] != in_dims["C"] or in_dims["C"] % 16:
            return None
        top, left = (a + b for a, b in zip(_padding(attrs.padding), self.fused_pad()))
        kernel = static_shape(self.conv.args[1])
        kh, kw = (kernel[str(attrs.kernel_layout).index(axis)] for axis in "HW")
        reach = [(out_dims[axis] - 1) * int(attrs.strides[i]) + (k - 1) * int(attrs.dilation[i]) + 1
                 for i, (axis, k) in enumerate((("H", kh), ("W", kw)))]
        return top, left, max(0, reach[0] - top - in_dims["H"]), max(0, reach[1] - left - in_dims["W"])

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Any layout through strides; but a depthwise conv with a channel multiplier has a fast kernel
        on planes (NCHW) only, so it keeps the logical layout."""
        attrs, shape = self.conv.attrs, static_shape(self.conv)
        multiplier = int(attrs.groups) > 1 and shape[attrs.data_layout.index("C")] != int(attrs.groups)
        return not multiplier or (src_perms[0] is None and dst_perm is None)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        attrs, src = self.conv.attrs, srcs[0]
        data, weight, in_zp, k_zp, _, _ = self.conv.args
        # an input inside a halo (in_place_halo): read whole, as the padded input, once the halo is filled
        whole = src.whole()
        in_dims = layout_dims(whole.shape, attrs.data_layout)
        out_dims = layout_dims(dst.shape, attrs.data_layout)
        w = folded_constant(weight, "qnn.conv2d", "weight")
        packed = pack_conv2d_weight(w, attrs.kernel_layout, int(attrs.groups), in_dims["C"])
        # the fused pad and the conv's own padding both pad with the input zero point: they add up
        pad_top, pad_left = _padding(attrs.padding)
        fused_top, fused_left = self.fused_pad()
        if src.halo is not None:
            fused_top, fused_left = fused_top - src.halo[0], fused_left - src.halo[1]
        in_dtype = "uint8" if src.flipped else dtype_of(data)  # a flipped input: int8 + 128 (Buffer.flipped)
        params = {
            "batch": in_dims["N"], "in_h": in_dims["H"], "in_w": in_dims["W"], "in_c": in_dims["C"],
            "out_h": out_dims["H"], "out_w": out_dims["W"], "out_c": out_dims["C"],
            "kernel_h": packed.shape[1], "kernel_w": packed.shape[2],
            "stride_h": int(attrs.strides[0]), "stride_w": int(attrs.strides[1]),
            "dilation_h": int(attrs.dilation[0]), "dilation_w": int(attrs.dilation[1]),
            "pad_top": pad_top + fused_top, "pad_left": pad_left + fused_left, "groups": int(attrs.groups),
            "in_dtype": DTYPE_CODE[in_dtype], "w_dtype": DTYPE_CODE[str(w.dtype)],
            "out_dtype": DTYPE_CODE["uint8" if dst.flipped else dst.dtype],
            "input_zp": int(const_value(in_zp)) + (128 if src.flipped else 0),
            "kernel_zp": int(const_value(k_zp).reshape(-1)[0]),
            "in_stride": layout_strides(whole, attrs.data_layout),
            "out_stride": layout_strides(dst, attrs.data_layout),
        }
        bias = self.epilogue.bias_value("qnn.conv2d")
        rq = self.epilogue.requant(target, ask, conv_stagewise(target, self.conv) is not None)
        # int16 (accumulator or requantized): the C core's fast epilogues store int8/uint8/int32 only
        fast = pack_conv2d_fast(packed, params, in_dtype, bias) if dst.dtype != "int16" else None
        gemm = fast.gemm if fast is not None else None
        values = {
            "params": params, "bias": bias,
            "requant": flipped(rq) if dst.flipped else rq,
            # the reference layout is not stored when every variant (scalar included) runs the packed GEMM
            "weight": packed if gemm is None else None,
            "gemm": gemm, "depthwise": fast if fast is not None and gemm is None else None,
            "fast_kind": fast.kind if fast is not None else "REFCG_FAST_NONE", "fast_cp": fast.cp if fast else 0,
            "winograd": fast is not None and fast.winograd,
            "halo": None,
        }
        calls = [Call("refcg_conv2d", ["params", "consts", "fast"], [whole], dst)]
        if src.halo is not None:
            top, left, bottom, right = src.halo
            values["halo"] = {"batch": in_dims["N"], "h": in_dims["H"], "w": in_dims["W"], "c": in_dims["C"],
                              "top": top, "left": left, "bottom": bottom, "right": right,
                              "value": params["input_zp"]}
            calls.insert(0, Call("refcg_fill_halo", ["halo"], [], whole))
        return Step(name, NAME, [src], dst, values, calls)


def flipped(rq):
    """rq for an output stored flipped (Buffer.flipped): each value + 128, exact where the zero point is
    added as an integer (FLIPPABLE_MODES)."""
    assert rq.mode in FLIPPABLE_MODES, rq.mode
    return dataclasses.replace(rq, output_zp=rq.output_zp + 128, out_min=rq.out_min + 128, out_max=rq.out_max + 128)


def parse(body) -> Conv2D:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Conv2D.parse(body)
