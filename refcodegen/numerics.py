"""Requantize numerics: reproduce TVM 0.19's lowering of ``qnn.requantize`` exactly.

TVM picks the lowering at canonicalization time from the op's ``rounding`` and
``compute_dtype`` attributes, else the active ``relay.qnn.op.requantize_config``,
else defaults (UPWARD; float32 on llvm targets with sse4.1, int64 otherwise).
This module resolves the same choice and precomputes the constants the C core
needs (Q31 multipliers and shifts, or float scales).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import RefcgError

# Values of the REFCG_RQ_* enum in runtime/refcg.h.
MODES = {
    ("UPWARD", "int64"): 0,
    ("TONEAREST", "int64"): 1,
    ("UPWARD", "float32"): 2,
    ("TONEAREST", "float32"): 3,
    ("UPWARD", "float64"): 4,
    ("TONEAREST", "float64"): 5,
    ("UPWARD", "int64-neon"): 6,  # see tvm_uses_neon_q31x4
}

DTYPE_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1)}


def fixed_point_multiplier_shift(multiplier: float) -> tuple[int, int]:
    """GetFixedPointMultiplierShift (src/relay/qnn/utils.cc): Q31 significand and exponent."""
    if multiplier == 0.0:
        return 0, 0
    significand, exponent = math.frexp(multiplier)
    q = int(math.floor(abs(significand) * (1 << 31) + 0.5)) * (1 if significand > 0 else -1)
    if q == (1 << 31):  # rounding reached 1.0: renormalise like TVM
        q //= 2
        exponent += 1
    return q, exponent


def is_arm_cpu_aarch64(target) -> bool:
    """llvm target with arm_cpu strategies and the aarch64 intrinsic lowerings (``llvm.aarch64``)."""
    if target is None or str(target.kind) != "llvm" or "arm_cpu" not in target.keys:
        return False
    return str(target.attrs.get("mtriple", "")).startswith("aarch64")


# Shapes for which TVM 0.19's arm_cpu schedules hand tir.q_multiply_shift int32x4 vectors,
# measured by grepping TVM-only builds for sqrdmulh (tests/test_arm_numerics.py re-checks it):
# schedule_conv2d_NHWC and dense_gemm_schedule split the fused output's channels by 4, the
# injective schedule splits the last axis by 16 bytes (4 lanes only for int32 outputs).
def _neon_conv2d(layout, groups, channels, out_dtype):
    return layout == "NHWC" and groups == 1 and (channels == 4 or channels % 8 == 0)


def _neon_dense(layout, groups, channels, out_dtype):
    return channels == 4


def _neon_requantize(layout, groups, channels, out_dtype):
    return out_dtype == "int32" and channels % 4 == 0


NEON_Q31X4_SCHEDULES = {"conv2d": _neon_conv2d, "dense": _neon_dense, "requantize": _neon_requantize}


def tvm_uses_neon_q31x4(target, op: str, *, channels: int, layout: str = "", groups: int = 1,
                        out_dtype: str = "int8") -> bool:
    """Does TVM-only requantize ``op``'s output with the aarch64 NEON q_multiply_shift?

    On llvm aarch64 targets TVM lowers ``tir.q_multiply_shift`` on int32x4 vectors to
    sqrdmulh + srshl, rounding twice (topi/arm_cpu/tensor_intrin.py; apache/tvm#11155),
    and everything else (scalars, other lane counts, per-axis multipliers) to the exact
    int64 formula. ``channels`` is the innermost output axis (NHWC channels, dense units,
    the last axis of a plain requantize).
    """
    rule = NEON_Q31X4_SCHEDULES.get(op)
    return bool(rule and is_arm_cpu_aarch64(target) and rule(layout, groups, channels, out_dtype))


def resolve_mode(rounding_attr: str, compute_attr: str, target, neon_q31x4: bool = False) -> tuple[str, str]:
    """The (rounding, compute_dtype) pair TVM-only would use for this requantize under ``target``.

    ``neon_q31x4``: ``tvm_uses_neon_q31x4`` for the op; an UPWARD int64 requantize then
    becomes ``("UPWARD", "int64-neon")`` (``make_requantize`` keeps per-channel ones exact).
    """
    from tvm.relay.qnn.op.qnn import current_requantize_config
    from tvm.target.x86 import target_has_features

    config = current_requantize_config()
    rounding = rounding_attr if rounding_attr != "None" else (config.rounding or "UPWARD")
    compute = compute_attr
    if compute == "None":
        compute = config.compute_dtype
    if not compute:
        compute = "int64"
        if target is not None and str(target.kind) == "llvm":
            with target:
                if target_has_features("sse4.1", target):
                    compute = "float32"
    if (rounding, compute) not in MODES:
        raise RefcgError("qnn.requantize", "rounding/compute_dtype",
                         f"unsupported combination {rounding}/{compute}")
    if neon_q31x4 and (rounding, compute) == ("UPWARD", "int64"):
        compute = "int64-neon"
    return rounding, compute


@dataclass(frozen=True)
class Requantize:
    """Everything the C ``refcg_requant`` struct holds, as plain Python values."""

    mode: int
    per_channel: bool
    identity: bool
    input_zp: int
    output_zp: int
    out_min: int
    out_max: int
    multipliers: tuple[int, ...]
    shifts: tuple[int, ...]
    scales_f32: tuple[float, ...]
    scales_f64: tuple[float, ...]


def make_requantize(input_scale: np.ndarray, output_scale: np.ndarray, input_zp: int,
                    output_zp: int, out_dtype: str, rounding: str, compute_dtype: str,
                    clip: tuple[float, float] | None = None) -> Requantize:
    """Constants for one requantize; ``input_scale`` is a scalar or per-channel float32 array."""
    in_scale = np.asarray(input_scale, dtype="float32")
    out_scale = np.float64(np.asarray(output_scale, dtype="float32"))
    ratios = [float(np.float64(s) / out_scale) for s in in_scale.reshape(-1)]
    # TVM skips the multiply only for scalar scales that are equal (IsEqualScalar).
    identity = in_scale.ndim == 0 and float(in_scale) == float(out_scale)
    fixed = [fixed_point_multiplier_shift(r) for r in ratios]
    if compute_dtype == "int64-neon" and in_scale.ndim != 0:
        compute_dtype = "int64"  # per-axis multipliers (even one) have no NEON lowering in TVM
    lo, hi = DTYPE_RANGE[out_dtype]
    if clip is not None:
        lo, hi = max(lo, int(clip[0])), min(hi, int(clip[1]))  # TVM casts clip bounds by truncation
    return Requantize(
        mode=MODES[(rounding, compute_dtype)],
        per_channel=len(ratios) > 1,
        identity=identity,
        input_zp=int(input_zp),
        output_zp=int(output_zp),
        out_min=lo,
        out_max=hi,
        multipliers=tuple(m for m, _ in fixed),
        shifts=tuple(s for _, s in fixed),
        scales_f32=tuple(float(np.float32(r)) for r in ratios),
        scales_f64=tuple(ratios),
    )


def no_requantize(out_dtype: str = "int32") -> Requantize:
    """Pass-through for kernels whose int32 result the graph keeps."""
    lo, hi = DTYPE_RANGE[out_dtype]
    return Requantize(MODES[("UPWARD", "int64")], False, True, 0, 0, lo, hi, (0,), (0,), (0.0,), (0.0,))
