"""The accelerated C core through cffi: every case on every variant compiled for this architecture
against the scalar reference (bit-exact, all requantize modes, full-range data) and the reference
against numpy. A variant the host cannot run is a skip naming the CPU features it lacks."""
import itertools
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from core_cffi import DTYPE_CODE, Binary, Conv2D, Core, Dense, avxvnni_as_evex
import fma_cases as fc
from refcodegen.numerics import MODES, FloatLowering, make_requantize, no_requantize

# every float expression form (numerics.float_form); float modes take them in turn on random data
LOWERINGS = [FloatLowering(sse41, fma) for sse41 in (True, False) for fma in (True, False)]
FMA, NO_FMA = FloatLowering(True, True), FloatLowering(True, False)


# built once per source (cached): its variants parametrize the tests (AVX-VNNI's EVEX-encoded where
# the host has AVX-512 VNNI only: core_cffi.avxvnni_as_evex)
CORE = Core(harness=True, avxvnni_evex=avxvnni_as_evex())


@pytest.fixture(scope="module")
def core():
    return CORE


@pytest.fixture(params=list(CORE.compiled_variants()))
def isa(request):
    """Every later core call of the test runs on this variant."""
    CORE.use_or_skip(request.param)
    yield request.param
    CORE.use(None)


def full_range(rng, shape, dtype):
    """Random values with whole regions at the dtype's extremes (-128/127 or 0/255)."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, size=shape)
    flat = x.reshape(-1)
    third = flat.size // 3
    flat[:third] = info.min
    flat[third : 2 * third : 2] = info.max
    return x.astype(dtype)


def numpy_conv_nhwc(x, w_ohwi, izp, kzp, stride, pad, dilation, groups):
    """int32-wrapped accumulators of qnn.conv2d in NHWC."""
    n, h, wd, c = x.shape
    o, kh, kw, cg = w_ohwi.shape
    xp = np.pad(x.astype(np.int64) - izp, ((0, 0), (pad[0], pad[2]), (pad[1], pad[3]), (0, 0)))
    oh = (xp.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (xp.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    acc = np.zeros((n, oh, ow, o), np.int64)
    og = o // groups
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i * dilation[0] : i * dilation[0] + (oh - 1) * stride[0] + 1 : stride[0],
                       j * dilation[1] : j * dilation[1] + (ow - 1) * stride[1] + 1 : stride[1], :]
            for g in range(groups):
                wg = w_ohwi[g * og : (g + 1) * og, i, j, :].astype(np.int64) - kzp
                acc[..., g * og : (g + 1) * og] += patch[..., g * cg : (g + 1) * cg] @ wg.T
    return (acc & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def split_run(core, call, tasks=3):
    """call() with every kernel's work split into ``tasks`` ranges, as that many threads split it."""
    core.tasks(tasks)
    try:
        return call()
    finally:
        core.tasks(1)


# in_c, out_c, hw, kernel, stride, pad (t, l, b, r), dilation, groups ("dw": depthwise)
SHAPES = [
    (3, 17, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (13, 37, (7, 6), (3, 2), (2, 1), (1, 0, 2, 1), (1, 1), 1),
    (64, 70, (5, 9), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # 1x1 NCHW runs pixels in the lanes (AVX-512): channels not a multiple of 4, pixel tails, 256 pixels
    (13, 20, (11, 13), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (8, 40, (16, 16), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (9, 16, (11, 10), (3, 3), (1, 2), (2, 2, 2, 2), (2, 2), 1),
    # few k-steps (AVX-512 runs them a row at a time): K = 16, 24, 32, 40, 48 over 1-4 channel blocks
    # (group tails of 1-3 blocks, channel tails), a 3x3 stride 2 over 4 channels read in place (3 segments)
    (16, 96, (7, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (24, 40, (6, 7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (32, 16, (4, 9), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (40, 144, (3, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (48, 20, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (4, 24, (9, 8), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    # ... on AVX2 every block of a row at a time: one block of 8 channels over an odd row count (rows
    # in pairs), 17 blocks (a group of 16, then one)
    (24, 8, (5, 7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (16, 272, (3, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # a 7x7 map (49 rows: 8 six-row tiles and a last row) over groups of 4 and 3 channel blocks; on AVX2
    # its last block of 8 channels in six-row tiles, as 800->24's (K in two chunks of widened weights)
    (64, 104, (7, 7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (800, 24, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # AVX2 reads the input widened once (refcg_reads_a16_avx2: more than 4 rows and 12 k-steps, as in
    # several shapes above): K in two chunks over a last block of 8 channels, a dilated conv (a segment
    # per tap)
    (800, 40, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (12, 48, (9, 10), (3, 3), (1, 2), (2, 2, 2, 2), (2, 2), 1),
    # 3 pixels (a squeeze-excite conv's few rows: AVX2's byte tiles, no widened copy), an int8 input read
    # in place and flipped (refcg_gemm_config.flips) by every x86 variant
    (96, 24, (1, 3), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # 3x3 stride 1 over whole 16-channel vectors (AVX2: Winograd F(2x2, 3x3)): odd output sides (a last
    # tile of 1 row / column) and a last block of 1 channel, uneven padding, an unpadded input read in place
    (16, 17, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (32, 40, (6, 7), (3, 3), (1, 1), (0, 1, 2, 1), (1, 1), 1),
    (48, 16, (8, 8), (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (33, 33, (9, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "dw"),
    (21, 21, (10, 13), (5, 3), (2, 2), (2, 1, 2, 1), (1, 2), "dw"),
    # depthwise on an unpadded channels-last input read in place, an int8 one flipped as the rows read it
    # (refcg_dw_config.flips): 3x3 stride 1 and 2 (rows in pairs, an odd last row), 5x5 on the row quads
    # and a 7x7 (the per-pixel kernel)
    (32, 32, (9, 10), (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), "dw"),
    (16, 16, (11, 21), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), "dw"),
    (48, 48, (9, 12), (5, 5), (1, 1), (0, 0, 0, 0), (1, 1), "dw"),
    (16, 16, (8, 9), (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), "dw"),
]


# full-range weights on every shape; weights halved (every AVX2 block pair-safe: vpmaddubsw) on three GEMM shapes
CONV_CASES = [(shape, "full") for shape in SHAPES] + [(shape, "pair_safe") for shape in SHAPES[:3]]


@pytest.mark.parametrize("shape,weights", CONV_CASES, ids=lambda c: f"c{c[0]}o{c[1]}k{c[3][0]}x{c[3][1]}g{c[7]}"
                         if isinstance(c, tuple) else c)
@pytest.mark.parametrize("layout,in_dtype", [("NHWC", "int8"), ("NCHW", "int8"), ("NHWC", "uint8"), ("NCHW", "uint8")])
def test_conv_variants_bit_exact(core, isa, shape, weights, layout, in_dtype):
    in_c, out_c, (h, w), kernel, stride, pad, dilation, groups = shape
    groups = in_c if groups == "dw" else groups
    rng = np.random.default_rng(zlib.crc32(repr((shape, layout, in_dtype)).encode()))
    x_nhwc = full_range(rng, (1, h, w, in_c), in_dtype)
    weight = full_range(rng, (out_c, *kernel, in_c // groups), "int8")
    if weights == "pair_safe":
        weight //= 2
    bias = rng.integers(-30000, 30000, out_c).astype(np.int32)
    izp = -7 if in_dtype == "int8" else 131
    x = x_nhwc if layout == "NHWC" else np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))
    common = dict(in_shape=x.shape, layout=layout, weight_ohwi=weight, strides=stride, padding=pad,
                  dilation=dilation, groups=groups, in_dtype=in_dtype, input_zp=izp)
    # the reference against numpy on raw int32 accumulators
    raw = Conv2D(core, out_dtype="int32", requant=no_requantize(), **common)
    acc = raw.run(x, fast=False)
    want = numpy_conv_nhwc(x_nhwc, weight, izp, 0, stride, pad, dilation, groups)
    assert np.array_equal(acc if layout == "NHWC" else acc.transpose(0, 2, 3, 1), want)
    assert raw.fast_data is not None
    if groups == 1:
        assert raw.fast_data.gemm.pair_safe.all() == (weights == "pair_safe")
    # every variant against the reference, for every requantize mode and both scale kinds
    cases = requant_cases(rng, want, out_c)
    for out_dtype, rq in cases:
        conv = Conv2D(core, out_dtype=out_dtype, bias=bias, requant=rq, **common)
        # groups == 1: libraries store only the packed GEMM weights; every variant (scalar too) runs it
        packed_only = Conv2D(core, out_dtype=out_dtype, bias=bias, requant=rq, reference_weights=False, **common)
        ref = conv.run(x, fast=False)
        assert len(np.unique(ref)) > 8  # the requantize does not collapse everything
        assert core.isa_name() == isa
        for run in [conv] + ([packed_only] if groups == 1 else []):
            got = run.run(x)
            assert np.array_equal(got, ref), f"{isa} {out_dtype} mode {rq.mode}: {np.abs(got - ref.astype(np.int64)).max()}"
        got = split_run(core, lambda: conv.run(x))
        assert np.array_equal(got, ref), f"{isa} {out_dtype} mode {rq.mode}, 3 ranges"
    with pytest.raises(RuntimeError):  # no weights, no reference: an error, not a crash
        packed_only.run(x, fast=False)


# Batches of convs that read a channels-last input in place (no padding, cp == in_c, the variant's
# byte domain: uint8 on x86) or through the padded copy (int8 on x86, in_c not a multiple of 4).
IN_PLACE_SHAPES = [(16, 24, (7, 5), (1, 1), (1, 1)), (8, 20, (9, 9), (1, 1), (2, 2)), (8, 12, (6, 7), (3, 3), (1, 1)),
                   (13, 9, (5, 6), (1, 1), (1, 1))]


@pytest.mark.parametrize("shape", IN_PLACE_SHAPES, ids=lambda s: f"c{s[0]}k{s[3][0]}s{s[4][0]}")
@pytest.mark.parametrize("in_dtype", ["uint8", "int8"])
def test_conv_batches_nhwc_bit_exact(core, isa, shape, in_dtype):
    in_c, out_c, (h, w), kernel, stride = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, in_dtype)).encode()))
    x = full_range(rng, (3, h, w, in_c), in_dtype)
    weight = full_range(rng, (out_c, *kernel, in_c), "int8")
    izp = -7 if in_dtype == "int8" else 131
    conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, strides=stride, in_dtype=in_dtype,
                  input_zp=izp, out_dtype="int32", requant=no_requantize(), reference_weights=False)
    want = numpy_conv_nhwc(x, weight, izp, 0, stride, (0, 0, 0, 0), (1, 1), 1)
    assert len(np.unique(want)) > 8 and not np.array_equal(want[1], want[2])
    got = conv.run(x)
    assert core.isa_name() == isa
    assert np.array_equal(got, want), f"{isa}: batch rows differ {[int(np.abs(got[n] - want[n]).max()) for n in range(3)]}"


def requant_cases(rng, want, out_c):
    """int32 out, every requantize mode (per-channel and per-tensor alternating), clipped uint8."""
    spread = 60.0 / (float(want.std()) + 1.0)  # outputs spread over ~+-100 before clamping
    cases = [("int32", no_requantize())]
    for index, (rounding, compute) in enumerate(MODES):
        per_channel = index % 2 == 0
        scale = np.asarray(rng.uniform(0.5 * spread, 1.5 * spread, out_c if per_channel else None), "float32")
        cases.append(("int8", make_requantize(scale, np.float32(1.0), 0, -5, "int8", rounding, compute,
                                              lowering=LOWERINGS[index % 4])))
    # float32 UPWARD with sse4.1, fused or not (-mcpu targets; their depthwise convs unfused): the plans the
    # kernels are copied for (REFCG_PLAN_F32_FMA, REFCG_PLAN_F32_UP), per channel
    for lowering in (FMA, NO_FMA):
        scale = np.asarray(rng.uniform(0.5 * spread, 1.5 * spread, out_c), "float32")
        cases.append(("int8", make_requantize(scale, np.float32(1.0), 0, -5, "int8", "UPWARD", "float32",
                                              lowering=lowering)))
    cases.append(("uint8", make_requantize(np.float32(spread), np.float32(1.0), 0, 100, "uint8", "UPWARD", "int64",
                                           (20.0, 240.0))))
    return cases


# channels, multiplier, hw, kernel, stride, pad (t, l, b, r), dilation: pixel tails of 16 and 8,
# 5-wide rows (two tap groups), strides 1-4 with dilation (fewer taps per lane), stride 5 and a
# 3000-pixel row (the NHWC path); 3x3 stride 2, 5x5 stride 1 and 2 (AVX-512's column-sharing NHWC
# kernels, with pixel tails); rows of 7, 5 and 3 pixels (the column kernels' last 4 pixels overlapping
# stored ones, or rows too narrow for them); a 3x3 dilated along H only (AVX-512 pairs output rows of
# undilated stride-1 3x3 kernels: this one must not)
DW_SHAPES = [
    (20, 1, (9, 37), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (7, 2, (11, 21), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    (5, 1, (8, 19), (5, 5), (1, 2), (2, 2, 2, 2), (1, 1)),
    (3, 3, (12, 17), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    (17, 1, (6, 40), (3, 7), (3, 4), (1, 3, 1, 3), (1, 3)),
    (4, 1, (7, 23), (3, 3), (2, 5), (1, 1, 1, 1), (1, 1)),
    (2, 1, (3, 3000), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (24, 1, (10, 29), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    (33, 1, (9, 26), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (18, 1, (9, 31), (5, 5), (2, 2), (2, 2, 2, 2), (2, 1)),
    (40, 1, (7, 7), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (16, 1, (6, 5), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (24, 1, (5, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (16, 1, (9, 12), (3, 3), (1, 1), (2, 1, 2, 1), (2, 1)),
    # an input past 256 KB: AVX2 runs its rows in chunks that stay in L1, each over every channel group
    # (16: 7-row chunks; 264 stride 2: one row a chunk, 33 channel groups = a batch of 32 and one)
    (16, 1, (100, 200), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (264, 1, (40, 30), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
]


@pytest.mark.parametrize("shape", DW_SHAPES, ids=lambda s: f"c{s[0]}m{s[1]}w{s[2][1]}k{s[3][1]}s{s[4][1]}d{s[6][1]}")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
def test_depthwise_variants_bit_exact(core, isa, shape, layout, in_dtype):
    """Depthwise on full-range data, every variant against the reference and numpy: the plane
    kernels (NCHW) and the channel kernels (NHWC), channel multipliers on the plane kernels."""
    from refcodegen.packing import pack_conv2d_fast

    c, mult, (h, w), kernel, stride, pad, dilation = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, layout, in_dtype)).encode()))
    x_nhwc = full_range(rng, (1, h, w, c), in_dtype)
    weight = full_range(rng, (c * mult, *kernel, 1), "int8")
    bias = rng.integers(-30000, 30000, c * mult).astype(np.int32)
    izp = -128 if in_dtype == "int8" else 255
    x = x_nhwc if layout == "NHWC" else np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))
    common = dict(in_shape=x.shape, layout=layout, weight_ohwi=weight, strides=stride, padding=pad,
                  dilation=dilation, groups=c, in_dtype=in_dtype, input_zp=izp)
    want = numpy_conv_nhwc(x_nhwc, weight, izp, 0, stride, pad, dilation, c)
    for out_dtype, rq in requant_cases(rng, want, c * mult):
        conv = Conv2D(core, out_dtype=out_dtype, bias=bias, requant=rq, **common)
        if mult > 1:  # the depthwise packing read with one input channel per output channel
            params = {key: getattr(conv.p, key) for key in ("kernel_zp", "input_zp", "groups")}
            conv.f = core.conv_fast(pack_conv2d_fast(weight, dict(params, groups=c * mult, in_c=c * mult), in_dtype, bias))
        ref = conv.run(x, fast=False)
        if out_dtype == "int32":
            biased = ((want.astype(np.int64) + bias) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
            assert np.array_equal(ref if layout == "NHWC" else ref.transpose(0, 2, 3, 1), biased)
        got = conv.run(x)
        assert np.array_equal(got, ref), f"{isa} {out_dtype} mode {rq.mode}: {np.abs(got - ref.astype(np.int64)).max()}"
        assert np.array_equal(split_run(core, lambda: conv.run(x)), ref), f"{isa} {out_dtype} mode {rq.mode}, 3 ranges"
        if layout == "NHWC":  # the channel kernels' weight layouts built per call, as for direct C callers
            conv.f = core.conv_fast(conv.fast_data, layouts=False)
            built = conv.run(x)
            assert np.array_equal(built, ref), f"{isa} {out_dtype} layouts built per call: {np.abs(built - ref.astype(np.int64)).max()}"


def alloc_failure_outcomes(core, conv, x, ref, masks) -> dict:
    """Per mask of workspace allocations made to fail (bit i: the i-th of the call), what a 3-range run
    of conv gives: "exact", "wrong", the error, or that fewer allocations were made."""
    outcomes = {}
    for mask in masks:
        core.fail_alloc(mask)
        try:
            got = split_run(core, lambda: conv.run(x, out=np.zeros(conv.out_shape, conv.out_dtype)))
            outcome = "exact" if np.array_equal(got, ref) else "wrong"
        except RuntimeError as e:
            outcome = str(e)
        made = core.fail_alloc(0)
        outcomes[mask] = outcome if mask & ((1 << made) - 1) else f"no failure in {made} allocations"
    return outcomes


def test_depthwise_workspace_failures(core, isa):
    """Each workspace allocation of a depthwise call (3 ranges: each pads its own rows into a buffer
    of its own) failing in turn: a range's buffer -> the whole call again through one padded copy,
    exact; that copy's too -> the call reports -2. Never a wrong answer."""
    rng = np.random.default_rng(11)
    x = full_range(rng, (1, 13, 11, 40), "uint8")
    weight = full_range(rng, (40, 3, 3, 1), "int8")
    want = numpy_conv_nhwc(x, weight, 255, 0, (1, 1), (1, 1, 1, 1), (1, 1), 40)
    (out_dtype, rq), *_ = requant_cases(rng, want, 40)
    conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), groups=40,
                  in_dtype="uint8", input_zp=255, out_dtype=out_dtype, requant=rq)
    ref = conv.run(x, fast=False)
    # one range's buffer; with the copy after it (4 allocations)
    outcomes = alloc_failure_outcomes(core, conv, x, ref, (1, 2, 4, 1 | 8, 2 | 8))
    if isa == "scalar":  # the scalar variant runs the reference: no workspace
        assert set(outcomes.values()) == {"no failure in 0 allocations"}, outcomes
    else:
        assert outcomes == {1: "exact", 2: "exact", 4: "exact", 9: "refcg conv2d returned -2",
                            10: "refcg conv2d returned -2"}, outcomes


def test_conv_workspace_failures(core, isa):
    """A conv over a padded copy whose AVX2 tiles read the input widened to 16 bits (refcg_gemm_job.a16,
    the second allocation): that buffer failing -> the tiles that widen per row and k-step, exact; the
    padded copy failing -> the call reports -2. Never a wrong answer."""
    rng = np.random.default_rng(12)
    x = full_range(rng, (1, 9, 10, 64), "uint8")
    weight = full_range(rng, (48, 3, 3, 64), "int8")
    want = numpy_conv_nhwc(x, weight, 131, 0, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    (out_dtype, rq), *_ = requant_cases(rng, want, 48)
    conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, strides=(2, 2), padding=(1, 1, 1, 1),
                  in_dtype="uint8", input_zp=131, out_dtype=out_dtype, requant=rq)
    ref = conv.run(x, fast=False)
    outcomes = alloc_failure_outcomes(core, conv, x, ref, (1, 2))
    if isa == "scalar":  # the reference: no workspace
        assert set(outcomes.values()) == {"no failure in 0 allocations"}, outcomes
    else:
        widened = "exact" if isa == "avx2" else "no failure in 1 allocations"
        assert outcomes == {1: "refcg conv2d returned -2", 2: widened}, outcomes


def run_binary(core, op, x, y, out_dtype, rq_a, rq_b, zps, out_range, reference):
    """refcg_binary (or refcg_binary_ref) with numpy broadcasting of x and y."""
    return Binary(core, op, x.shape, y.shape, x.dtype, y.dtype, out_dtype, rq_a, rq_b, zps, out_range).run(x, y, reference)


# a shape, b shape: residual add, channel broadcast (NCHW and NHWC), a scalar, a row tail of 37,
# rows longer than a 4096-element chunk; short rows broadcast over enough rows to be widened (b's, a's),
# with rows left over
BINARY_SHAPES = [((1, 16, 7, 9), (1, 16, 7, 9)), ((1, 5, 3, 37), (1, 5, 1, 1)), ((2, 3, 4, 21), (21,)),
                 ((1, 1), (3, 1, 1, 1)), ((4, 33), (4, 1)), ((3, 4500), (4500,)),
                 ((1, 50, 40, 24), (1, 1, 1, 24)), ((1, 1, 40), (33, 11, 40))]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_binary_variants_bit_exact(core, isa, shapes, op):
    """qnn.add/subtract/mul on full-range int8 x uint8 data, every requantize mode, every variant
    against the reference; the identity-scale add against numpy."""
    rng = np.random.default_rng(zlib.crc32(repr((shapes, op)).encode()))
    x, y = full_range(rng, shapes[0], "int8"), full_range(rng, shapes[1], "uint8")
    zps, out_range = (-3, 131, 7), (-128, 127)
    # add/sub scales in int64 UPWARD: 0.3 and 0.2 shift right only (the plan); 0.7, 1.7 and 0.6 shift left
    # first (l1 = 1, 2, 1), which x86 moves before the multiply (refcg_bin_preshift) up to l1 = 21 (2^20),
    # past it (2^21: l1 = 22) the general path
    cases = [(rounding, compute, (0.7, 0.45)) for rounding, compute in MODES]
    if op != "mul":  # mul reads neither scale
        cases += [("UPWARD", "int64", scales) for scales in ((0.3, 0.2), (1.7, 0.6), (2.0**20, 0.3), (2.0**21, 0.3))]
        # ratios off simple fractions, whose 8-bit operands x86 requantizes in 32 bits (refcg_rq32: the
        # ratios above land near rounding steps and keep the int64 form), in every mode
        cases += [(rounding, compute, (0.4728913, 0.3196284)) for rounding, compute in MODES]
    for rounding, compute, (sa, sb) in cases:
        if op == "mul":
            rq_a = rq_b = make_requantize(np.float32(0.002), np.float32(1.0), 0, zps[2], "int8", rounding, compute)
        else:
            rq_a = make_requantize(np.float32(sa), np.float32(1.0), zps[0], zps[2], "int32", rounding, compute)
            rq_b = make_requantize(np.float32(sb), np.float32(1.0), zps[1], zps[2], "int32", rounding, compute)
        ref = run_binary(core, op, x, y, "int8", rq_a, rq_b, zps, out_range, reference=True)
        if max(sa, sb) < 1:  # the requantize does not collapse everything (larger scales saturate more)
            assert len(np.unique(ref)) > min(8, ref.size - 1)
        got = run_binary(core, op, x, y, "int8", rq_a, rq_b, zps, out_range, reference=False)
        assert np.array_equal(got, ref), f"{isa} mode {rq_a.mode}: {np.abs(got - ref.astype(np.int64)).max()}"
    # a C caller's operand requantize that clamps (add/sub: to int8, which |x - zp| * 1.5 passes; mul: a
    # clip inside the int8 range, p's out range left wide): the vector kernels clamp as the reference does
    if op == "mul":
        rq_a = rq_b = make_requantize(np.float32(0.002), np.float32(1.0), 0, zps[2], "int8", "UPWARD", "int64", (0, 100))
    else:
        rq_a = make_requantize(np.float32(1.5), np.float32(1.0), zps[0], zps[2], "int8", "UPWARD", "int64")
        rq_b = make_requantize(np.float32(1.2), np.float32(1.0), zps[1], zps[2], "int8", "UPWARD", "int64")
    ref = run_binary(core, op, x, y, "int8", rq_a, rq_b, zps, out_range, reference=True)
    assert ref.size < 16 or len(np.unique(ref)) > 4
    assert np.array_equal(run_binary(core, op, x, y, "int8", rq_a, rq_b, zps, out_range, False), ref), f"{isa} clamped operands"
    if op == "add":  # equal scales: TVM skips the multiplies, a plain integer sum
        same = make_requantize(np.float32(1.0), np.float32(1.0), zps[0], zps[2], "int32", "UPWARD", "int64")
        same_b = make_requantize(np.float32(1.0), np.float32(1.0), zps[1], zps[2], "int32", "UPWARD", "int64")
        want = np.clip(x.astype(np.int64) - zps[0] + y.astype(np.int64) - zps[1] + zps[2], *out_range)
        assert np.array_equal(run_binary(core, op, x, y, "int8", same, same_b, zps, out_range, False), want), isa


def run_requantize(core, x, out_dtype, rq, out_channels, offset, reference):
    """refcg_requantize (or _ref) of x viewed as [outer][channels][inner] into channels [offset, offset +
    channels) of an output with out_channels along axis 1 (a concatenation's slab); the rest keeps 77."""
    outer, channels, inner = x.shape
    p = core.ffi.new("refcg_requantize_params*")
    p.outer, p.channels, p.inner = outer, channels, inner
    p.out_outer_stride, p.out_offset = out_channels * inner, offset * inner
    p.in_dtype, p.out_dtype = DTYPE_CODE[str(x.dtype)], DTYPE_CODE[out_dtype]
    p.rq = core.requant(rq)[0]
    out = np.full((outer, out_channels, inner), 77, out_dtype)
    fn = core.lib.refcg_requantize_ref if reference else core.lib.refcg_requantize
    assert fn(p, core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
    return out


# [outer][channels][inner], output channels, offset: NHWC concatenation slabs (inner 1, short rows: under
# 8, 8-16, 16-32, 32-64: the steps of each variant and their last step again), NCHW slabs (a row tail of
# 37; rows past a 4096-element chunk), the whole output (one merged row)
REQUANTIZE_SHAPES = [((49, 24, 1), 40, 16), ((40, 5, 1), 12, 7), ((25, 13, 1), 20, 0), ((9, 40, 1), 41, 1),
                     ((2, 3, 37), 5, 1), ((1, 2, 4500), 3, 0), ((7, 33, 5), 33, 0)]


@pytest.mark.parametrize("shape, out_channels, offset", REQUANTIZE_SHAPES, ids=lambda v: str(v))
def test_requantize_variants_bit_exact(core, isa, shape, out_channels, offset):
    """qnn.requantize / a concatenation's part on full-range 8-bit data, every mode, scales shifting
    right (0.3) and left first (0.7, 1.7, 2^20: refcg_bin_preshift), int8 and uint8 both sides, a clip;
    int32 inputs (a mean's) on the full range with a third of small values, scales down to 0.003:
    every variant against the reference, the output outside the slab untouched."""
    rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
    checked = 0
    for (rounding, compute), scale, (in_dt, out_dt) in itertools.product(
            MODES, (0.003, 0.3, 0.7, 1.7, 2.0**20),
            (("int8", "uint8"), ("uint8", "int8"), ("uint8", "uint8"), ("int32", "int8"), ("int32", "uint8"))):
        x = full_range(rng, shape, in_dt)
        if in_dt == "int32":
            x.reshape(-1)[1::3] = rng.integers(-40000, 40000, x.reshape(-1)[1::3].size)
        clip = (-100.0, 90.0) if out_dt == "int8" else None
        izp = {"int8": -3, "uint8": 131, "int32": -117}[in_dt]
        rq = make_requantize(np.float32(scale), np.float32(1.0), izp, 7, out_dt, rounding, compute, clip)
        ref = run_requantize(core, x, out_dt, rq, out_channels, offset, reference=True)
        got = run_requantize(core, x, out_dt, rq, out_channels, offset, reference=False)
        assert np.array_equal(got, ref), f"{isa} mode {rq.mode} scale {scale} {in_dt}->{out_dt}"
        checked += scale < 1 and len(np.unique(ref[:, offset:offset + shape[1]])) > 8
    assert checked >= len(MODES)  # the requantize does not collapse everything


@pytest.mark.parametrize("n", [40, 13, 100])
def test_requantize_in_place(core, isa, n):
    """refcg_requantize with the output on the input (a C caller's in-place requantize, rows whose tails
    the vector steps would store as a last full step again): the reference's result."""
    rng = np.random.default_rng(n)
    x = full_range(rng, (3, n, 1), "uint8")
    rq = make_requantize(np.float32(0.37), np.float32(1.0), 131, 7, "uint8", "UPWARD", "int64")
    want = run_requantize(core, x, "uint8", rq, n, 0, reference=True)
    p = core.ffi.new("refcg_requantize_params*")
    p.outer, p.channels, p.inner, p.out_outer_stride = 3, n, 1, n
    p.in_dtype = p.out_dtype = DTYPE_CODE["uint8"]
    p.rq = core.requant(rq)[0]
    buf = x.copy()
    assert core.lib.refcg_requantize(p, core.ffi.from_buffer(buf), core.ffi.from_buffer(buf)) == 0
    assert np.array_equal(buf, want), isa


@pytest.mark.parametrize("size", [1, 63, 64, 65, 103, 4096 + 200])
def test_lut_variants_bit_exact(core, isa, size):
    """refcg_lut against numpy's table lookup on every byte value: tails of a 64-byte step (103: 64, 32,
    then 7 bytes), a second 4096-byte chunk; the bytes past the tensor untouched."""
    rng = np.random.default_rng(size)
    table = rng.integers(0, 256, 256).astype("uint8")
    x = rng.integers(0, 256, size).astype("uint8")
    x[: min(size, 256)] = np.arange(min(size, 256))  # every index where the size allows
    p = core.ffi.new("refcg_lut_params*")
    p.size = size
    out = np.full(size + 64, 7, "uint8")
    assert core.lib.refcg_lut(p, core.ffi.from_buffer(table), core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
    assert np.array_equal(out[:size], table[x]), isa
    assert np.all(out[size:] == 7)


# rows, row length, output row stride: a halo's rows (a 4096-byte chunk and a tail per row), one row
@pytest.mark.parametrize("rows,row_len,stride", [(3, 4200, 4296), (7, 96, 160), (1, 100, 100)])
@pytest.mark.parametrize("out_xor", [0, 0x80])
def test_lut_writes_rows_apart(core, isa, rows, row_len, stride, out_xor):
    """refcg_lut into rows out_row_stride apart (a tensor inside a halo), the table's entries ^ out_xor
    (an int8 result stored flipped): the gaps between rows untouched; bad row parameters rejected."""
    rng = np.random.default_rng(rows * row_len + out_xor)
    table = rng.integers(0, 256, 256).astype("uint8")
    x = rng.integers(0, 256, rows * row_len).astype("uint8")
    p = core.ffi.new("refcg_lut_params*")
    p.size, p.row_len, p.out_row_stride, p.out_xor = x.size, row_len, stride, out_xor
    want = np.full((rows, stride), 7, "uint8")
    want[:, :row_len] = (table ^ out_xor)[x].reshape(rows, row_len)
    for fn in (core.lib.refcg_lut, core.lib.refcg_lut_ref):
        out = np.full(rows * stride, 7, "uint8")
        assert fn(p, core.ffi.from_buffer(table), core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
        assert np.array_equal(out.reshape(rows, stride), want), isa
    for bad in [dict(row_len=row_len + 1 if rows > 1 else 0), dict(out_row_stride=row_len - 1)]:
        q = core.ffi.new("refcg_lut_params*", {"size": x.size, "row_len": row_len, "out_row_stride": stride, **bad})
        for fn in (core.lib.refcg_lut, core.lib.refcg_lut_ref):
            assert fn(q, core.ffi.from_buffer(table), core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == -1


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_lut_binary_variants_bit_exact(core, isa, op):
    """refcg_lut_binary (a binary op of x and table[x] as one table) against the lookup then the binary
    reference kernel, both operand orders, int8 x with a uint8 table; a wrong-shaped op is rejected."""
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    x = full_range(rng, (4099,), "int8")
    table = rng.integers(0, 256, 256).astype("uint8")
    rq = make_requantize(np.float32(0.7), np.float32(1.0), -3, 7, "int32", "UPWARD", "int64")
    if op == "mul":
        rq = make_requantize(np.float32(0.002), np.float32(1.0), 0, 7, "int8", "UPWARD", "int64")
    looked_up = table[x.view("uint8")]
    for table_first in (0, 1):
        a, b = (looked_up, x) if table_first else (x, looked_up)
        want = run_binary(core, op, a, b, "int8", rq, rq, (-3, 131, 7), (-128, 127), reference=True)
        values, entries = np.arange(256, dtype="uint8").view("int8"), table
        every = run_binary(core, op, *((entries, values) if table_first else (values, entries)), "int8", rq, rq,
                           (-3, 131, 7), (-128, 127), reference=True)
        assert len(np.unique(every)) > 8  # the op does not collapse to a constant
        p = core.ffi.new("refcg_lut_binary_params*")
        binary = core.ffi.new("refcg_binary_params*")
        p.lut.size, p.binary, p.table_first = x.size, binary, table_first
        binary.op = {"add": core.lib.REFCG_BIN_ADD, "sub": core.lib.REFCG_BIN_SUB, "mul": core.lib.REFCG_BIN_MUL}[op]
        binary.ndim, binary.shape[0], binary.a_stride[0], binary.b_stride[0] = 1, 256, 1, 1
        binary.a_dtype = DTYPE_CODE["uint8" if table_first else "int8"]
        binary.b_dtype = DTYPE_CODE["int8" if table_first else "uint8"]
        binary.out_dtype = DTYPE_CODE["int8"]
        binary.a_zp, binary.b_zp, binary.out_zp = -3, 131, 7
        binary.out_min, binary.out_max = -128, 127
        rq_struct = core.requant(rq)
        binary.rq_a = binary.rq_b = rq_struct[0]
        for fn in (core.lib.refcg_lut_binary, core.lib.refcg_lut_binary_ref):
            out = np.full(x.size + 64, 5, "int8")
            assert fn(p, core.ffi.from_buffer(table), core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
            assert np.array_equal(out[:x.size], want), f"{isa} table_first={table_first}"
            assert np.all(out[x.size:] == 5)
        binary.shape[0] = 255
        assert core.lib.refcg_lut_binary(p, core.ffi.from_buffer(table), core.ffi.from_buffer(x),
                                         core.ffi.from_buffer(out)) == -1


def numpy_pool_nchw(x, kernel, stride, pad, dilation, out_hw, is_avg, include_pad):
    """topi's pool on NCHW: max over the taps inside the input, or the int32 sum / count truncated."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, *out_hw), np.int64)
    for oh in range(out_hw[0]):
        for ow in range(out_hw[1]):
            rows = [oh * stride[0] - pad[0] + k * dilation[0] for k in range(kernel[0])]
            cols = [ow * stride[1] - pad[1] + k * dilation[1] for k in range(kernel[1])]
            inside_r, inside_c = [r for r in rows if 0 <= r < h], [q for q in cols if 0 <= q < w]
            taps = x[:, :, inside_r][:, :, :, inside_c].astype(np.int64).reshape(n, c, -1)
            if not is_avg:
                out[:, :, oh, ow] = taps.max(axis=2) if taps.shape[2] else np.iinfo(x.dtype).min
                continue
            if include_pad:
                count = sum(r < h + pad[2] for r in rows) * sum(q < w + pad[3] for q in cols)
            else:
                count = len(inside_r) * len(inside_c)
            total = taps.sum(axis=2)
            out[:, :, oh, ow] = np.trunc(total / max(count, 1)).astype(np.int64)
    return out


# channels, hw, kernel, stride, pad (t, l, b, r), dilation, out hw (None: floor mode, else ceil mode)
POOL_SHAPES = [
    (5, (13, 37), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), None),
    (3, (9, 20), (2, 3), (1, 3), (0, 2, 1, 2), (2, 1), None),
    (4, (10, 11), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), (5, 5)),  # ceil mode: taps past the padding
    (6, (7, 7), (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), None),  # global
    (300, (5, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), None),  # channels past a 256-channel block
    (48, (9, 10), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), None),  # Inception's averages: whole vector steps
    (24, (6, 7), (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), None),  # a 16-channel step and a tail of 8
    (17, (5, 6), (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), None),  # a tail of 1: AVX2's last 16 channels again
]


def run_pool(core, isa, x, shape, kind, layouts):
    """x (NCHW) pooled by the reference and by isa's variant in layouts, each checked against numpy."""
    c, (h, w), kernel, stride, pad, dilation, out_hw = shape
    if out_hw is None:
        out_hw = tuple((size + pad[i] + pad[i + 2] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                       for i, size in enumerate((h, w)))
    in_dtype = str(x.dtype)
    out_dtype = "int32" if kind == "avg_int32" else in_dtype
    is_avg, include_pad = int(kind != "max"), int(kind == "avg_pad")
    p = core.ffi.new("refcg_pool2d_params*")
    values = dict(batch=2, in_h=h, in_w=w, channels=c, out_h=out_hw[0], out_w=out_hw[1], kernel_h=kernel[0],
                  kernel_w=kernel[1], stride_h=stride[0], stride_w=stride[1], dilation_h=dilation[0],
                  dilation_w=dilation[1], pad_top=pad[0], pad_left=pad[1], pad_bottom=pad[2], pad_right=pad[3],
                  is_avg=is_avg, count_include_pad=include_pad, in_dtype=DTYPE_CODE[in_dtype],
                  out_dtype=DTYPE_CODE[out_dtype])
    for key, value in values.items():
        setattr(p, key, value)
    in_layout, out_layout = (layouts + ">" + layouts).split(">")[:2]
    planar = lambda hw: [c * hw[0] * hw[1], hw[1], 1, hw[0] * hw[1]]  # strides of n, h, w, c
    last = lambda hw: [c * hw[0] * hw[1], hw[1] * c, c, 1]
    p.in_stride = planar((h, w)) if in_layout == "NCHW" else last((h, w))
    p.out_stride = planar(out_hw) if out_layout == "NCHW" else last(out_hw)
    x_in = x if in_layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    want = numpy_pool_nchw(x, kernel, stride, pad, dilation, out_hw, is_avg, include_pad)
    for name, fn in [("reference", core.lib.refcg_pool2d_ref), (isa, core.lib.refcg_pool2d)]:
        out = np.full((2, c, *out_hw) if out_layout == "NCHW" else (2, *out_hw, c), 99, out_dtype)
        assert fn(p, core.ffi.from_buffer(x_in), core.ffi.from_buffer(out)) == 0
        got = out if out_layout == "NCHW" else out.transpose(0, 3, 1, 2)
        assert np.array_equal(got, want), f"{name}: {np.abs(got - want).max()}"


@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: f"c{s[0]}w{s[1][1]}k{s[2][1]}s{s[3][1]}")
@pytest.mark.parametrize("kind", ["max", "avg", "avg_pad", "avg_int32"])
@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
@pytest.mark.parametrize("layouts", ["NCHW", "NHWC", "NHWC>NCHW"])
def test_pool_variants_bit_exact(core, isa, shape, kind, in_dtype, layouts):
    """Every pool kind and variant against numpy: planes (NCHW), channels last (NHWC) and a
    channels-last input written as planes (the layout planner's change at a partition's end)."""
    c, (h, w) = shape[:2]
    rng = np.random.default_rng(zlib.crc32(repr((shape, kind, in_dtype)).encode()))
    run_pool(core, isa, full_range(rng, (2, c, h, w), in_dtype), shape, kind, layouts)


@pytest.mark.parametrize("taps", [(8, 16), (9, 15)], ids=["128taps", "135taps"])
@pytest.mark.parametrize("value", [-128, 127, 255])
@pytest.mark.parametrize("kind", ["avg", "avg_int32"])
def test_pool_average_at_the_int16_sum_limit(core, isa, taps, value, kind):
    """Channels-last averages of constant extremes: 128 taps of 255 (or -128) are the most the vector
    kernels sum in int16 lanes; 135 taps take the int32 path."""
    dtype = "int8" if value <= 127 else "uint8"
    shape = (40, (17, 16), taps, (1, 1), (0, 0, 0, 0), (1, 1), None)
    run_pool(core, isa, np.full((2, 40, 17, 16), value, dtype), shape, kind, "NHWC")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_pool_average_of_equal_taps_is_exact(core, isa, dtype):
    """Every divisor the vector kernels take (1 .. 128 taps) and every byte value: d equal taps average to
    the value itself, the quotients a float reciprocal rounds just below an integer if anything does."""
    values = np.arange(256, dtype=np.int64) - (128 if dtype == "int8" else 0)
    for d in range(1, 129):
        x = np.broadcast_to(values.astype(dtype).reshape(1, 256, 1, 1), (2, 256, 1, d))
        run_pool(core, isa, np.ascontiguousarray(x), (256, (1, d), (1, d), (1, 1), (0, 0, 0, 0), (1, 1), None), "avg",
                 "NHWC")


# outer, reduce, inner, input dtype, output dtype, mean: a global average pool of NHWC and of NCHW
# (a contiguous run), chunk tails (inner 600 = 2 x 256 + 88), int32 sums that wrap, narrowing casts;
# short inner axes whose rows add as wide rows (24: 10 rows per wide row, 5 left over; 100 and 7);
# 8-bit rows of 150 and 225 lanes (the variants' register blocks of 64 / 32 and 8 lanes, then the tails)
REDUCE_CASES = [
    (1, 49, 1280, "int8", "int8", 1), (3, 49, 1, "uint8", "int32", 0), (2, 30, 600, "int16", "int16", 1),
    (2, 5, 300, "int32", "int8", 1), (4, 3, 1, "int32", "int32", 0), (5, 1, 17, "uint8", "uint8", 1),
    (2, 785, 24, "int8", "int8", 1), (1, 3000, 100, "int16", "int32", 0), (1, 999, 7, "int32", "int32", 0),
    (2, 37, 150, "uint8", "int32", 1), (1, 64, 45, "int8", "int32", 0), (1, 3136, 144, "int8", "int32", 1),
]


@pytest.mark.parametrize("case", REDUCE_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{'mean' if c[5] else 'sum'}")
def test_reduce_matches_numpy(core, isa, case):
    """refcg_reduce and refcg_reduce_ref: the int32 sum wrapping, the mean truncating toward zero, the
    output cast wrapping (numpy's astype)."""
    outer, reduce, inner, in_dtype, out_dtype, mean = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = full_range(rng, (outer, reduce, inner), in_dtype)
    total = x.astype(np.int64).sum(axis=1)
    total = (total + 2**31) % 2**32 - 2**31  # int32 wrap
    if mean:
        total = np.sign(total) * (np.abs(total) // reduce)
    want = total.astype(out_dtype)
    p = core.ffi.new("refcg_reduce_params*")
    p.outer, p.reduce, p.inner, p.is_mean = outer, reduce, inner, mean
    p.in_dtype, p.out_dtype = DTYPE_CODE[in_dtype], DTYPE_CODE[out_dtype]
    for fn in (core.lib.refcg_reduce_ref, core.lib.refcg_reduce):
        out = np.full((outer, inner), 7, out_dtype)
        assert fn(p, core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
        assert np.array_equal(out, want)


@pytest.mark.parametrize("layout,dtype", [("NCHW", "int8"), ("NHWC", "uint8"), ("NHWC", "int16")])
def test_copy_gather_matches_numpy(core, layout, dtype):
    """refcg_copy_ref with index tables on H and W (a nearest resize; duplicated, skipped and reversed
    indices) and none on the other axes, with a clamp: numpy's fancy indexing."""
    rng = np.random.default_rng(zlib.crc32(repr((layout, dtype)).encode()))
    h_axis, w_axis = layout.index("H"), layout.index("W")
    shape = [2, 3, 5, 7] if layout == "NCHW" else [2, 5, 7, 3]
    x = full_range(rng, shape, dtype)
    take_h, take_w = np.array([4, 0, 0, 2, 3, 3, 1, 4, 4], np.int32), rng.integers(0, 7, 11).astype(np.int32)
    out_shape = list(shape)
    out_shape[h_axis], out_shape[w_axis] = len(take_h), len(take_w)
    p = core.ffi.new("refcg_copy_params*")
    p.ndim, p.out_shape, p.in_shape = 4, out_shape, shape
    p.in_stride = [int(np.prod(shape[k + 1:])) for k in range(4)]
    p.in_dtype = p.out_dtype = DTYPE_CODE[dtype]
    p.lo, p.hi = -100, 200
    p.take[h_axis], p.take[w_axis] = core.ptr(take_h, "int32_t*"), core.ptr(take_w, "int32_t*")
    out = np.zeros(out_shape, dtype)
    assert core.lib.refcg_copy_ref(p, core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
    want = np.take(np.take(x, take_h, axis=h_axis), take_w, axis=w_axis)
    assert np.array_equal(out, np.clip(want, -100, 200).astype(dtype))


# (outer shape, input row length, output table): the row lengths around the 64-byte chunks and 128-byte
# windows of the permute kernel, up to its limit and one past it (the reference then)
GATHER_CASES = [((5, 7), 116, "shuffle"), ((3, 4), 58, "shuffle"), ((2, 9), 232, "shuffle"), ((7, 7), 464, "shuffle"),
                ((2, 3), 1024, "shuffle"), ((2, 3), 1025, "shuffle"), ((4, 3), 200, 300), ((70,), 129, 64),
                ((3, 2), 7, 130)]


def gather_case(case):
    """(input, refcg_copy_params fields but the table, table, want) of a GATHER_CASES case: the table
    on the last axis of a strided, offset view of a larger uint8 tensor."""
    outer, size, table = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    if table == "shuffle":  # groups of 2: (2, size / 2) transposed
        take = np.arange(size - size % 2).reshape(2, -1).T.reshape(-1).astype(np.int32)
    else:
        take = rng.integers(0, size, table).astype(np.int32)
    big = full_range(rng, (*[d + 1 for d in outer], size + 3), "uint8")
    view = big[(*[slice(1, None)] * len(outer), slice(2, 2 + size))]  # starts at offset, outer strides larger
    values = dict(ndim=len(outer) + 1, out_shape=[*outer, take.size], in_shape=[*outer, size],
                  in_stride=[s // big.itemsize for s in big.strides], offset=(view.ctypes.data - big.ctypes.data) // big.itemsize,
                  in_dtype=DTYPE_CODE["uint8"], out_dtype=DTYPE_CODE["uint8"], lo=0, hi=255)
    return big, values, take, view[..., take]


@pytest.mark.parametrize("case", GATHER_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_copy_gather_variants_bit_exact(core, isa, case):
    """refcg_copy with an index table on the last axis of an 8-bit tensor read from a strided, offset
    view of a larger one (a channel shuffle of NHWC pixels; random tables with repeats, more outputs than
    inputs): numpy's indexing on every variant; the bytes past the output untouched."""
    big, values, take, want = gather_case(case)
    p = core.ffi.new("refcg_copy_params*", values)
    p.take[values["ndim"] - 1] = core.ptr(take, "int32_t*")
    for fn in (core.lib.refcg_copy, core.lib.refcg_copy_ref):
        out = np.full(want.size + 64, 9, "uint8")
        assert fn(p, core.ffi.from_buffer(big), core.ffi.from_buffer(out)) == 0
        assert np.array_equal(out[:want.size].reshape(want.shape), want), (isa, fn)
        assert np.all(out[want.size:] == 9)


def test_copy_views_match_the_header_formula(core):
    """refcg_copy_ref on random views (1-4 axes; strides, offset, padding on either side, index tables,
    casts, clamps) against refcg.h's formula evaluated element by element in Python."""
    rng = np.random.default_rng(17)
    codes = {code: name for name, code in DTYPE_CODE.items()}
    for case in range(200):
        ndim = int(rng.integers(1, 5))
        in_shape = [int(v) for v in rng.integers(1, 6, ndim)]
        in_dtype, out_dtype = (["int8", "uint8", "int16", "int32"][i] for i in rng.integers(0, 4, 2))
        if rng.integers(2):
            out_dtype = in_dtype
        pad = [int(v) for v in rng.integers(0, 3, ndim) * rng.integers(0, 2, ndim)]
        out_shape = [d + b + int(rng.integers(0, 3)) * int(rng.integers(0, 2)) for d, b in zip(in_shape, pad)]
        takes = [rng.integers(0, d, o).astype(np.int32) if rng.integers(3) == 0 else None
                 for d, o in zip(in_shape, out_shape)]
        order = rng.permutation(ndim)  # the input read transposed, from an offset into a larger buffer
        stride = [0] * ndim
        for rank, k in enumerate(order):
            stride[k] = int(np.prod([in_shape[a] for a in order[rank + 1:]]))
        offset = int(rng.integers(0, 4))
        x = full_range(rng, [offset + int(np.prod(in_shape)) + 3], in_dtype)
        lo, hi = np.iinfo(out_dtype).min, np.iinfo(out_dtype).max
        if rng.integers(2):
            lo, hi = sorted(int(v) for v in rng.integers(-100, 200, 2))
        pad_value = int(rng.integers(-50, 50))
        p = core.ffi.new("refcg_copy_params*")
        p.ndim, p.out_shape, p.in_shape, p.in_stride, p.pad_before = ndim, out_shape, in_shape, stride, pad
        p.offset = offset
        p.in_dtype, p.out_dtype, p.lo, p.hi, p.pad_value = DTYPE_CODE[in_dtype], DTYPE_CODE[out_dtype], lo, hi, pad_value
        for k, take in enumerate(takes):
            if take is not None:
                p.take[k] = core.ptr(take, "int32_t*")
        out = np.zeros(out_shape, out_dtype)
        assert core.lib.refcg_copy_ref(p, core.ffi.from_buffer(x), core.ffi.from_buffer(out)) == 0
        want = np.zeros(out_shape, np.int64)
        for i in np.ndindex(*out_shape):
            j = [(t[i_k] if t is not None else i_k) - b for i_k, t, b in zip(i, takes, pad)]
            inside = all(0 <= j_k < d for j_k, d in zip(j, in_shape))
            at = offset + sum(j_k * s_k for j_k, s_k in zip(j, stride))
            want[i] = min(max(int(x[at]) if inside else pad_value, lo), hi)
        wrapped = want.astype(np.int64).astype(codes[DTYPE_CODE[out_dtype]])  # a narrowing cast wraps
        assert np.array_equal(out, wrapped), (case, in_shape, out_shape, pad, in_dtype, out_dtype)


# (100, 1000, 40): AVX2 widens weights per chunk of K (> 768 here: two chunks) for groups of 96 rows
# weights: full range (AVX2 proves no block pair-safe: vpmaddwd) or within +-64 (every block pair-safe: vpmaddubsw)
@pytest.mark.parametrize("batch,features,units", [(1, 1024, 1000), (7, 77, 45), (13, 256, 33), (100, 1000, 40)])
@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
@pytest.mark.parametrize("weights", ["full", "pair_safe"])
def test_dense_variants_match_numpy(core, isa, batch, features, units, in_dtype, weights):
    rng = np.random.default_rng(batch * 1000 + features)
    x = full_range(rng, (batch, features), in_dtype)
    weight = full_range(rng, (units, features), "int8")
    if weights == "pair_safe":
        weight //= 2
    bias = rng.integers(-100000, 100000, units).astype(np.int32)
    izp = 5 if in_dtype == "int8" else 128
    raw = Dense(core, weight_nk=weight, batch=batch, in_dtype=in_dtype, out_dtype="int32", input_zp=izp, bias=bias,
                requant=no_requantize())
    want = (x.astype(np.int64) - izp) @ weight.T.astype(np.int64) + bias
    want = (want & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    scale = rng.uniform(1e-5, 2e-4, units).astype("float32")
    rq = make_requantize(scale, np.float32(1.0), 0, 3, "int8", "UPWARD", "float32")
    dense = Dense(core, weight_nk=weight, batch=batch, in_dtype=in_dtype, input_zp=izp, bias=bias, requant=rq)
    # requantized reference: the same dense as a 1x1 conv through refcg_conv2d_ref
    conv = Conv2D(core, in_shape=(1, batch, 1, features), layout="NHWC", weight_ohwi=weight.reshape(units, 1, 1, -1),
                  in_dtype=in_dtype, input_zp=izp, bias=bias, requant=rq)
    ref = conv.run(x.reshape(1, batch, 1, features), fast=False).reshape(batch, units)
    assert dense.packed.pair_safe.all() == (weights == "pair_safe")
    assert np.array_equal(raw.run(x), want), isa
    assert np.array_equal(dense.run(x), ref), isa


# ---- AVX2 vpmaddubsw: the packer's pair proof (packing.pairs_fit_int16) at its boundary ----
# weight pairs (k = 2i, 2i + 1) exactly at the limit (positive part 128, negative part -128) and one past it
AT_LIMIT = [(64, 64), (127, 1), (1, 127), (-64, -64), (-128, 0), (0, -128), (-100, -28), (127, -128)]
PAST_LIMIT = [(64, 65), (127, 2), (-64, -65), (-128, -1)]


def pair_weights(rng, units, features, bad_channels):
    """units x features weights of AT_LIMIT pairs; bad_channels get a PAST_LIMIT pair every 8 pairs."""
    pairs = np.array(AT_LIMIT, np.int8)[rng.integers(0, len(AT_LIMIT), (units, features // 2))]
    for c in bad_channels:
        pairs[c, ::8] = np.array(PAST_LIMIT, np.int8)[np.arange(pairs[c, ::8].shape[0]) % len(PAST_LIMIT)]
    return pairs.reshape(units, features)


def extreme_rows(rng, rows, features, in_dtype):
    """Inputs whose domain bytes (x ^ 0x80 for int8) are 0 and 255: all-max rows (every pair at its
    extreme), all-min rows, alternating and random mixes of the two."""
    info = np.iinfo(in_dtype)
    x = np.where(rng.integers(0, 2, (rows, features)) == 1, info.max, info.min)
    x[0], x[1], x[2, ::2], x[2, 1::2] = info.max, info.min, info.max, info.min
    return x.astype(in_dtype)


def test_pair_proof_boundary():
    """At the limit a block passes, one pair past it (positive or negative side) fails the whole block."""
    from refcodegen.packing import pairs_fit_int16

    for pair in AT_LIMIT + PAST_LIMIT:
        blocked = np.zeros((1, 4, 16, 4), np.int8)
        blocked[0, 2, 5, 2:] = pair
        assert pairs_fit_int16(blocked)[0] == (pair in AT_LIMIT), pair
    rng = np.random.default_rng(3)
    w = pair_weights(rng, 40, 64, bad_channels=[20])
    assert Dense(CORE, weight_nk=w, batch=1, requant=no_requantize(), out_dtype="int32").packed.pair_safe.tolist() == [1, 0, 1]


@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
def test_pair_proof_boundary_bit_exact(core, isa, in_dtype):
    """Weights at the limit (vpmaddubsw on AVX2) and past it (vpmaddwd) on inputs at 0 and 255 in the
    domain: a dense and a 3x3 conv bit-exact against numpy and the reference."""
    rng = np.random.default_rng(11 + len(in_dtype))
    izp = -7 if in_dtype == "int8" else 131
    w = pair_weights(rng, 40, 64, bad_channels=[20])
    x = extreme_rows(rng, 9, 64, in_dtype)
    dense = Dense(core, weight_nk=w, batch=9, in_dtype=in_dtype, out_dtype="int32", input_zp=izp, requant=no_requantize())
    assert dense.packed.pair_safe.tolist() == [1, 0, 1]
    want = (x.astype(np.int64) - izp) @ w.T.astype(np.int64)
    assert np.array_equal(dense.run(x), want), isa
    weight = pair_weights(rng, 20, 3 * 3 * 16, bad_channels=[17]).reshape(20, 3, 3, 16)
    xc = extreme_rows(rng, 7 * 8, 16, in_dtype).reshape(1, 7, 8, 16)
    conv = Conv2D(core, in_shape=xc.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), input_zp=izp,
                  in_dtype=in_dtype, out_dtype="int32", requant=no_requantize())
    assert conv.fast_data.gemm.pair_safe.tolist() == [1, 0]
    want = numpy_conv_nhwc(xc, weight, izp, 0, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert np.array_equal(conv.run(xc), want), isa


def test_avx2_runs_vpmaddubsw_where_proven(core):
    """The AVX2 kernel follows pair_safe: with the flag forced on for the block past the limit it
    saturates (so the flagged blocks do run vpmaddubsw), with the flag off every block is exact."""
    core.use_or_skip("avx2")
    try:
        rng = np.random.default_rng(5)
        w = pair_weights(rng, 32, 64, bad_channels=[20])
        x = extreme_rows(rng, 9, 64, "uint8")
        dense = Dense(core, weight_nk=w, batch=9, in_dtype="uint8", out_dtype="int32", requant=no_requantize())
        want = x.astype(np.int64) @ w.T.astype(np.int64)
        assert dense.packed.pair_safe.tolist() == [1, 0]
        assert np.array_equal(dense.run(x), want)
        for flags in ([1, 1], [0, 0]):
            dense.g.pair_safe = core.ptr(np.array(flags, np.uint8), "uint8_t*")
            got = dense.run(x)
            assert np.array_equal(got[:, :20], want[:, :20]) and np.array_equal(got[:, 21:], want[:, 21:])
            # all-255 row: (64, 65) saturates to 32767, (127, 2) to 32767; the negative pairs likewise
            assert (got[0, 20] != want[0, 20]) == (flags == [1, 1]), flags
    finally:
        core.use(None)


def wino_built(core, conv) -> bool:
    """Whether the conv's Winograd weights were built (refcg_wino_cache.w): it ran as Winograd."""
    return conv.f.wino != core.ffi.NULL and conv.f.wino.w != core.ffi.NULL


def test_winograd_runs_where_eligible(core, isa):
    """3x3 stride-1 GEMM convs have a Winograd cache; AVX2 runs them there (building the weights at the
    first call), other variants never; a task's buffer that cannot be allocated: -2, not a wrong answer."""
    from refcodegen.packing import winograd_ok

    rng = np.random.default_rng(21)
    x = full_range(rng, (1, 10, 9, 32), "uint8")
    weight = full_range(rng, (24, 3, 3, 32), "int8")
    common = dict(in_shape=x.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), in_dtype="uint8",
                  input_zp=9, out_dtype="int32", requant=no_requantize())
    conv, strided = Conv2D(core, **common), Conv2D(core, strides=(2, 1), **common)
    assert conv.fast_data.winograd and not strided.fast_data.winograd and strided.f.wino == core.ffi.NULL
    assert not Conv2D(core, **dict(common, in_shape=(1, 10, 9, 20), weight_ohwi=weight[..., :20])).fast_data.winograd
    base = dict(groups=1, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, dilation_h=1, dilation_w=1)
    assert winograd_ok(base, 1824) and not winograd_ok(base, 1840) and not winograd_ok(dict(base, dilation_w=2), 16)
    want = numpy_conv_nhwc(x, weight, 9, 0, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert np.array_equal(split_run(core, lambda: conv.run(x)), want) and wino_built(core, conv) == (isa == "avx2")
    for _ in range(2):  # what a library's destructor calls; twice: a no-op on a released cache
        core.lib.refcg_wino_release(conv.f.wino)
        assert not wino_built(core, conv)
    assert np.array_equal(conv.run(x), want) and wino_built(core, conv) == (isa == "avx2")  # built again
    if isa == "avx2":
        core.fail_alloc(2)  # the padded copy, then the first task's transform buffer
        with pytest.raises(RuntimeError, match="returned -2"):
            split_run(core, lambda: conv.run(x))
        assert core.fail_alloc(0) >= 2


@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
def test_winograd_sums_at_the_int32_bound(core, isa, in_dtype):
    """cp = 1824, the most winograd_ok allows: domain bytes 255 (int8 127) and weights -128 everywhere, so
    every tile's 4 y = 4 * 9 * 1824 * 255 * -128 is 4.3 million above -2^31; exact against numpy."""
    x = np.full((1, 4, 5, 1824), np.iinfo(in_dtype).max, in_dtype)
    weight = np.full((16, 3, 3, 1824), -128, np.int8)
    izp = int(np.iinfo(in_dtype).max) - 1
    conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), in_dtype=in_dtype,
                  input_zp=izp, out_dtype="int32", requant=no_requantize())
    assert conv.fast_data.winograd
    want = numpy_conv_nhwc(x, weight, izp, 0, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert np.array_equal(conv.run(x), want) and wino_built(core, conv) == (isa == "avx2")


def test_kernel_zero_point_folding_and_fallback(core, isa):
    """uint8 weights with zero point 128 fold into int8; a w - kzp outside int8 keeps the reference."""
    rng = np.random.default_rng(5)
    x = full_range(rng, (1, 6, 7, 10), "int8")
    for kzp, fast in [(128, True), (0, False)]:
        weight = full_range(rng, (12, 3, 3, 10), "uint8")
        conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), input_zp=3,
                      kernel_zp=kzp, out_dtype="int32", requant=no_requantize())
        assert (conv.fast_data is not None) == fast
        want = numpy_conv_nhwc(x, weight, 3, kzp, (1, 1), (1, 1, 1, 1), (1, 1), 1)
        assert np.array_equal(conv.run(x), want), isa


def test_avxvnni_variant_runs_where_the_host_can():
    """The avxvnni variant's tests run (not skip) on every host with AVX-VNNI or with AVX-512 VNNI and VL (its
    EVEX stand-in): a stand-in that stopped building or dispatching would otherwise show only as skips."""
    from core_cffi import _cpu_flags

    if "avxvnni" not in _cpu_flags() and not avxvnni_as_evex():
        pytest.skip("host has neither AVX-VNNI nor AVX-512 VNNI with VL")
    assert "avxvnni" in CORE.variants(), CORE.compiled_variants()
    assert CORE.avxvnni_evex == ("avxvnni" not in _cpu_flags())


def test_isa_selection(core):
    variants = core.variants()
    assert list(core.compiled_variants())[-1] == variants[-1] == "scalar"
    assert core.lib.refcg_isa_supported(b"scalar") == 1 and core.lib.refcg_isa_supported(b"no-such-isa") == 0
    saved = os.environ.get("REFCG_ISA")
    try:
        for name in variants:
            assert core.lib.refcg_set_isa(name.encode()) == 0 and core.isa_name() == name
        assert core.lib.refcg_set_isa(b"no-such-isa") == -1
        assert core.isa_name() == variants[0]  # an unsupported name: the best supported variant
        os.environ["REFCG_ISA"] = variants[-1]
        assert core.isa_name() == variants[0]  # the environment is read once, at the first call
    finally:
        os.environ.pop("REFCG_ISA", None) if saved is None else os.environ.__setitem__("REFCG_ISA", saved)
        core.use(None)


def test_refcg_isa_is_read_at_the_first_call(core):
    """REFCG_ISA set before the process starts picks the variant (an unsupported name or none: the best)."""
    script = ("import importlib.util as u, sys; s = u.spec_from_file_location(sys.argv[1].split('.')[0], sys.argv[2]);"
              "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.ffi.string(m.lib.refcg_isa_name()).decode())")
    name = os.path.basename(core.path)
    children = {forced: subprocess.Popen([sys.executable, "-c", script, name, core.path], stdout=subprocess.PIPE,
                                         env=dict(os.environ, REFCG_ISA=forced), text=True)
                for forced in ("scalar", "no-such-isa", "")}
    got = {forced: child.communicate(timeout=120)[0].strip() for forced, child in children.items()}
    best = core.variants()[0]
    assert got == {"scalar": "scalar", "no-such-isa": best, "": best}


def check_variants(core, run, lowering):
    """run(reference) on the variant in use equals the scalar reference; returns the reference."""
    ref = run(True)
    got = run(False)
    assert np.array_equal(got, ref), f"{core.isa_name()} {lowering}: {np.abs(got - ref.astype(np.int64)).max()}"
    return ref


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_float_requantize_boundaries_every_variant(core, isa, layout):
    """The stored boundary accumulators (tests/fma_cases.py) through a 1x1 conv of unit weights
    (acc = bias + x), per channel and per tensor, float32 and float64, and qnn.mul's boundary product:
    every variant equals the scalar reference under each FloatLowering (fused or separate multiply-add,
    folded or separate 0.5, roundf or the truncating emulation), and FMA changes float32 results."""
    x = np.arange(-128, 128, dtype=np.int8).reshape((1, 16, 16, 1) if layout == "NHWC" else (1, 1, 16, 16))
    for zp, rounding, compute in itertools.product(fc.PER_CHANNEL, ("UPWARD", "TONEAREST"), ("float32", "float64")):
        for scales, bias in [(fc.per_channel_scales(zp), fc.per_channel_accs(zp, rounding)),
                             (fc.f32(fc.PER_TENSOR_SCALE), np.array(fc.PER_TENSOR[zp][rounding], np.int32))]:
            results = {}
            for lowering in LOWERINGS:
                rq = make_requantize(scales, fc.f32(fc.S_OUT), 0, zp, "int8", rounding, compute, lowering=lowering)
                conv = Conv2D(core, in_shape=x.shape, layout=layout, weight_ohwi=np.ones((len(bias), 1, 1, 1), np.int8),
                              bias=bias, requant=rq)
                results[lowering] = check_variants(core, lambda ref: conv.run(x, fast=not ref), lowering)
            if compute == "float32":
                assert not np.array_equal(results[FMA], results[NO_FMA]), (zp, rounding, layout)
    if layout == "NHWC":
        a = np.resize(np.array(fc.MUL_PAIR, np.int8), (3, 40))
        b = np.resize(np.array(fc.MUL_PAIR[::-1], np.int8), (3, 40))
        sa, sb, so = (fc.f32(bits) for bits in fc.MUL_SCALES)
        for rounding in ("UPWARD", "TONEAREST"):
            results = {}
            for lowering in LOWERINGS:
                rq = make_requantize(np.float32(sa * sb), so, 0, fc.MUL_ZP, "int8", rounding, "float32",
                                     lowering=lowering)
                results[lowering] = check_variants(core, lambda ref: run_binary(
                    core, "mul", a, b, "int8", rq, rq, (0, 0, fc.MUL_ZP), (-128, 127), ref), lowering)
            assert not np.array_equal(results[FMA], results[NO_FMA]), rounding


# (outer, channels, inner): one tensor of several chunks and a tail of 3; per axis with runs of 37;
# per axis with runs of 1 (the NHWC channel axis: the reference)
QUANTIZE_SHAPES = [(1, 1, 3 * 4096 + 3), (2, 3, 37), (5, 4, 1)]


@pytest.mark.parametrize("shape", QUANTIZE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("multiply", [0, 1])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_variants_bit_exact(core, isa, shape, multiply, dtype):
    """refcg_quantize on every variant against the reference and numpy (round half away from zero,
    then the zero point, the clamp, the cast): ties of both signs, values past the range, infinities;
    a NaN as the reference converts it."""
    outer, channels, inner = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, multiply, dtype)).encode()))
    scale = rng.uniform(0.01, 0.1, channels).astype(np.float32)
    zp = rng.integers(0, 256, channels) - (128 if dtype == "int8" else 0)
    step = (1 / scale if multiply else scale).astype(np.float32)  # what x is multiplied or divided by
    k = rng.integers(-200, 200, (outer, channels, inner))
    x = (k + rng.choice([0.0, 0.5, 0.49999997, 0.50000006, rng.uniform()], k.shape)).astype(np.float32)
    x = x * (1 / step if multiply else step)[None, :, None]  # near ties once scaled back
    x = x.astype(np.float32)
    x.flat[:6] = [np.inf, -np.inf, 1e30, -1e30, -0.0, np.nan][: x.size]
    p = core.ffi.new("refcg_quantize_params*")
    p.outer, p.channels, p.inner, p.quant_dtype, p.multiply = outer, channels, inner, DTYPE_CODE[dtype], multiply
    keep = [core.ptr(step, "float*"), core.ptr(zp.astype(np.int32), "int32_t*")]
    p.scale, p.zero_point = keep
    got, ref = np.empty(x.shape, dtype), np.empty(x.shape, dtype)
    assert core.lib.refcg_quantize(p, core.ptr(x, "float*"), core.ffi.from_buffer(got)) == 0
    assert core.lib.refcg_quantize_ref(p, core.ptr(x, "float*"), core.ffi.from_buffer(ref)) == 0
    assert np.array_equal(got, ref), isa
    y = (x * step[None, :, None] if multiply else x / step[None, :, None]).astype(np.float64)  # float32 products
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        want = np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5) + zp[None, :, None], info.min, info.max)
    finite = ~np.isnan(x)
    assert np.array_equal(got[finite], want[finite].astype(dtype)), isa
