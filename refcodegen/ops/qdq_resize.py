"""refcg.qdq_resize: a nearest resize of an 8-bit tensor written through float, as TVM's PyTorch importer
writes quantized ``F.interpolate(mode="nearest")`` (qnn_torch.apply_with_fp32_fallback): qnn.dequantize ->
image.resize2d nearest -> qnn.quantize with the same scale and zero point, into the input's dtype.

The resize only moves values, and quantize(dequantize(v)) is v for every 8-bit v: with d = v - zp
(|d| <= 255) and a normal scale s, TVM-only's float32 d * s, then its division by s (or product with the
rounded reciprocal, ops/quantize.quantize_divisor), is within a few ulps of d, far from the rounding's
half; nothing adds between the multiply and the rounding, so no FMA contraction applies either. The
composite is therefore the copy family's nearest resize of the 8-bit tensor, bit-exact."""
from __future__ import annotations

from tvm.relay.dataflow_pattern import is_op

from . import copy
from .base import (QUANT_DTYPES, FloatBetween, check_qparams, check_tensor, const_value, constants, dequantized, dtype_of,
                   first_reason)

NAME = "qdq_resize"
NEON_REQUANTIZE = False
# scales whose products with |d| <= 255 and quotients stay normal float32 numbers
SCALE_RANGE = (2.0 ** -60, 2.0 ** 60)


def patterns() -> list:
    return [(is_op("qnn.quantize")(is_op("image.resize2d")(dequantized()), *constants(2)), QdqResize.parse)]


class QdqResize(FloatBetween):
    @property
    def as_copy(self) -> copy.Copy:
        """The resize as the copy family's kernel, reading the 8-bit tensor."""
        return copy.Copy(self.op, "image.resize2d", self.dequantize.args[0], None)

    def members(self) -> list:
        return [self.quantize, self.op, self.dequantize]

    def reason(self, ctx) -> str | None:
        q, dq = self.quantize, self.dequantize
        data, dtype = dq.args[0], dtype_of(dq.args[0])
        reason = first_reason(check_tensor(data, "dequantize input", dtypes=QUANT_DTYPES),
                              check_qparams(dq.args[1], dq.args[2], dtype, "dequantize"),
                              check_qparams(q.args[1], q.args[2], dtype_of(q), "quantize"))
        if reason:
            return reason
        if dtype_of(q) != dtype:
            return f"quantize to {dtype_of(q)} of a dequantized {dtype}: not the identity"
        scale, q_scale = const_value(dq.args[1]).reshape(-1)[0], const_value(q.args[1]).reshape(-1)[0]
        if scale != q_scale or const_value(dq.args[2]).reshape(-1)[0] != const_value(q.args[2]).reshape(-1)[0]:
            return "quantize and dequantize scale or zero point differ (a requantize in float)"
        if not SCALE_RANGE[0] <= float(scale) <= SCALE_RANGE[1]:
            return f"scale {float(scale)!r} outside [2**-60, 2**60]: float32 products may leave the normal range"
        return copy.resize_tables(self.op, ctx.target)[1]

    def plan(self, name: str, func, srcs, dst, target, ask=None):
        step = self.as_copy.plan(name, func, srcs, dst, target)
        step.values["ops"] = "qnn.dequantize -> image.resize2d -> qnn.quantize (the same qparams)"
        return step


def parse(body) -> QdqResize:
    return QdqResize.parse(body)
