"""qnn.softmax constants and the int32 bounds of TVM 0.19's integer algorithm.

TVM canonicalizes qnn.softmax (src/relay/qnn/op/softmax.cc, as built into 0.19) to int32 ops:
d = (x - zp) - max(x - zp) in [-255, 0], x_p = d + (d >> 1) - (d >> 4), q = clip(x_p / -x0, 0, 20)
with x0 = round(1 / input_scale), x_b = ((x_p - q * -x0) >> 1) + x0, e = x_b << (max(q) - q),
out = (2^30 / sum(e)) * e >> 23, then a requantize from scale 1/128. Those int32 adds,
multiplies and the divide carry no wrap-around TVM defines (LLVM nsw, division by zero), so refcg
offloads an axis only when no input can reach them; ``overflow_reason`` proves it.

The float form dequantize -> nn.softmax -> quantize is reproduced as TVM's x86 code computes it
(measured bit-exact on the float softmax itself: tests/test_ops_softmax.py).
"""
from __future__ import annotations

import math

import numpy as np
import tvm

INT32_MAX = 2**31 - 1
MAX_SHIFT = 20  # the clip on q


def x0_of(input_scale: float) -> int:
    """round(1.f / input_scale) in float32, rounding half away from zero (llvm.round), as int."""
    ratio = float(np.float32(1.0) / np.float32(input_scale))
    return int(math.floor(ratio + 0.5))  # exact: ratio is a float32 value held in a double


def exp_parts(d: np.ndarray, x0: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, x_b) of each difference ``d`` <= 0 (int64 arithmetic, no overflow for d >= -255)."""
    d = d.astype(np.int64)
    x_p = d + (d >> 1) - (d >> 4)
    q = np.minimum((-x_p) // x0, MAX_SHIFT)  # both operands <= 0: truncation equals floor of -x_p / x0
    return q, ((x_p + q * x0) >> 1) + x0


def overflow_reason(x0: int, length: int) -> str | None:
    """Why some int8 input of an axis of ``length`` elements takes TVM's algorithm out of int32."""
    if x0 < 1:
        return f"round(1 / input_scale) is {x0}: TVM's integer softmax divides by it (input_scale above 2)"
    if x0 > 2**24:
        return f"round(1 / input_scale) = {x0} is too large for TVM's int32 softmax"
    q, x_b = exp_parts(np.arange(-255, 1), x0)
    for top in sorted(set(q.tolist())):  # the largest q along the axis, which sets every shift
        present = q <= top
        e = x_b[present] << (top - q[present])
        lead = x0 << top  # the maximum element itself: d = 0
        largest, smallest = max(int(e.max()), 0), min(int(e.min()), 0)
        high, low = lead + (length - 1) * largest, lead + (length - 1) * smallest
        if high > INT32_MAX or low < -INT32_MAX - 1:
            return (f"int32 sum of exps can overflow in TVM's integer softmax for an axis of {length} "
                    f"(round(1 / input_scale) = {x0}, worst case {max(high, -low)})")
        if low <= 0:
            return f"sum of exps can be {low} <= 0 in TVM's integer softmax (round(1 / input_scale) = {x0})"
        if (2**30 // low) * max(largest, -smallest) > INT32_MAX:
            return f"int32 product (2^30 / sum) * exp can overflow in TVM's integer softmax (x0 = {x0})"
    return None


def x86_target_reason(target) -> str | None:
    """Softmax is reproduced (and tested) for TVM's x86 code only: the float form's in-order sum and
    libm expf, the integer form's final requantize (on aarch64 TVM may vectorize it with NEON rounding)."""
    if target is None:
        return None
    target = tvm.target.Target(target)
    triple = str(target.attrs.get("mtriple", "") or "")
    if str(target.kind) != "llvm" or (triple and not triple.startswith("x86_64")):
        return f"softmax is reproduced for x86 llvm targets only, not {target}"
    return None


def fast_math_reason() -> str | None:
    """TVM's FastMath pass (opt_level 4 or required) swaps softmax for fast_softmax and exp for fast_exp."""
    ctx = tvm.transform.PassContext.current()
    disabled = {str(p) for p in ctx.disabled_pass}
    if "FastMath" not in disabled and (ctx.opt_level >= 4 or "FastMath" in {str(p) for p in ctx.required_pass}):
        return "TVM's FastMath pass replaces nn.softmax with fast_softmax, which refcg does not reproduce"
    return None
