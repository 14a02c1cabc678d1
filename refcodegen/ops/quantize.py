"""refcg.quantize: qnn.quantize of a computed float32 tensor, or qnn.dequantize, per tensor or along
any axis (runtime refcg_quantize, vectorized where the variant has it, and refcg_dequantize_ref)."""
from __future__ import annotations

import numpy as np
from tvm.relay.dataflow_pattern import is_op, wildcard

from ..numerics import DTYPE_RANGE
from .base import (DTYPE_CODE, Call, OneCall, Step, check_scale, check_tensor, const_value, constants, dtype_of,
                   is_constant_subgraph, op_name, prod, static_shape)

NAME = "quantize"
NEON_REQUANTIZE = False
# On a composite whose root qnn.quantize divides, in TVM-only, by a rank-0 scale it loads from memory
# (a constant other kernels also read, consumers.py); set by partition.py, read by the plans
SCALE_LOADED_ATTR = "RefcgScaleLoaded"


def patterns() -> list:
    return [(is_op(name)(wildcard(), *constants(2)), Quantize.parse) for name in ("qnn.quantize", "qnn.dequantize")]


def check_axis_qparams(call, shape, scale, zero_point, dtype: str, what: str) -> str | None:
    """Each a scalar or one value per element of the ``axis`` dimension (zero points may differ per
    channel), zero points in the ``dtype`` range."""
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


def quantize_divisor(scale, loaded: bool = False) -> tuple[bool, np.ndarray]:
    """How TVM 0.19 divides by a qnn.quantize scale: (multiply, values). A rank-0 scale reaches TE as
    an immediate c (te_compiler_cache.cc inlines scalar constants) and the TIR simplifier rewrites
    x / c into x * c' with c' = float32(1.0 / c), the reciprocal taken in double
    (arith/rewrite_simplify.cc:775-780): refcg multiplies by c'. Any other scale is a tensor TVM loads,
    so it divides; so does a rank-0 one TVM loads (``loaded``: a constant several kernels read)."""
    value = const_value(scale)
    if value.ndim or loaded:
        return False, value.astype("float32").reshape(-1)
    with np.errstate(over="ignore", divide="ignore"):
        return True, np.float32(1.0 / np.float64(value)).reshape(-1)


def scale_loaded(func) -> bool:
    """Whether the composite ``func``'s quantize divides by its loaded scale (SCALE_LOADED_ATTR)."""
    return bool(func.attrs and int(func.attrs.get(SCALE_LOADED_ATTR, 0)))


def check_divisor(scale, what: str, loaded: bool = False) -> str | None:
    """TVM-only cannot build a scale whose immediate reciprocal exceeds float32 (FloatImm's range check)."""
    multiply, values = quantize_divisor(scale, loaded)
    if multiply and not np.all(np.isfinite(values)):
        return f"{what} scale's reciprocal exceeds float32: TVM's simplifier cannot make it an immediate"
    return None


class Quantize(OneCall):
    @property
    def op(self) -> str:
        return op_name(self.call)[4:]  # "quantize" or "dequantize"

    def reason(self, ctx) -> str | None:
        call = self.call
        data, scale, zero_point = call.args
        if self.op == "quantize":
            if is_constant_subgraph(data):
                return "constant input: the scoped fold evaluates it"
            reason = check_tensor(data, "quantize input", dtypes=("float32",)) or check_tensor(call, "quantize output")
            quant_dtype = dtype_of(call)
        else:
            reason = check_tensor(data, "dequantize input") or \
                check_tensor(call, "dequantize output", dtypes=("float32",))
            quant_dtype = dtype_of(data)
        reason = reason or check_axis_qparams(call, static_shape(data), scale, zero_point, quant_dtype, self.op)
        if reason is None and self.op == "quantize":
            return ctx.dequantize_uses.cast_reason(call) or \
                check_divisor(scale, "quantize", ctx.dequantize_uses.loads_scale(call))
        if reason is None and self.op == "dequantize":
            return ctx.dequantize_uses.reason(call)
        return reason

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        """Scale and zero point broadcast along ``axis`` as TVM's ExpandBiasToMatchAxis does."""
        _, scale, zero_point = self.call.args
        shape = dst.shape
        multiply, scales = quantize_divisor(scale, scale_loaded(func)) if self.op == "quantize" else \
            (False, const_value(scale).reshape(-1))
        zps = const_value(zero_point).reshape(-1)
        axis = int(self.call.attrs.axis) % len(shape)
        per_axis = max(scales.size, zps.size) > 1
        channels = shape[axis] if per_axis else 1  # per tensor: one channel spanning the whole tensor
        params = {
            "outer": prod(shape[:axis]) if per_axis else 1, "channels": channels,
            "inner": prod(shape[axis + 1:] if per_axis else shape),
            "quant_dtype": DTYPE_CODE[dst.dtype if self.op == "quantize" else srcs[0].dtype],
            "multiply": int(multiply),
        }
        values = {"params": params, "op": self.op,
                  "scales": np.broadcast_to(scales, (channels,)).astype("float32").tolist(),
                  "zero_points": np.broadcast_to(zps, (channels,)).astype("int64").tolist()}
        function = "refcg_quantize" if self.op == "quantize" else "refcg_dequantize_ref"
        return Step(name, NAME, srcs[:1], dst, values, [Call(function, ["params"], srcs[:1], dst)])


def parse(body) -> Quantize:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Quantize.parse(body)
