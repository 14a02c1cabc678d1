"""refcg.reduce: a sum or mean of an 8-bit tensor computed in int32 (TFLite MEAN, PyTorch's quantized
adaptive_avg_pool2d), optionally cast back to an integer type (runtime refcg_reduce); or of an int32
tensor a qnn.requantize computes (FakeQuantizationToInteger's dequantize -> global_avg_pool2d ->
quantize), whose qparams bound it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from ..numerics import DTYPE_RANGE
from .base import (DTYPE_CODE, INT32_MAX, QUANT_DTYPES, REQUANTIZE_DTYPES, Call, Step, any_of, check_tensor,
                   const_value, dtype_of, first_reason, op_name, prod, static_shape)
from .pool2d import LAYOUTS

NAME = "reduce"
NEON_REQUANTIZE = False
OPS = ("mean", "sum", "nn.adaptive_avg_pool2d", "nn.global_avg_pool2d")


def patterns() -> list:
    """Of a cast to int32, then of any tensor (int32 computed by a qnn.requantize: ``Reduce.reason``);
    each with the cast back, then without."""
    to_int32 = is_op("cast")(wildcard())
    found = []
    for source in (to_int32, wildcard()):
        reduced = any_of([is_op(name)(source) for name in OPS])
        found += [(is_op("cast")(reduced), Reduce.parse), (reduced, Reduce.parse)]
    return found


def requantized_bound(expr) -> int | None:
    """The largest |value| of a qnn.requantize's int32 result from its input dtype and constant qparams:
    |x - izp| * in_scale / out_scale, with room for the rounding and TVM's fixed-point or float32
    arithmetic, + |ozp|; None when ``expr`` is not such a requantize (or a composite call of one)."""
    bound = {}
    if isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function) and expr.op.attrs \
            and expr.op.attrs.get("Composite"):  # merged already (refcg.requantize): its body, params bound
        bound = dict(zip(expr.op.params, expr.args))
        expr = expr.op.body
    if op_name(expr) != "qnn.requantize" or dtype_of(expr) != "int32":
        return None
    values = [const_value(bound.get(arg, arg)) for arg in expr.args[1:5]]
    lo_hi = DTYPE_RANGE.get(dtype_of(expr.args[0]))
    if lo_hi is None or any(v is None for v in values) or dtype_of(expr.args[0]) == "int32":
        return None
    in_scale, in_zp, out_scale, out_zp = (np.abs(v.astype(np.float64)).reshape(-1) for v in values)
    if not np.all(out_scale > 0) or not np.all(np.isfinite(in_scale)):
        return None
    span = max(abs(lo_hi[0]) + in_zp.max(), abs(lo_hi[1]) + in_zp.max())
    # float32 requantize (FMA targets) is off by a relative 2^-24 at most, the fixed point by less
    return int(math.ceil(span * float((in_scale / out_scale).max()) * (1 + 2.0**-20))) + 2 + int(out_zp.max())


@dataclass
class Reduce:
    out_cast: relay.Call | None
    reduce: relay.Call
    inner_cast: relay.Call | None  # None: the int32 input is summed as it is
    data: relay.Expr
    out: relay.Expr

    @classmethod
    def parse(cls, root) -> "Reduce":
        out_cast = root if op_name(root) == "cast" and op_name(root.args[0]) in OPS else None
        reduce = root.args[0] if out_cast is not None else root
        inner_cast = reduce.args[0] if op_name(reduce.args[0]) == "cast" else None
        return cls(out_cast, reduce, inner_cast, inner_cast.args[0] if inner_cast is not None else reduce.args[0], root)

    def members(self) -> list:
        return [self.reduce]

    def axes(self) -> list[int]:
        """The input axes the reduction sums over, sorted."""
        reduce = self.reduce
        rank = len(static_shape(reduce.args[0]))
        if op_name(reduce) in ("mean", "sum"):
            axes = list(range(rank)) if reduce.attrs.axis is None else \
                sorted(int(a) % rank for a in reduce.attrs.axis)
            return [a for a in range(rank) if a not in axes] if bool(reduce.attrs.exclude) else axes
        layout = str(reduce.attrs.layout)
        return sorted(layout.index(axis) for axis in "HW")

    def reason(self, ctx) -> str | None:
        reduce, data = self.reduce, self.data
        in_dtypes = QUANT_DTYPES + ("int16",) if self.inner_cast is not None else ("int32",)
        reason = first_reason(check_tensor(data, "reduce input", dtypes=in_dtypes),
                              check_tensor(self.out, "reduce output", dtypes=REQUANTIZE_DTYPES, min_rank=0))
        if reason:
            return reason
        if (self.inner_cast is not None and dtype_of(self.inner_cast) != "int32") or dtype_of(reduce) != "int32":
            return f"{op_name(reduce)} computed in {dtype_of(reduce)}, not int32"
        if op_name(reduce) in ("nn.adaptive_avg_pool2d", "nn.global_avg_pool2d"):
            attrs = reduce.attrs
            if str(attrs.layout) not in LAYOUTS or str(getattr(attrs, "out_layout", "")) not in ("", attrs.layout):
                return f"pool layout {attrs.layout} is not supported"
            out_shape = static_shape(reduce)
            if len(out_shape) != 4 or any(out_shape[str(attrs.layout).index(a)] != 1 for a in "HW"):
                return f"{op_name(reduce)} output {out_shape} is not 1x1"
        axes = self.axes()
        if not axes or axes != list(range(axes[0], axes[-1] + 1)):
            return f"reduction over axes {axes}, not one contiguous run"
        shape = static_shape(data)
        count = math.prod(shape[a] for a in axes)
        if self.inner_cast is None:
            bound = requantized_bound(data)
            if bound is None:
                return f"{op_name(reduce)} of an int32 tensor whose range is not known (not a qnn.requantize's)"
        else:
            bound = max(-DTYPE_RANGE[dtype_of(data)][0], DTYPE_RANGE[dtype_of(data)][1])
        if count * bound > INT32_MAX:
            return f"int32 sum over {count} elements can overflow"
        return None

    def physical_axes(self, perm) -> list[int]:
        """The reduced axes' positions in the input's physical order (``perm``, None: logical)."""
        return sorted(perm.index(a) for a in self.axes()) if perm is not None else self.axes()

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """A re-laid-out input when its reduced axes stay one run and the kept axes keep their order
        (then [outer][inner] is the output's logical order); the output stays logical."""
        perm = src_perms[0]
        if dst_perm is not None or perm is None:
            return dst_perm is None
        axes = self.physical_axes(perm)
        kept = [a for a in perm if a not in self.axes()]
        return axes == list(range(axes[0], axes[-1] + 1)) and kept == sorted(kept)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        """Over one contiguous run of axes: the input viewed as [outer][reduce][inner]."""
        shape, axes = srcs[0].physical_shape, self.physical_axes(srcs[0].perm)
        params = {
            "outer": prod(shape[:axes[0]]), "reduce": prod(shape[axes[0]:axes[-1] + 1]),
            "inner": prod(shape[axes[-1] + 1:]), "is_mean": int(op_name(self.reduce) != "sum"),
            "in_dtype": DTYPE_CODE[srcs[0].dtype], "out_dtype": DTYPE_CODE[dst.dtype],
        }
        ops = " -> ".join(op_name(c) for c in (self.inner_cast, self.reduce, self.out_cast) if c is not None)
        return Step(name, NAME, srcs[:1], dst, {"params": params, "ops": ops},
                    [Call("refcg_reduce", ["params"], srcs[:1], dst)])


def parse(body) -> Reduce:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Reduce.parse(body)
