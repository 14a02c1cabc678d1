"""refcg.float_softmax: qnn.dequantize -> nn.softmax (last axis) -> qnn.quantize in float32, as TVM's
x86 code computes it (runtime refcg_float_softmax_ref)."""
from __future__ import annotations

from tvm.relay.dataflow_pattern import is_op

from .. import softmax as numerics
from ..errors import RefcgError
from .base import (DTYPE_CODE, Call, FloatBetween, Step, check_qparams, check_tensor, constants, dequantized, dtype_of,
                   first_reason, prod, scalar, static_shape)
from .quantize import check_divisor, quantize_divisor, scale_loaded
from .softmax import require_x86

NAME = "float_softmax"
NEON_REQUANTIZE = False


def patterns() -> list:
    return [(is_op("qnn.quantize")(is_op("nn.softmax")(dequantized()), *constants(2)), FloatSoftmax.parse)]


class FloatSoftmax(FloatBetween):
    def members(self) -> list:
        return [self.op]

    def reason(self, ctx) -> str | None:
        """Per-tensor qparams, the last axis."""
        data, root = self.dequantize.args[0], self.quantize
        reason = first_reason(
            check_tensor(data, "softmax input"), check_tensor(root, "softmax output"),
            check_qparams(self.dequantize.args[1], self.dequantize.args[2], dtype_of(data), "dequantize"),
            check_qparams(root.args[1], root.args[2], dtype_of(root), "quantize"),
        ) or ctx.dequantize_uses.cast_reason(root) or \
            check_divisor(root.args[1], "quantize", ctx.dequantize_uses.loads_scale(root))
        if reason:
            return reason
        rank = len(static_shape(data))
        if int(self.op.attrs.axis) % rank != rank - 1:
            return (f"float softmax over axis {int(self.op.attrs.axis)}, not the last one "
                    "(TVM schedules it differently)")
        return numerics.x86_target_reason(ctx.target)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        require_x86(target, "nn.softmax")
        if numerics.fast_math_reason():
            raise RefcgError("nn.softmax", "PassContext", numerics.fast_math_reason() + "; build at opt_level 3")
        multiply, output_scale = quantize_divisor(self.quantize.args[1], scale_loaded(func))
        params = {
            "rows": prod(dst.shape[:-1]), "axis": dst.shape[-1],
            "in_dtype": DTYPE_CODE[srcs[0].dtype], "out_dtype": DTYPE_CODE[dst.dtype],
            "input_zp": int(scalar(self.dequantize.args[2])), "output_zp": int(scalar(self.quantize.args[2])),
            "input_scale": float(scalar(self.dequantize.args[1])), "output_scale": float(output_scale[0]),
            "output_multiply": int(multiply),
        }
        return Step(name, NAME, srcs[:1], dst, {"params": params},
                    [Call("refcg_float_softmax_ref", ["params"], srcs[:1], dst)])


def parse(body) -> FloatSoftmax:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return FloatSoftmax.parse(body)
