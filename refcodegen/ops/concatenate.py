"""refcg.concatenate: qnn.concatenate, each input requantized to the output qparams into its slab of
the output (requantize.py's kernel, one part per input)."""
from __future__ import annotations

from tvm.relay.dataflow_pattern import is_op, is_tuple, wildcard

from ..numerics import float_lowering, make_requantize, resolve_mode, without_fma
from . import requantize
from .base import (OneCall, check_qparams, check_tensor, const_value, constants, dtype_of, folded_operand, operands,
                   param_index, scalar)
from .epilogue import q31x4

NAME = "concatenate"
NEON_REQUANTIZE = True
MAX_INPUTS = 8


def patterns() -> list:
    return [(is_op("qnn.concatenate")(is_tuple([wildcard() for _ in range(n)]), is_tuple(constants(n)),
                                      is_tuple(constants(n)), *constants(2)), Concatenate.parse)
            for n in range(2, MAX_INPUTS + 1)]


class Concatenate(OneCall):
    def reason(self, ctx) -> str | None:
        data, scales, zero_points, out_scale, out_zp = self.call.args
        reason = check_tensor(self.call, "output")
        for i, (x, scale, zp) in enumerate(zip(data.fields, scales.fields, zero_points.fields)):
            reason = reason or check_tensor(x, f"input {i}") or check_qparams(scale, zp, dtype_of(x), f"input {i}")
        return reason or check_qparams(out_scale, out_zp, dtype_of(self.call), "output")

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Inputs and output in one physical layout: the slabs follow the axis there."""
        return all(perm == dst_perm for perm in src_perms)

    def plan(self, name: str, func, srcs, dst, target, ask=None):
        _, scales, zero_points, out_scale, out_zp = self.call.args
        axis = dst.physical_axis(int(self.call.attrs.axis) % len(dst.shape))
        rounding, compute = resolve_mode("None", "None", target)
        parts, offset = [], 0
        fields = self.call.args[0].fields
        for src, field, scale, zp in zip(operands(func, srcs, fields), fields, scales.fields, zero_points.fields):
            folded = folded_operand(func, srcs, field)
            question = (lambda index=param_index(func, field): ask(index)) if ask and not folded else None
            neon = q31x4(rounding, compute, const_value(scale), const_value(out_scale), question)
            lowering = float_lowering(target)
            rq = make_requantize(const_value(scale), const_value(out_scale), int(scalar(zp)), int(scalar(out_zp)),
                                 dst.dtype, rounding, "int64-neon" if neon else compute, None,
                                 without_fma(lowering) if folded else lowering)
            parts.append(requantize.part(src, axis, dst.physical_shape[axis], offset, dst, rq))
            offset += src.physical_shape[axis]
        return requantize.step(name, parts, dst)


def parse(body) -> Concatenate:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Concatenate.parse(body)
