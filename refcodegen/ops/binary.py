"""refcg.binary: qnn.add / qnn.subtract / qnn.mul (+clip) with broadcasting (runtime refcg_binary)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from ..numerics import FLIPPABLE_MODES, MODES, float_lowering, make_requantize, resolve_mode, without_fma
from .base import (DTYPE_CODE, Buffer, Call, Step, any_of, check_clip, check_qparams, check_tensor, const_value, constants,
                   dtype_of, first_reason, folded_operand, op_name, operands, out_range, param_index, scalar)
from .epilogue import q31x4

NAME = "binary"
NEON_REQUANTIZE = True
OPS = {"qnn.add": "REFCG_BIN_ADD", "qnn.subtract": "REFCG_BIN_SUB", "qnn.mul": "REFCG_BIN_MUL"}


def patterns() -> list:
    call = any_of([is_op(name)(wildcard(), wildcard(), *constants(6)) for name in OPS])
    return [(call.optional(lambda x: is_op("clip")(x)), Binary.parse)]


def broadcast_strides(src: Buffer, dst: Buffer) -> list[int]:
    """Element strides of ``src`` (in its physical layout) broadcast to ``dst``'s shape, in the order of
    ``dst``'s physical axes (0 where broadcast): the kernel writes ``dst`` compact in that order."""
    lead = len(dst.shape) - len(src.shape)
    strides = src.strides
    logical = [0 if axis < lead or src.shape[axis - lead] == 1 else strides[axis - lead]
               for axis in range(len(dst.shape))]
    return [logical[axis] for axis in (dst.perm or range(len(dst.shape)))]


@dataclass
class Binary:
    call: relay.Call
    clip: relay.Call | None

    @classmethod
    def parse(cls, root) -> "Binary":
        if op_name(root) == "clip":
            return cls(root.args[0], root)
        return cls(root, None)

    def members(self) -> list:
        return [self.call]

    def reason(self, ctx) -> str | None:
        """Per-tensor qparams; a rank-0 operand (TFLite's hard-swish and x/6 constants) broadcasts like shape (1,)."""
        lhs, rhs, lhs_scale, lhs_zp, rhs_scale, rhs_zp, out_scale, out_zp = self.call.args
        reason = first_reason(check_tensor(lhs, "lhs", min_rank=0), check_tensor(rhs, "rhs", min_rank=0),
                              check_tensor(self.call, "output"))
        if reason:
            return reason
        out_dtype = dtype_of(self.call)
        reason = first_reason(
            check_qparams(lhs_scale, lhs_zp, dtype_of(lhs), "lhs"),
            check_qparams(rhs_scale, rhs_zp, dtype_of(rhs), "rhs"),
            check_qparams(out_scale, out_zp, out_dtype, "output"),
        )
        if reason is None and self.clip is not None:
            return check_clip(self.clip, out_dtype)
        return reason

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Any physical layout of every operand: the kernel reads them through strides."""
        return True

    def flips_exactly(self, target) -> bool:
        """An operand stored flipped (plan.plan_flips) read as uint8 at zero point + 128, and the output
        stored at zero point + 128, change no value: the requantizes subtract and add zero points as
        integers (int64 numerics), and an add's int32 operand requantizes stay far from int32's limits
        (operand / output scale ratios below 2^16), so that + 128 never meets their clamp."""
        if MODES[resolve_mode("None", "None", target)] not in FLIPPABLE_MODES:
            return False
        _, _, lhs_scale, _, rhs_scale, _, out_scale, _ = self.call.args
        out = float(np.min(np.abs(const_value(out_scale))))
        return op_name(self.call) == "qnn.mul" or \
            all(float(np.max(np.abs(const_value(s)))) < 2.0**16 * out for s in (lhs_scale, rhs_scale))

    def reads_flipped(self, target) -> bool:
        """Its operands may be stored flipped (plan.plan_flips): a residual add's, which convs read too."""
        return self.flips_exactly(target)

    def flippable_output(self, target) -> bool:
        """Its int8 output can be stored flipped (plan.plan_flips): the next block's expand conv reads it."""
        return self.flips_exactly(target)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        """As TVM 0.19 canonicalizes them (see refcg_eltwise_ref.c)."""
        call = self.call
        _, _, lhs_scale, lhs_zp, rhs_scale, rhs_zp, out_scale, out_zp = call.args
        a, b = operands(func, srcs, call.args[:2])
        # the canonical form's requantizes carry no rounding/compute attrs: config and target decide
        rounding, compute = resolve_mode("None", "None", target)
        lowering = float_lowering(target)
        # flipped tensors (Buffer.flipped, where flips_exactly): uint8 at zero point + 128
        assert not (a.flipped or b.flipped or dst.flipped) or self.flips_exactly(target)
        lhs_zp, rhs_zp = (int(scalar(zp)) + 128 * buf.flipped for zp, buf in ((lhs_zp, a), (rhs_zp, b)))
        out_scale, out_zp = const_value(out_scale), int(scalar(out_zp)) + 128 * dst.flipped
        lo, hi = (v + 128 * dst.flipped for v in out_range(dst.dtype, self.clip))
        a_dtype, b_dtype, out_dtype = ("uint8" if buf.flipped else buf.dtype for buf in (a, b, dst))

        def mode(scale, operand=None) -> str:  # the compute dtype, NEON where TVM-only rounds so
            if ask is None or (operand is not None and folded_operand(func, srcs, operand)):
                return compute
            index = None if operand is None else param_index(func, operand)
            return "int64-neon" if q31x4(rounding, compute, scale, out_scale, lambda: ask(index)) else compute

        def operand_lowering(operand):
            return without_fma(lowering) if folded_operand(func, srcs, operand) else lowering

        if op_name(call) == "qnn.mul":
            product = np.float32(scalar(lhs_scale)) * np.float32(scalar(rhs_scale))  # float32, as mul.cc
            rq_a = make_requantize(product, out_scale, 0, out_zp, out_dtype, rounding, mode(product), (lo, hi),
                                   lowering)
            rq_b = rq_a
        else:
            lhs, rhs = call.args[:2]
            rq_a = make_requantize(const_value(lhs_scale), out_scale, lhs_zp, out_zp, "int32",
                                   rounding, mode(const_value(lhs_scale), lhs), None, operand_lowering(lhs))
            rq_b = make_requantize(const_value(rhs_scale), out_scale, rhs_zp, out_zp, "int32",
                                   rounding, mode(const_value(rhs_scale), rhs), None, operand_lowering(rhs))
        params = {
            "op": OPS[op_name(call)], "ndim": len(dst.shape), "shape": list(dst.physical_shape),
            "a_stride": broadcast_strides(a, dst), "b_stride": broadcast_strides(b, dst),
            "a_dtype": DTYPE_CODE[a_dtype], "b_dtype": DTYPE_CODE[b_dtype], "out_dtype": DTYPE_CODE[out_dtype],
            "a_zp": lhs_zp, "b_zp": rhs_zp, "out_zp": out_zp, "out_min": lo, "out_max": hi,
        }
        values = {"params": params, "rq": [rq_a, rq_b], "op": op_name(call)}
        return Step(name, NAME, [a, b], dst, values, [Call("refcg_binary", ["params"], [a, b], dst)])


def parse(body) -> Binary:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Binary.parse(body)
