"""image.resize2d nearest_neighbor: the input row (column) TVM 0.19 reads for each output row (column).

topi.image.resize2d (python/tvm/topi/image/resize.py: get_inx, get_closest_index, get_2d_pixel)
computes the source coordinate in float32 TIR and rounds it:

- ``asymmetric``: ``x * s`` with s = float32(in_size) / float32(out_size); when out_size is an
  integer multiple of in_size (can_convert_multiply_to_intdiv) an integer division instead,
  whatever the rounding method;
- ``half_pixel``: ``(x + 0.5) * s - 0.5``; ``pytorch_half_pixel`` the same, or 0.0 when out_size is 1;
- ``tf_half_pixel_for_nn``: ``(x + 0.5) * s``;
- ``align_corners``: ``x * s`` with s = float32(in_size - 1) / float32(out_size - 1);

then ``round`` (llvm.round: half away from zero), ``ceil(. - 0.5)`` (round_prefer_floor),
``floor(. + 0.5)`` (round_prefer_ceil), ``floor(. + 1e-5)`` (floor), ``ceil(. - 1e-5)`` (ceil); "" is round for
align_corners, else floor. The index is clamped to the input. TIR folds float constants in float32
(arith/const_fold.h), so only one thing varies: on a target with FMA, LLVM contracts the product and
the first add after it into one rounding (``AllowFPOpFusion::Fast``, numerics.FloatLowering), except
where it has folded the coordinate to a constant first (a fully unrolled or one-iteration loop). So a
table is only certain when the fused and the unfused expression give the same one, or the target has
no FMA (``table``). Measured against TVM-only builds of int32 probes (every mode and rounding, 4058
resizes of two axes: llvm, sandybridge, skylake-avx512; NCHW and NHWC): each axis read one of the two
tables; without FMA always the unfused one; with FMA, of the 40 resizes whose tables differ, H fused and
W unfused in 34, both fused in 1, neither in 5.
"""
from __future__ import annotations

import numpy as np

MODES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "align_corners")
ROUNDINGS = ("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
EPSILON = np.float32(1e-5)  # get_closest_index's guard against GPU rounding errors
MAX_SIZE = 32768  # larger axes are not tested (and TVM's integer-division test changes far above it)


def _int_div_factor(in_size: int, out_size: int) -> int | None:
    """can_convert_multiply_to_intdiv: out_size = factor * in_size with factor not above 1 / (1e-5 * (in + 1))."""
    if out_size % in_size:
        return None
    factor = out_size // in_size
    return factor if factor <= 1 / (1e-5 * in_size + 1e-5) else None


def _fma_f32(a: np.ndarray, b: np.float32, c: np.float32) -> np.ndarray:
    """float32(a * b + c) rounded once: the product of two float32 values is exact in float64, the sum
    is rounded to odd in float64 (53 >= 2 * 24 + 2 bits), which makes rounding it to float32 correct."""
    p, c64 = a.astype(np.float64) * np.float64(b), np.float64(c)
    t = p + c64
    back = t - c64
    err = (p - back) + (c64 - (t - back))  # TwoSum: t + err == p + c exactly
    even = (t.view(np.int64) & 1) == 0
    t = np.where((err != 0) & even, np.nextafter(t, np.where(err > 0, np.inf, -np.inf)), t)
    return t.astype(np.float32)


def _round(v: np.ndarray, rounding: str) -> np.ndarray:
    v = v.astype(np.float64)
    if rounding == "round":
        return np.sign(v) * np.floor(np.abs(v) + 0.5)  # exact in float64 for float32 values
    return np.floor(v) if rounding in ("round_prefer_ceil", "floor") else np.ceil(v)


def nearest_indices(in_size: int, out_size: int, mode: str, rounding: str, fused: bool) -> np.ndarray:
    """int32 input index per output index; ``fused``: the first add after the product is an FMA."""
    x = np.arange(out_size, dtype=np.float32)
    if rounding == "":
        rounding = "round" if mode == "align_corners" else "floor"
    factor = _int_div_factor(in_size, out_size) if mode == "asymmetric" else None
    if factor is not None:
        return np.arange(out_size, dtype=np.int32) // np.int32(factor)
    rounding_add = {"round_prefer_floor": -0.5, "round_prefer_ceil": 0.5, "floor": EPSILON, "ceil": -EPSILON}
    adds = [np.float32(rounding_add[rounding])] if rounding in rounding_add else []
    if mode == "pytorch_half_pixel" and out_size == 1:
        coord = np.zeros(1, np.float32)
        for c in adds:
            coord = coord + c
    else:
        if mode == "align_corners":
            scale = np.float32(in_size - 1) / np.float32(out_size - 1)
        else:
            scale = np.float32(in_size) / np.float32(out_size)
        if mode != "asymmetric" and mode != "align_corners":
            x = x + np.float32(0.5)
        if mode in ("half_pixel", "pytorch_half_pixel"):
            adds = [np.float32(-0.5)] + adds
        if fused and adds:
            coord = _fma_f32(x, scale, adds[0])
            adds = adds[1:]
        else:
            coord = x * scale
        for c in adds:
            coord = coord + c
    return np.clip(_round(coord, rounding), 0, in_size - 1).astype(np.int32)


def reason(in_size: int, out_size: int, mode: str, rounding: str) -> str | None:
    """Why one axis of a nearest resize stays in TVM whatever the target, or None."""
    if mode not in MODES:
        return f"coordinate_transformation_mode {mode} is not supported"
    if rounding not in ROUNDINGS:
        return f"rounding_method {rounding} is not one TVM 0.19 accepts"
    if mode == "align_corners" and out_size == 1:
        return "align_corners to size 1: TVM divides by zero"
    if max(in_size, out_size) > MAX_SIZE:
        return f"an axis longer than {MAX_SIZE}"
    return None


def table(in_size: int, out_size: int, mode: str, rounding: str, fma: bool | None) -> np.ndarray | None:
    """The index table TVM-only reads for this axis, or None when it is not certain: ``fma`` is whether
    the target has FMA (None: not known). With FMA, LLVM may fuse or (constants) not: both must agree."""
    unfused = nearest_indices(in_size, out_size, mode, rounding, fused=False)
    if fma is False:
        return unfused
    return unfused if np.array_equal(unfused, nearest_indices(in_size, out_size, mode, rounding, fused=True)) else None
