"""refcg.pool2d: nn.max_pool2d, or cast(avg_pool2d | global_avg_pool2d (cast(x, int32))) (runtime refcg_pool2d)."""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from .base import (DTYPE_CODE, Call, Step, check_tensor, dtype_of, first_reason, layout_dims, layout_strides, op_name,
                   static_shape)

NAME = "pool2d"
NEON_REQUANTIZE = False
LAYOUTS = ("NCHW", "NHWC")


def patterns() -> list:
    to_int32 = is_op("cast")(wildcard())
    average = is_op("nn.avg_pool2d")(to_int32) | is_op("nn.global_avg_pool2d")(to_int32)
    return [(is_op("nn.max_pool2d")(wildcard()) | is_op("cast")(average), Pool2D.parse)]


def pool_padding(attrs) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from the 1-, 2- or 4-value padding attribute."""
    pad = [int(p) for p in getattr(attrs, "padding", [0])]
    if len(pad) == 1:
        pad = pad * 4
    elif len(pad) == 2:
        pad = pad * 2
    return tuple(pad)


@dataclass
class Pool2D:
    pool: relay.Call
    data: relay.Expr
    inner_cast: relay.Call | None  # the cast to int32 in front of an average pool
    out: relay.Call

    @classmethod
    def parse(cls, root) -> "Pool2D":
        if op_name(root) == "nn.max_pool2d":
            return cls(root, root.args[0], None, root)
        pool = root.args[0]
        return cls(pool, pool.args[0].args[0], pool.args[0], root)

    def members(self) -> list:
        return [self.pool]

    def reason(self, ctx) -> str | None:
        pool, data, attrs = self.pool, self.data, self.pool.attrs
        reason = first_reason(check_tensor(data, "pool input", max_rank=4),
                              check_tensor(self.out, "pool output", max_rank=4))
        if reason:
            return reason
        if len(static_shape(data)) != 4:
            return "pool input must be 4-D"
        if attrs.layout not in LAYOUTS:
            return f"pool layout {attrs.layout} is not supported"
        if str(getattr(attrs, "out_layout", "")) not in ("", attrs.layout):
            return f"out_layout {attrs.out_layout} differs from layout"
        if self.inner_cast is not None and dtype_of(self.inner_cast) != "int32":
            return f"average pooling computed in {dtype_of(self.inner_cast)}, not int32"
        if op_name(pool) == "nn.avg_pool2d" and bool(attrs.count_include_pad) and bool(attrs.ceil_mode):
            top, left, bottom, right = pool_padding(attrs)
            layout, in_shape, out_shape = attrs.layout, static_shape(data), static_shape(pool)
            for i, (axis, pad_head, pad_tail) in enumerate((("H", top, bottom), ("W", left, right))):
                last_start = (out_shape[layout.index(axis)] - 1) * int(attrs.strides[i]) - pad_head
                if last_start > in_shape[layout.index(axis)] + pad_tail - 1:
                    return "ceil_mode window entirely outside the padded input (TVM divides by a non-positive count)"
        return None

    def layout(self) -> str:
        return str(self.pool.attrs.layout)

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Any layout through strides; the fast kernels read channels last (the output in any layout) or
        planes (logical in and out)."""
        return src_perms[0] is not None or dst_perm is None

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        attrs, src = self.pool.attrs, srcs[0]
        layout = str(attrs.layout)
        in_dims, out_dims = layout_dims(src.shape, layout), layout_dims(dst.shape, layout)
        is_global = op_name(self.pool) == "nn.global_avg_pool2d"
        kernel = (in_dims["H"], in_dims["W"]) if is_global else tuple(int(k) for k in attrs.pool_size)
        strides = (1, 1) if is_global else tuple(int(v) for v in attrs.strides)
        dilation = (1, 1) if is_global else tuple(int(v) for v in attrs.dilation)
        top, left, bottom, right = pool_padding(attrs) if not is_global else (0, 0, 0, 0)
        params = {
            "batch": in_dims["N"], "in_h": in_dims["H"], "in_w": in_dims["W"], "channels": in_dims["C"],
            "out_h": out_dims["H"], "out_w": out_dims["W"], "kernel_h": kernel[0], "kernel_w": kernel[1],
            "stride_h": strides[0], "stride_w": strides[1], "dilation_h": dilation[0], "dilation_w": dilation[1],
            "pad_top": top, "pad_left": left, "pad_bottom": bottom, "pad_right": right,
            "is_avg": int(op_name(self.pool) != "nn.max_pool2d"),
            "count_include_pad": int(bool(getattr(attrs, "count_include_pad", False))),
            "in_dtype": DTYPE_CODE[src.dtype], "out_dtype": DTYPE_CODE[dst.dtype],
            "in_stride": layout_strides(src, layout), "out_stride": layout_strides(dst, layout),
        }
        values = {"params": params, "kind": "avg" if params["is_avg"] else "max"}
        return Step(name, NAME, [src], dst, values, [Call("refcg_pool2d", ["params"], [src], dst)])


def parse(body) -> Pool2D:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Pool2D.parse(body)
