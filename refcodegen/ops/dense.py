"""refcg.dense: ``reshape|batch_flatten? -> qnn.dense -> bias? -> qnn.requantize? -> clip? -> cast?``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from ..packing import pack_gemm_weights
from .base import (DTYPE_CODE, Call, Step, check_scale, check_tensor, check_zero_point, constant_subgraph, constants,
                   dtype_of, first_reason, folded_constant, is_constant_subgraph, op_name, scalar, static_shape)
from .conv2d import check_accumulator
from .epilogue import Epilogue, bias_of, requantize_of

NAME = "dense"
NEON_REQUANTIZE = True
FLATTEN_OPS = ("reshape", "nn.batch_flatten")


def patterns() -> list:
    data = wildcard()
    # a flatten in front of dense does not move data: the kernel reads the compact input as 2-D
    flat = is_op("reshape")(data) | is_op("nn.batch_flatten")(data)
    dense = is_op("qnn.dense")(flat | data, constant_subgraph(), *constants(4))
    biased = dense.optional(bias_of)
    clipped = is_op("clip")(requantize_of(biased))
    # a list: a rejected cast leaves the clipped match to the next pattern
    return [(p, Dense.parse) for p in (is_op("cast")(clipped), clipped | requantize_of(biased) | biased)]


@dataclass
class Dense:
    dense: relay.Call
    epilogue: Epilogue

    @classmethod
    def parse(cls, root) -> "Dense":
        epilogue = Epilogue.parse(root)
        return cls(epilogue.anchor, epilogue)

    def members(self) -> list:
        return [self.dense]

    def reason(self, ctx) -> str | None:
        """qnn.dense (+bias) (+requantize (+clip)) as ``refcg.dense`` computes it; int32 output kept."""
        dense, ep = self.dense, self.epilogue
        data, weight, in_zp, k_zp, in_scale, k_scale = dense.args
        if op_name(data) in FLATTEN_OPS:
            reason = check_tensor(data.args[0], "dense input")  # the flatten is free on a compact tensor
            if reason:
                return reason
        reason = first_reason(check_tensor(data, "dense input", max_rank=2),
                              check_tensor(weight, "dense weight", max_rank=2))
        if reason:
            return reason
        if len(static_shape(data)) != 2:
            return "dense input must be 2-D"
        if dense.attrs.out_dtype not in ("", "int32"):
            return f"dense out_dtype {dense.attrs.out_dtype} is not int32"
        if not is_constant_subgraph(weight):
            return "weight is not constant"
        reason = first_reason(
            check_zero_point(in_zp, dtype_of(data), "input_zero_point"),
            check_zero_point(k_zp, dtype_of(weight), "kernel_zero_point", allow_vector=True),
            check_scale(in_scale, "input_scale"),
            check_scale(k_scale, "kernel_scale"),
        )
        return reason or \
            check_accumulator("qnn.dense", data, in_zp, weight, k_zp, static_shape(weight)[1], 0, ep.bias,
                              requantize=ep.requantize, target=ctx.target) or \
            ep.reason(static_shape(dense)[1], 1, 2)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        _, weight, in_zp, k_zp, _, _ = self.dense.args
        w = np.ascontiguousarray(folded_constant(weight, "qnn.dense", "weight"))
        params = {
            "batch": dst.shape[0], "in_features": w.shape[1], "units": dst.shape[1],
            "in_dtype": DTYPE_CODE[srcs[0].dtype], "w_dtype": DTYPE_CODE[str(w.dtype)],
            "out_dtype": DTYPE_CODE[dst.dtype], "input_zp": int(scalar(in_zp)), "kernel_zp": int(scalar(k_zp)),
        }
        bias = self.epilogue.bias_value("qnn.dense")
        # int16 output: the reference kernel (the fast epilogues store 8-bit and int32 only)
        gemm = None if dst.dtype == "int16" else \
            pack_gemm_weights(w, params["kernel_zp"], params["input_zp"], srcs[0].dtype, bias)
        values = {"params": params, "requant": self.epilogue.requant(target, ask), "gemm": gemm,
                  # with a packed GEMM copy (zero points and bias folded in) the reference data is not stored
                  "weight": w if gemm is None else None, "bias": bias if gemm is None else None}
        if gemm is not None:  # refcg_dense dispatches by ISA
            call = Call("refcg_dense", ["params", "gemm", "consts.requant"], srcs[:1], dst)
        else:
            call = Call("refcg_dense_ref", ["params", "consts"], srcs[:1], dst)
        return Step(name, NAME, srcs[:1], dst, values, [call])


def parse(body) -> Dense:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Dense.parse(body)
