"""refcg.batch_matmul: ``qnn.batch_matmul(x, y) -> bias? -> qnn.requantize? -> clip? -> cast?``, both
operands run-time tensors (a constant one is read like any input)."""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from ..errors import RefcgError
from ..numerics import is_arm_cpu_aarch64, resolve_mode
from .base import (DTYPE_CODE, QUANT_DTYPES, Call, Step, check_scale, check_tensor, check_zero_point, const_value,
                   constants, dtype_of, first_reason, operands, scalar, static_shape)
from .conv2d import check_accumulator
from .epilogue import Epilogue, bias_of, q31x4, requantize_of

NAME = "batch_matmul"
NEON_REQUANTIZE = True  # plan() is told the target is aarch64 (and refuses the NEON question, see reason)


def patterns() -> list:
    bmm = is_op("qnn.batch_matmul")(wildcard(), wildcard(), *constants(4)).optional(bias_of)
    clipped = is_op("clip")(requantize_of(bmm))
    # a list: a rejected cast leaves the clipped match to the next pattern
    return [(p, BatchMatmul.parse) for p in (is_op("cast")(clipped), clipped | requantize_of(bmm) | bmm)]


def _neon_question(req, target) -> bool:
    """Whether TVM-only's aarch64 build may round this requantize with NEON: armfuse does not model which
    loop of TVM's batch_matmul group computes it, so such a requantize stays in TVM on aarch64."""
    if req is None:
        return False
    _, in_scale, _, out_scale, _ = req.args
    rounding, compute = resolve_mode(req.attrs.rounding, req.attrs.compute_dtype, target)
    return q31x4(rounding, compute, const_value(in_scale), const_value(out_scale), lambda: True)


@dataclass
class BatchMatmul:
    call: relay.Call
    epilogue: Epilogue

    @classmethod
    def parse(cls, root) -> "BatchMatmul":
        epilogue = Epilogue.parse(root)
        return cls(epilogue.anchor, epilogue)

    def members(self) -> list:
        return [self.call]

    def reason(self, ctx) -> str | None:
        """TVM 0.19 computes x . y^T only (transpose_b, batch_matmul.cc:85), int32 out, scalar qparams."""
        call, ep = self.call, self.epilogue
        x, y, x_zp, y_zp, x_scale, y_scale = call.args
        reason = first_reason(*(check_tensor(e, what, dtypes, min_rank=3, max_rank=3) for e, what, dtypes in (
            (x, "x", QUANT_DTYPES), (y, "y", QUANT_DTYPES), (call, "output", ("int32",)))))
        if reason:
            return reason
        if call.attrs.transpose_a or not call.attrs.transpose_b:
            return (f"transpose_a={bool(call.attrs.transpose_a)}, transpose_b={bool(call.attrs.transpose_b)}: "
                    "TVM 0.19 lowers only transpose_a=False, transpose_b=True")
        (xb, _, k), (yb, n, _) = static_shape(x), static_shape(y)
        if xb != yb and (dtype_of(x), dtype_of(y)) == ("uint8", "int8") and n % 16 == 0 and k % 4 == 0:
            # measured: TVM-only's result differs from the broadcast product (its packed y is indexed by x's batch)
            return ("a batch-1 operand is broadcast, which TVM's x86 batch_matmul_int8 (uint8 x int8, "
                    "N % 16 == K % 4 == 0) miscomputes")
        y_values = const_value(y)
        reason = first_reason(
            check_zero_point(x_zp, dtype_of(x), "x zero point"),
            check_zero_point(y_zp, dtype_of(y), "y zero point"),
            check_scale(x_scale, "x scale"),
            check_scale(y_scale, "y scale"),
        ) or check_accumulator(  # run-time y: the dtype-range bound K * max|x - zx| * max|y - zy|
            "qnn.batch_matmul", x, x_zp, y, y_zp, k, 0, ep.bias, None if y_values is None else y_values.reshape(-1, k),
            ep.requantize, ctx.target) or ep.reason(n, 2, 3)
        if reason is None and is_arm_cpu_aarch64(ctx.target) and _neon_question(ep.requantize, ctx.target):
            return ("aarch64: which loop of TVM-only's batch_matmul computes this requantize (NEON rounding) "
                    "is not modelled")
        return reason

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        x, y, x_zp, y_zp, _, _ = self.call.args
        a, b = operands(func, srcs, [x, y])
        if ask is not None and _neon_question(self.epilogue.requantize, target):
            raise RefcgError("qnn.batch_matmul", "aarch64 rounding",
                             "not modelled: partition_for_refcg(target=<the aarch64 target>) keeps it in TVM")
        params = {
            "batch": dst.shape[0], "m": dst.shape[1], "n": dst.shape[2], "k": a.shape[2],
            "x_batch": a.shape[0], "y_batch": b.shape[0],
            "x_dtype": DTYPE_CODE[a.dtype], "y_dtype": DTYPE_CODE[b.dtype], "out_dtype": DTYPE_CODE[dst.dtype],
            "x_zp": int(scalar(x_zp)), "y_zp": int(scalar(y_zp)),
        }
        values = {"params": params, "bias": self.epilogue.bias_value("qnn.batch_matmul"),
                  "requant": self.epilogue.requant(target)}
        return Step(name, NAME, [a, b], dst, values, [Call("refcg_batch_matmul", ["params"], [a, b], dst)])


def parse(body) -> BatchMatmul:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return BatchMatmul.parse(body)
