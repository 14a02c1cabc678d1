"""Requantize numerics: reproduce TVM 0.19's lowering of ``qnn.requantize`` exactly.

TVM picks the lowering at canonicalization time from the op's ``rounding`` and
``compute_dtype`` attributes, else the active ``relay.qnn.op.requantize_config``,
else defaults (UPWARD; float32 on llvm targets with sse4.1, int64 otherwise).
This module resolves the same choice and precomputes the constants the C core
needs (Q31 multipliers and shifts, or float scales, and the float expression's
shape: ``float_lowering`` and ``make_requantize``).
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
    ("UPWARD", "int64-neon"): 6,  # see armfuse
}
# the modes that add the output zero point as an integer after rounding: a tensor stored flipped
# (ops.base.Buffer.flipped) is requantized at zero point + 128 exactly (float modes round it apart)
FLIPPABLE_MODES = (MODES[("UPWARD", "int64")], MODES[("TONEAREST", "int64")])

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


def injective_lanes(last_axis: int, out_dtype: str) -> int:
    """Lanes of topi.arm_cpu.schedule_injective (topi/arm_cpu/injective.py:68-73): the output's
    last axis split by 16 bytes of the OUTPUT dtype and vectorized; an extent below the factor
    becomes the vector, a remainder (guarded split) stays scalar."""
    factor = 16 // np.dtype(out_dtype).itemsize
    if last_axis <= factor:
        return last_axis
    return factor if last_axis % factor == 0 else 1


def _conv_shape(conv):
    attrs = conv.attrs
    layout = str(attrs.data_layout)
    data_shape = [int(d) for d in conv.args[0].checked_type.shape]
    out_c = int(conv.checked_type.shape[layout.index("C")])
    return layout, int(attrs.groups), data_shape[layout.index("C")], out_c, tuple(int(d) for d in attrs.dilation)


def conv2d_output_sliced(target, conv) -> bool:
    """Does TVM's arm_cpu conv2d legalization pad the output channels to a multiple of 8 and
    strided_slice them back (topi/arm_cpu/conv2d_alter_op.py:502-570 -> topi/generic/conv2d.py
    conv2d_alter_int8_common: groups 1, dilation 1, int8 kernel, only when the conv is still
    int8 after qnn legalization: NHWC, or any layout with +dotprod (qnn/op/legalizations.py:488-503))?
    The requantize then follows a strided_slice instead of the conv's own schedule."""
    layout, groups, _, out_c, dilation = _conv_shape(conv)
    int8 = layout == "NHWC" or target.features.has_dotprod
    return int8 and groups == 1 and dilation == (1, 1) and out_c % 8 != 0


def tvm_aarch64_lanes(target, kernel: str, *, conv=None, channels: int = 0) -> int:
    """Lanes of the loop holding the fused output stage of a TVM 0.19 arm_cpu kernel on aarch64
    (llvm -device=arm_cpu -mtriple=aarch64-*), for the strategy relay/op/strategy/arm_cpu.py
    picks; a requantize in that stage rounds with NEON when this is 4 (tensor_intrin.py:1113-1158).

    conv2d, groups 1, NHWC (HWIO; strategy arm_cpu.py:218-256, int8 or uint8 data): conv2d_gemm
        with schedule_conv2d_NHWC, which splits the fused output's channels by 4 and vectorizes
        (topi/arm_cpu/conv2d.py:585-593); a sliced output (``conv2d_output_sliced``) is not here.
    conv2d, groups 1, NCHW: int16 after qnn legalization without +dotprod -> spatial pack (no
        4-lane output stage); with +dotprod and >= 64 (padded) input channels conv2d_nchw_int8
        (arm_cpu.py:125-135), NCHWc with int32_lanes=4 (topi/arm_cpu/conv2d_int8.py:135-185).
    group conv NCHW: oc_bn = largest of 4..1 dividing the channels per group, the output's
        oc_block vectorized (topi/arm_cpu/group_conv2d.py:63-97, 365-371); NHWC: generic, none.
    depthwise (NCHW arm_cpu/x86 schedules, NHWC generic): no 4-lane output stage (measured).
    dense: dense_pack.x86 (arm_cpu.py:751-762; int8 has no arm_cpu dense): the output's
        tile_x inner factor, the largest of 8..1 dividing the units (topi/x86/dense.py:74-79,
        105-140; get_simd_32bit_lanes() is 4 off x86).
    pool: x86 schedule_pool, which leaves a fused output stage unvectorized (topi/x86/pooling.py:97-105).
    """
    if kernel == "dense":
        return next(bn for bn in range(8, 0, -1) if channels % bn == 0)
    if kernel == "pool":
        return 1
    layout, groups, in_c, out_c, _ = _conv_shape(conv)
    if groups == in_c == out_c:
        return 1
    if groups > 1:
        per_group = out_c // groups
        return next(bn for bn in range(4, 0, -1) if per_group % bn == 0) if layout == "NCHW" else 1
    if layout == "NHWC":
        return 4 if out_c % 4 == 0 else 1
    padded_in_c = -(-in_c // 8) * 8
    return 4 if target.features.has_dotprod and padded_in_c >= 64 else 1


def resolve_mode(rounding_attr: str, compute_attr: str, target, neon_q31x4: bool = False) -> tuple[str, str]:
    """The (rounding, compute_dtype) pair TVM-only would use for this requantize under ``target``.

    ``neon_q31x4``: TVM-only computes this requantize on int32x4 vectors (``armfuse``); an UPWARD
    int64 requantize then becomes ``("UPWARD", "int64-neon")`` (``make_requantize`` keeps
    per-channel ones exact: q_multiply_shift_per_axis has no aarch64 lowering, intrin_rule.cc:286).
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
class FloatLowering:
    """What decides the float expression TVM-only's LLVM code evaluates for RequantizeLowerFP.

    ``sse41``: TVM emits Floor/Round (src/relay/qnn/op/requantize.cc L136-176,
    has_current_target_sse41_support), else cast/compare/where emulations of them.
    ``fma``: the target has fused multiply-add, so LLVM contracts a float multiply and the add
    consuming it into one rounding: TVM sets ``AllowFPOpFusion = FPOpFusion::Fast`` for every
    llvm target (src/target/llvm/llvm_instance.cc L288), which lets LLVM's DAGCombiner form
    fma(a, b, c) from fadd(fmul(a, b), c) without fast-math flags.
    """

    sse41: bool
    fma: bool


SSE41_NO_FMA = FloatLowering(sse41=True, fma=False)


def without_fma(lowering: FloatLowering) -> FloatLowering:
    """``lowering`` where TVM-only rounds the multiply and the add apart whatever the target: a kernel
    computed stage by stage (stagewise.py), or a constant folded on the host target (base.folded_operand)."""
    return FloatLowering(lowering.sse41, False)


def float_lowering(target) -> FloatLowering:
    """FloatLowering of ``target`` (None: an sse4.1 target without FMA)."""
    if target is None or str(target.kind) != "llvm":
        return SSE41_NO_FMA
    from tvm.target.x86 import target_has_features

    with target:
        def has(feature):
            return bool(target_has_features(feature, target))

        # x86: FMA3 (haswell, znver1 and later -mcpu values) or AMD FMA4; aarch64: every FP unit
        fma = has("fma") or has("fma4") or (str(target.attrs.get("mtriple", "")).startswith("aarch64")
                                             and has("fp-armv8"))
        return FloatLowering(sse41=has("sse4.1"), fma=fma)


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
    fused: bool = False  # float modes: fma(x, scale, addend), else x * scale + addend
    round_emulated: bool = False  # float TONEAREST: trunc(f +- 0.5), TVM's non-sse4.1 Tonearest
    addend: float = 0.0  # the add after the product: zp, zp + 0.5 (folded) or 0.5 (float_form)
    post: float = 0.0  # added after that: 0.5 when UPWARD's half stays a separate add


def float_form(rounding: str, output_zp: int, identity: bool, lowering: FloatLowering) -> dict:
    """The float expression TVM-only evaluates for RequantizeLowerFP (float32 and float64 alike).

    With x = float(acc) - float(input_zp) and p = x * scale, TVM builds (requantize.cc L298-364)
    ``p + zp`` (zp != 0), then UPWARD ``floor(. + 0.5)``, TONEAREST ``round(.)``. Then:
    - SimplifyExpr (src/relay/backend/utils.cc GetPassPrefix, after Legalize and FoldConstant)
      rewrites ``(p + zp) + 0.5`` into ``p + fold(zp + 0.5)`` (SimplifyAdjacentMultiplyOrAdd,
      src/relay/transforms/simplify_expr.cc L885-916) when ``p + zp`` has no other use: with
      sse4.1 (Floor). The non-sse4.1 Upward also reads ``p + zp`` in isfinite/where, and the
      rewrite leaves that chain alone (measured: the optimized Relay keeps both adds).
    - LLVM fuses the multiply into the add that consumes it when the target has FMA (FloatLowering):
      the add of zp + 0.5 (UPWARD, sse4.1), of zp (zp != 0), or of 0.5 (UPWARD without sse4.1,
      zp == 0). TONEAREST with zp == 0 has no add after the product: nothing to fuse.
    - Without sse4.1, TONEAREST is trunc(f + copysign(0.5, f)) (the where/multiply emulation).
    Measured against TVM-only builds for skylake, haswell, sandybridge, corei7 and llvm
    (tests/test_ops_fma.py). aarch64 (FMA without sse4.1) is read from TVM's aarch64 assembly, not
    run: fmla for x*m + zp, and for x*m + 0.5 even though isfinite/where read x*m too (LLVM keeps
    a separate fmul for them); the core's arithmetic for it is run under qemu (test_core_arm.py).
    """
    upward = rounding == "UPWARD"
    if upward and lowering.sse41:
        addend, post = output_zp + 0.5, 0.0  # folded; exact in float32 for any zero point
    elif upward:
        addend, post = (output_zp, 0.5) if output_zp != 0 else (0.5, 0.0)
    else:
        addend, post = output_zp, 0.0
    return {
        "fused": lowering.fma and not identity and (upward or output_zp != 0),
        "round_emulated": not upward and not lowering.sse41,
        "addend": float(addend),
        "post": post,
    }


def make_requantize(input_scale: np.ndarray, output_scale: np.ndarray, input_zp: int,
                    output_zp: int, out_dtype: str, rounding: str, compute_dtype: str,
                    clip: tuple[float, float] | None = None,
                    lowering: FloatLowering = SSE41_NO_FMA) -> Requantize:
    """Constants for one requantize; ``input_scale`` is a scalar or per-channel float32 array.

    ``lowering``: ``float_lowering`` of the build target (float compute dtypes only)."""
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
        **float_form(rounding, int(output_zp), identity, lowering),
    )


def no_requantize(out_dtype: str = "int32") -> Requantize:
    """Pass-through for kernels whose int32 result the graph keeps."""
    lo, hi = DTYPE_RANGE[out_dtype]
    return Requantize(MODES[("UPWARD", "int64")], False, True, 0, 0, lo, hi, (0,), (0,), (0.0,), (0.0,))
