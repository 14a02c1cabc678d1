"""The requantize epilogue of every variant against the scalar one (refcg_requantize_one, itself exact
against TVM: test_ops_requantize.py), through tests/epilogue_harness.c: full-range int32 accumulators
with the extremes, every requantize mode and float form, per tensor and per channel, shifts across the
whole range the vector code takes (and past it: the scalar fallback), channel counts that are not
multiples of the vector width, channels in the lanes (GEMM tiles) and pixels in the lanes (plane kernels).
The AVX-VNNI variant runs the AVX2 epilogue."""
import itertools

import numpy as np
import pytest

from core_cffi import DTYPE_CODE, Core, avxvnni_as_evex
from refcodegen.numerics import MODES, FloatLowering, make_requantize

CORE = Core(harness=True, avxvnni_evex=avxvnni_as_evex())  # test_core_kernels' build: one compile
LOWERINGS = [FloatLowering(sse41, fma) for sse41 in (True, False) for fma in (True, False)]
EXTREMES = np.array([-(2**31), -(2**31) + 1, -(2**30), -65537, -1, 0, 1, 65535, 2**30, 2**31 - 2, 2**31 - 1], np.int64)
CHANNELS = [1, 3, 17, 24, 33]
TIES = 24  # rows of odd multiples of 2^j, j < TIES: exact halves under power-of-two ratios
PIXELS = 2 * len(EXTREMES) + TIES + 7  # 53: tails of 8 and 16 pixels in the plane form


def accumulators(rng, pixels, channels):
    """Full-range int32, every extreme in every channel, 16 readable values past the end."""
    acc = rng.integers(-(2**31), 2**31, size=(pixels, channels), dtype=np.int64)
    acc[: len(EXTREMES)] = EXTREMES[:, None]
    acc[len(EXTREMES) : 2 * len(EXTREMES)] = rng.integers(-(2**20), 2**20, size=(len(EXTREMES), channels))  # mostly in range
    j = np.arange(TIES)[:, None]
    odd = 2 * rng.integers(-(2**(30 - j)), 2**(30 - j), size=(TIES, channels)) + 1
    acc[2 * len(EXTREMES) : 2 * len(EXTREMES) + TIES] = odd << j
    return acc.astype(np.int32)


def scales(rng, channels, exponents):
    """Per-channel ratios 2^e * [0.5, 1): shift = e exactly, one channel per exponent in turn."""
    e = np.resize(np.array(exponents), channels)
    return (np.ldexp(rng.uniform(0.5, 1.0, channels), e)).astype(np.float32)


def cases(rng, channels):
    """(label, Requantize) for every mode: per tensor and per channel, shifts inside [-32, 63] (vector
    code) and one past it (scalar fallback), identity, clamps and zero points."""
    inside = list(range(-32, 31, 7)) + [-32, -31, -1, 0, 1, 30, 40, 63]
    for (rounding, compute), lowering in zip(MODES, itertools.cycle(LOWERINGS)):
        forms = [lowering] if compute.startswith("int64") else LOWERINGS
        for form in forms:
            def rq(scale, out_dtype="int8", zp=-5, clip=None, izp=0, out_scale=1.0):
                return make_requantize(scale, np.float32(out_scale), izp, zp, out_dtype, rounding, compute, clip,
                                       lowering=form)
            tag = f"{rounding}/{compute}/{form}"
            yield f"{tag} per-channel", rq(scales(rng, channels, inside)), "int8"
            yield f"{tag} per-channel uint8 clip", rq(scales(rng, channels, [-20, -9, -3]), "uint8", 100, (20.0, 240.0), 7), "uint8"
            yield f"{tag} per-channel int32", rq(scales(rng, channels, [-3, 0, 2, 9]), "int32", 12345), "int32"
            # zp * 2^r around 2^28, where folding the zero point into the rounding constant stops
            yield f"{tag} per-channel int32 large zp", rq(scales(rng, channels, [-7, -8, -9, -20, -28]), "int32", 2**20 + 1), "int32"
            yield f"{tag} per-tensor", rq(scales(rng, 1, [-13])[0], zp=3, izp=-9), "int8"
            yield f"{tag} per-tensor left shift", rq(scales(rng, 1, [5])[0], "int32", -77), "int32"
            yield f"{tag} identity", rq(np.float32(0.25), "int8", 4, None, 2, out_scale=0.25), "int8"
            yield f"{tag} shift -33 (past the vector range)", rq(scales(rng, channels, [-33, -5])), "int8"
            ties = np.ldexp(np.float32(0.5), np.resize(np.arange(0, -TIES - 1, -1), channels)).astype(np.float32)
            yield f"{tag} per-channel ties", rq(ties, "int32", -3), "int32"  # x * 2^e: halves at x = 2^(-e-1) mod 2^-e
            yield f"{tag} per-tensor ties", rq(np.float32(2.0**-6), "int8", 0), "int8"


@pytest.mark.parametrize("planar", [0, 1], ids=["channels-in-lanes", "pixels-in-lanes"])
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("isa", [v for v in ("avx512vnni", "avx2") if v in CORE.compiled_variants()])
def test_epilogue_bit_exact(isa, channels, planar):
    CORE.require(isa)
    rng = np.random.default_rng(channels * 2 + planar)
    acc = accumulators(rng, PIXELS, channels)
    if planar:
        acc = np.ascontiguousarray(acc.T)
    flat = np.append(acc.reshape(-1), np.zeros(16, np.int32))
    corr = rng.integers(-(2**31), 2**31, channels, dtype=np.int64).astype(np.int32)
    corr[::2] = 0  # half the channels see the raw extremes
    checked = diverse = 0
    for label, requant, out_dtype in cases(rng, channels):
        rq = CORE.requant(requant)
        outs = {}
        for variant in ("scalar", isa):
            out = np.full(flat.size, 0x5A, out_dtype)
            status = CORE.lib.refcg_harness_epilogue(variant.encode(), planar, rq, CORE.ptr(flat, "int32_t*"),
                                                     CORE.ptr(corr, "int32_t*"), PIXELS, channels,
                                                     CORE.ffi.from_buffer(out), DTYPE_CODE[out_dtype])
            assert status == 0
            outs[variant] = out
        ref = outs["scalar"]
        diverse += len(np.unique(ref[: acc.size])) >= 3  # not everything clamped to one bound
        assert np.all(ref[acc.size :] == np.array(0x5A).astype(out_dtype)), label  # nothing past the end
        bad = np.flatnonzero(outs[isa] != ref)
        assert bad.size == 0, (f"{isa} {label}: {bad.size} of {acc.size} differ, first at {bad[0]}: "
                               f"acc {flat[bad[0]]} -> {outs[isa][bad[0]]}, scalar {ref[bad[0]]}")
        checked += 1
    assert checked >= 9 * len(MODES) and diverse >= checked // 2
    CORE.release()


def test_epilogue_cases_reach_every_shift():
    """The int64 cases span the vector code's shift range [-32, 63], both signs, and one past it."""
    shifts = {s for _, rq, _ in cases(np.random.default_rng(0), 33) for s in rq.shifts
              if rq.mode == MODES["UPWARD", "int64"]}
    assert {-33, -32, -31, -1, 0, 1, 5, 30, 40, 63} <= shifts
