"""The accelerated C core through cffi: every variant this host runs against the scalar
reference (bit-exact, all requantize modes, full-range data) and the reference against numpy."""
import os
import zlib

import numpy as np
import pytest

from refcodegen.core_cffi import Conv2D, Core, Dense
from refcodegen.numerics import MODES, make_requantize, no_requantize


@pytest.fixture(scope="module")
def core():
    return Core()


@pytest.fixture
def variant_env():
    saved = os.environ.get("REFCG_ISA")
    yield
    if saved is None:
        os.environ.pop("REFCG_ISA", None)
    else:
        os.environ["REFCG_ISA"] = saved


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


# in_c, out_c, hw, kernel, stride, pad (t, l, b, r), dilation, groups ("dw": depthwise)
SHAPES = [
    (3, 17, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (13, 37, (7, 6), (3, 2), (2, 1), (1, 0, 2, 1), (1, 1), 1),
    (64, 70, (5, 9), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (9, 16, (11, 10), (3, 3), (1, 2), (2, 2, 2, 2), (2, 2), 1),
    (33, 33, (9, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "dw"),
    (21, 21, (10, 13), (5, 3), (2, 2), (2, 1, 2, 1), (1, 2), "dw"),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"c{s[0]}o{s[1]}k{s[3][0]}x{s[3][1]}g{s[7]}")
@pytest.mark.parametrize("layout,in_dtype", [("NHWC", "int8"), ("NCHW", "int8"), ("NHWC", "uint8")])
def test_conv_variants_bit_exact(core, variant_env, shape, layout, in_dtype):
    in_c, out_c, (h, w), kernel, stride, pad, dilation, groups = shape
    groups = in_c if groups == "dw" else groups
    rng = np.random.default_rng(zlib.crc32(repr((shape, layout, in_dtype)).encode()))
    x_nhwc = full_range(rng, (1, h, w, in_c), in_dtype)
    weight = full_range(rng, (out_c, *kernel, in_c // groups), "int8")
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
    # every variant against the reference, for every requantize mode and both scale kinds
    cases = [("int32", no_requantize())]
    for index, (rounding, compute) in enumerate(MODES):
        per_channel = index % 2 == 0
        spread = 60.0 / (float(want.std()) + 1.0)  # outputs spread over ~+-100 before clamping
        scale = np.asarray(rng.uniform(0.5 * spread, 1.5 * spread, out_c if per_channel else None), "float32")
        cases.append(("int8", make_requantize(scale, np.float32(1.0), 0, -5, "int8", rounding, compute)))
    cases.append(("uint8", make_requantize(np.float32(spread), np.float32(1.0), 0, 100, "uint8", "UPWARD", "int64",
                                           (20.0, 240.0))))
    for out_dtype, rq in cases:
        conv = Conv2D(core, out_dtype=out_dtype, bias=bias, requant=rq, **common)
        ref = conv.run(x, fast=False)
        assert len(np.unique(ref)) > 8  # the requantize does not collapse everything
        for isa in core.variants():
            os.environ["REFCG_ISA"] = isa
            assert core.isa_name() == isa
            got = conv.run(x)
            assert np.array_equal(got, ref), f"{isa} {out_dtype} mode {rq.mode}: {np.abs(got - ref.astype(np.int64)).max()}"


@pytest.mark.parametrize("batch,features,units", [(1, 1024, 1000), (7, 77, 45), (13, 256, 33)])
@pytest.mark.parametrize("in_dtype", ["int8", "uint8"])
def test_dense_variants_match_numpy(core, variant_env, batch, features, units, in_dtype):
    rng = np.random.default_rng(batch * 1000 + features)
    x = full_range(rng, (batch, features), in_dtype)
    weight = full_range(rng, (units, features), "int8")
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
    for isa in core.variants():
        os.environ["REFCG_ISA"] = isa
        assert np.array_equal(raw.run(x), want), isa
        assert np.array_equal(dense.run(x), ref), isa


def test_kernel_zero_point_folding_and_fallback(core, variant_env):
    """uint8 weights with zero point 128 fold into int8; a w - kzp outside int8 keeps the reference."""
    rng = np.random.default_rng(5)
    x = full_range(rng, (1, 6, 7, 10), "int8")
    for kzp, fast in [(128, True), (0, False)]:
        weight = full_range(rng, (12, 3, 3, 10), "uint8")
        conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, padding=(1, 1, 1, 1), input_zp=3,
                      kernel_zp=kzp, out_dtype="int32", requant=no_requantize())
        assert (conv.fast_data is not None) == fast
        want = numpy_conv_nhwc(x, weight, 3, kzp, (1, 1), (1, 1, 1, 1), (1, 1), 1)
        for isa in core.variants():
            os.environ["REFCG_ISA"] = isa
            assert np.array_equal(conv.run(x), want), isa


def test_isa_selection(core, variant_env):
    variants = core.variants()
    os.environ.pop("REFCG_ISA", None)
    assert core.isa_name() == variants[0]  # best supported first
    os.environ["REFCG_ISA"] = "no-such-isa"
    assert core.isa_name() == variants[0]
    assert core.lib.refcg_isa_supported(b"scalar") == 1
