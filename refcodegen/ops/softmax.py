"""refcg.softmax: qnn.softmax (int8) as TVM 0.19's integer algorithm computes it without leaving int32
(refcodegen/softmax.py proves the bounds), ending in a requantize from scale 1/128 (runtime refcg_softmax_ref)."""
from __future__ import annotations

import numpy as np
from tvm.relay.dataflow_pattern import is_op, wildcard

from .. import softmax as numerics
from ..errors import RefcgError
from ..numerics import float_lowering, make_requantize, resolve_mode
from .base import (Call, OneCall, Step, check_qparams, check_tensor, const_value, constants, first_reason, prod,
                   scalar, static_shape)

NAME = "softmax"
NEON_REQUANTIZE = False


def patterns() -> list:
    return [(is_op("qnn.softmax")(wildcard(), *constants(4)), Softmax.parse)]


def require_x86(target, op: str):
    """At build time: the partition was checked for another target than the one it is built for."""
    reason = numerics.x86_target_reason(target)
    if reason:
        raise RefcgError(op, "target", reason + "; pass target= to partition_for_refcg to keep it in TVM")


class Softmax(OneCall):
    def reason(self, ctx) -> str | None:
        data, scale, zero_point, out_scale, out_zp = self.call.args
        reason = first_reason(
            check_tensor(data, "softmax input", dtypes=("int8",)),
            check_qparams(scale, zero_point, "int8", "input"),
            check_qparams(out_scale, out_zp, "int8", "output"),
        )
        if reason:
            return reason
        shape = static_shape(data)
        return numerics.overflow_reason(numerics.x0_of(float(const_value(scale).reshape(-1)[0])),
                                        shape[int(self.call.attrs.axis) % len(shape)]) or \
            numerics.x86_target_reason(ctx.target)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        require_x86(target, "qnn.softmax")
        _, scale, zero_point, out_scale, out_zp = self.call.args
        shape = srcs[0].shape
        axis = int(self.call.attrs.axis) % len(shape)
        rounding, compute = resolve_mode("None", "None", target)  # its Requantize carries no attrs
        rq = make_requantize(np.float32(1.0 / 128), const_value(out_scale), 0, int(scalar(out_zp)), "int8",
                             rounding, compute, None, float_lowering(target))
        params = {"outer": prod(shape[:axis]), "axis": shape[axis], "inner": prod(shape[axis + 1:]),
                  "input_zp": int(scalar(zero_point)), "x0": numerics.x0_of(float(scalar(scale)))}
        return Step(name, NAME, srcs[:1], dst, {"params": params, "rq": rq},
                    [Call("refcg_softmax_ref", ["params"], srcs[:1], dst)])


def parse(body) -> Softmax:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Softmax.parse(body)
