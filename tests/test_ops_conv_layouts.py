"""refcg.conv2d layouts and forms frontends emit beyond test_ops_conv_variants.py: TFLite's depthwise
HWOI kernels, an ``nn.pad`` in front (fused when it pads with the input zero point), and the
accumulator kept as the output (int32, int16). Bit-exact against TVM-only under NUMERICS."""
from dataclasses import dataclass

import numpy as np
import pytest
from tvm import relay

from conftest import compare_with_tvm, random_int, slow_params
from models import module, nchw_or_nhwc
from refcodegen import offload_report, partition_for_refcg
from refcodegen.partition import refcg_functions
from test_ops_common import Cases, const, stays_in_tvm


@dataclass
class Conv:
    layout: str = "NHWC"
    kernel_layout: str = "HWIO"
    dtype: str = "int8"
    w_dtype: str = "int8"
    in_c: int = 4
    out_c: int = 4
    groups: int = 1
    kernel: tuple = (3, 3)
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: tuple = (0, 0)
    zps: tuple = (0, 0)  # input, kernel
    pad: tuple | None = None  # (H, W) widths of an nn.pad in front
    pad_value: object = None  # as frontends give it: float, the int32 zero point, a constant expression
    out: str = "int8"  # requantize to int8/uint8; "int32"/"int16": the accumulator is the output
    out_zp: int = 0
    per_channel: bool = False
    clip: tuple | None = None
    bias: str | None = None  # with out "int32": "bias_add" or "add"
    depthwise_form: bool = False  # weights [in_c][multiplier] (nn.conv2d's depthwise reading), not [out_c][1]

    def weight_shape(self) -> tuple:
        kh, kw = self.kernel
        depthwise = self.kernel_layout == "HWOI" or self.depthwise_form
        oihw = (self.in_c, self.out_c // self.in_c) if depthwise else (self.out_c, self.in_c // self.groups)
        return tuple(dict(zip("OIHW", (*oihw, kh, kw)))[axis] for axis in self.kernel_layout)


def weights(rng, shape, dtype, numerics):
    """Full range, except under the float32 target: TVM-only's vpmaddubsw saturates int16 on
    full-range uint8 x int8 (tvm-byoc-facts.md), so the shifted weights stay within +-63 there."""
    if numerics != "float32":
        return relay.const(random_int(rng, shape, dtype))
    low, high = (-63, 63) if dtype == "int8" else (65, 191)
    return relay.const(random_int(rng, shape, dtype, low, high))


def scales(c: Conv, per_channel: bool):
    return np.linspace(0.004, 0.02, c.out_c).astype("float32") if per_channel else np.float32(0.01)


def build(cases: Cases, rng, c: Conv, numerics: str, size: tuple = (7, 6)):
    x = cases.var(nchw_or_nhwc(c.layout, 1, c.in_c, *size), c.dtype, rng)
    if c.pad is not None:
        widths = [(0, 0), (0, 0), *c.pad] if c.layout == "NCHW" else [(0, 0), *c.pad, (0, 0)]
        x = relay.nn.pad(x, widths, pad_value=c.pad_value)
    y = relay.qnn.op.conv2d(
        x, weights(rng, c.weight_shape(), c.w_dtype, numerics), const(c.zps[0], "int32"), const(c.zps[1], "int32"),
        const(0.05), relay.const(scales(c, c.per_channel)), kernel_size=c.kernel, channels=c.out_c,
        groups=c.groups, strides=c.strides, dilation=c.dilation, padding=c.padding, data_layout=c.layout,
        kernel_layout=c.kernel_layout, out_dtype="int16" if c.out == "int16" else "int32")
    axis = c.layout.index("C")
    bias = random_int(rng, (c.out_c,), "int32", -10**6, 10**6)
    if c.bias == "bias_add":
        y = relay.nn.bias_add(y, relay.const(bias), axis=axis)
    elif c.bias == "add":
        y = relay.add(y, relay.const(bias.reshape((c.out_c,) + (1,) * (3 - axis))))
    if c.out in ("int8", "uint8"):
        y = relay.qnn.op.requantize(y, relay.const(np.float32(0.05) * scales(c, c.per_channel)), const(0, "int32"),
                                    const(0.3), const(c.out_zp, "int32"), axis=axis, out_dtype=c.out)
    cases.add(relay.clip(y, *c.clip) if c.clip else y)


HWOI, OIHW = dict(kernel_layout="HWOI"), dict(layout="NCHW", kernel_layout="OIHW")
SWEEP = [
    # TFLite depthwise, HWOI [KH][KW][C][multiplier]; SAME padding as an nn.pad with a float zero point
    Conv(**HWOI, in_c=6, out_c=6, groups=6, zps=(-128, 0), pad=((1, 1), (1, 1)), pad_value=const(-128.0),
         per_channel=True),
    Conv(**HWOI, dtype="uint8", out_c=8, groups=4, strides=(2, 2), padding=(1, 1, 0, 2), zps=(255, 3), out_zp=-5,
         per_channel=True, clip=(-20, 127)),
    Conv(**HWOI, w_dtype="uint8", in_c=3, out_c=9, groups=3, kernel=(2, 3), strides=(1, 2), dilation=(2, 1),
         zps=(127, 255), pad=((0, 2), (1, 0)), pad_value=const(127, "int32"), out="uint8", out_zp=7),
    Conv(**HWOI, dtype="uint8", w_dtype="uint8", groups=4, kernel=(1, 1), zps=(0, 128), out="int32", bias="bias_add"),
    # nn.conv2d reads OIHW [C][multiplier] with groups == C as depthwise too (output channel c * m + j)
    Conv(**OIHW, out_c=8, groups=4, depthwise_form=True, zps=(5, -3), out_zp=1, per_channel=True),
    # pads in front of plain and grouped convs; pad values as ONNX (the zp tensor) and casts give them
    Conv(**OIHW, dtype="uint8", in_c=3, zps=(255, 7), padding=(1, 1), pad=((0, 2), (1, 0)),
         pad_value=const(255, "int32"), out_zp=-3, per_channel=True),
    Conv(dtype="uint8", w_dtype="uint8", in_c=3, zps=(0, 255), padding=(1, 0, 0, 2), pad=((2, 0), (0, 3)),
         pad_value=const(0, "uint8"), out="int32"),
    Conv(**OIHW, w_dtype="uint8", groups=2, dilation=(1, 2), zps=(127, 128), pad=((1, 0), (0, 1)),
         pad_value=relay.cast(const(127, "int32"), "float32"), out="int32", bias="add"),
]
# out_dtype int16: TVM-only computes the conv in int16 (after its int16 legalization) or narrows an int32
# conv, both wrapping. Under the float32 (sse4.2) target its own lowering fails to type-check int16 with
# non-zero zero points or int8 data (an int16 term minus an int32 term) and its NCHW u8 x s8 tensorization
# rejects int16, so only these forms build there.
INT16 = {
    "llvm": [Conv(**OIHW, out_c=8, zps=(-3, 5), padding=(1, 1), out="int16"),
             Conv(**HWOI, dtype="uint8", w_dtype="uint8", out_c=8, groups=4, zps=(255, 0), out="int16")],
    "float32": [Conv(dtype="uint8", out_c=8, padding=(1, 1), out="int16"),
                Conv(**OIHW, out_c=8, groups=2, zps=(3, 0), out="int16")],
}


@pytest.mark.parametrize("numerics", ["llvm", "tonearest", "float32"])
def test_conv_layouts_and_forms_match_tvm(tmp_path, rng, numerics):
    """Each case is one partition (the costly part). TONEAREST changes only the requantize: its sweep is
    the cases with per-channel requantize scales (many ratios), not the accumulator outputs."""
    sweep = [c for c in SWEEP if numerics != "tonearest" or c.per_channel]
    sweep += INT16.get(numerics, [])
    cases = Cases()
    for c in sweep:
        build(cases, rng, c, numerics)
    partitioned = cases.compare(tmp_path, numerics)
    kernels = [ops for partition in offload_report(partitioned).partitions.values() for _, ops in partition]
    assert len(kernels) == len(sweep), kernels  # one conv kernel per case: every pad fused
    assert sum(ops[0] == "nn.pad" for ops in kernels) == sum(c.pad is not None for c in sweep), kernels


def qconv_nhwc(data, w, izp=0, **kw):
    return relay.qnn.op.conv2d(data, w, const(izp, "int32"), const(0, "int32"), const(0.05), const(0.01),
                               kernel_size=(3, 3), channels=4, data_layout="NHWC", **kw)


HW_PAD = ((0, 0), (1, 1), (1, 1), (0, 0))


@pytest.mark.parametrize("dtype,izp,widths,value,mode,reason", [
    ("int8", 3, HW_PAD, const(0.0), "constant", None),
    # nn.pad truncates 200.5 to 200; refcg pads with exactly representable values only
    ("uint8", 200, HW_PAD, const(200.5), "constant", "pad value is not a constant integer in the uint8 range"),
    ("int8", 0, ((0, 0), (0, 0), (0, 0), (0, 2)), const(0.0), "constant", None),
    ("int8", 0, HW_PAD, const(0.0), "edge", "pad_mode edge is not constant"),
], ids=["value", "truncated-value", "channel-axis", "edge-mode"])
def test_pad_that_cannot_fuse_into_the_conv(tmp_path, rng, dtype, izp, widths, value, mode, reason):
    """A pad the conv cannot take as its padding (another value than the input zero point, the C axis)
    runs as a refcg.copy kernel of its own before the conv, bit-exact; one refcg cannot compute at all
    (a value the dtype cannot hold, edge mode) stays in TVM with the reason, the conv offloaded alone."""
    x = relay.var("x", shape=(1, 5, 5, 4 - widths[3][1]), dtype=dtype)
    padded = relay.nn.pad(x, widths, pad_value=value, pad_mode=mode)
    y = qconv_nhwc(padded, relay.const(random_int(rng, (3, 3, 4, 4), "int8")), izp, kernel_layout="HWIO")
    if reason is None:
        partitioned = compare_with_tvm(module([x], y), {"x": random_int(rng, (1, 5, 5, 4 - widths[3][1]), dtype)},
                                       tmp_path, expect_partitions=1)
        report = offload_report(partitioned)
        assert [ops for partition in report.partitions.values() for _, ops in partition] == [["nn.pad"], ["qnn.conv2d"]]
        assert not report.stayed_ops, str(report)
        return
    report = offload_report(partition_for_refcg(module([x], y)))
    assert [ops for partition in report.partitions.values() for _, ops in partition] == [["qnn.conv2d"]], str(report)
    assert report.stayed_ops["nn.pad"] == 1 and reason in str(report), str(report)


def test_unsupported_conv_forms_stay_in_tvm(rng):
    x = relay.var("x", shape=(1, 6, 6, 4), dtype="int8")
    w = relay.const(random_int(rng, (3, 3, 4, 4), "int8"))
    hwoi = qconv_nhwc(x, w, kernel_layout="HWOI")  # groups 1: [KH][KW][O][I]
    assert "HWOI is only supported for depthwise" in stays_in_tvm(module([x], hwoi), "qnn.conv2d")
    wide = qconv_nhwc(x, w, kernel_layout="HWIO", out_dtype="int64")
    assert "out_dtype int64" in stays_in_tvm(module([x], wide), "qnn.conv2d")
    # an int16 accumulator is not fused with a requantize: the conv keeps its int16 output and the
    # requantize runs as a kernel of its own (bit-exact: test_ops_requantize's int16 cases)
    int16 = qconv_nhwc(x, w, kernel_layout="HWIO", out_dtype="int16")
    y = relay.qnn.op.requantize(int16, const(0.0005), const(0, "int32"), const(0.3), const(0, "int32"), axis=3)
    partitioned = partition_for_refcg(module([x], y))
    assert len(refcg_functions(partitioned)) == 1
    report = offload_report(partitioned)
    assert not report.stayed_ops, str(report)
    kernels = str(refcg_functions(partitioned)[0][1])
    assert 'Composite="refcg.conv2d"' in kernels and 'Composite="refcg.requantize"' in kernels


# Inception-v3's convolutions (issue 19): 1xN / Nx1 kernels padded per axis, PyTorch's import puts that
# padding in an nn.pad in front of the conv. Every kernel shape with the pad in each place it can be
# (nn.pad symmetric per axis as the importer writes it, nn.pad asymmetric, the conv's own padding, both),
# strides 1 and 2, odd input sizes, channel counts that take the GEMM (groups 1) and depthwise kernels.
PAD_KERNELS = [(1, 3), (3, 1), (1, 7), (7, 1), (3, 3), (5, 5), (1, 5), (2, 3)]
PAD_PLACES = {  # (nn.pad (H, W) widths, conv padding (top, left, bottom, right)) for kernel (kh, kw)
    "nn.pad": lambda kh, kw: (((kh // 2,) * 2, (kw // 2,) * 2), (0, 0, 0, 0)),
    "nn.pad asymmetric": lambda kh, kw: (((kh - 1, 0), (0, kw - 1)), (0, 0, 0, 0)),
    "conv padding": lambda kh, kw: (None, (kh // 2, kw // 2, kh // 2, kw // 2)),
    "both": lambda kh, kw: (((kh // 2, 0), (0, kw // 2)), (0, kw // 2, kh // 2, 0)),
}
PAD_SIZES = [(17, 17), (9, 13), (35, 35)]
KERNEL_LAYOUTS = {"NCHW": "OIHW", "NHWC": "HWIO"}


def padded_conv_cases(numerics: str):
    """(Conv, input (H, W)) cases: each kernel shape meets each pad place and both strides."""
    cases = []
    for i, (kh, kw) in enumerate(PAD_KERNELS):
        for j, place in enumerate(PAD_PLACES):
            pad, padding = PAD_PLACES[place](kh, kw)
            stride = 1 + (i + j) % 2
            layout = ("NCHW", "NHWC")[(i + j // 2) % 2]
            depthwise = (i + j) % 4 == 3
            zps = (0, 0) if j % 2 == 0 else ((-3, 0) if layout == "NCHW" else (0, 0))
            c = Conv(layout=layout, kernel_layout=KERNEL_LAYOUTS[layout], dtype="uint8" if j % 2 == 0 else "int8",
                     in_c=8 if depthwise else 12, out_c=8 if depthwise else 20, groups=8 if depthwise else 1,
                     kernel=(kh, kw), strides=(stride, stride), padding=padding, zps=zps, pad=pad,
                     pad_value=0.0 if pad is None else float(zps[0]), per_channel=True,
                     clip=(0, 255) if j % 2 == 0 else None, out="uint8" if j % 2 == 0 else "int8")
            cases.append((c, PAD_SIZES[(i + j) % len(PAD_SIZES)]))
    # the geometry is swept under llvm; TONEAREST changes only the requantize (one case per kernel
    # shape), the float32 target also TVM-only's conv lowering (two per kernel shape)
    return cases[:: {"llvm": 1, "float32": 2, "tonearest": 4}[numerics]]


@pytest.mark.parametrize("numerics", slow_params(["llvm", "tonearest", "float32"], "tonearest", "float32"))
def test_padded_1xn_nx1_convs_match_tvm(tmp_path, rng, numerics):
    cases = Cases()
    sweep = padded_conv_cases(numerics)
    for c, size in sweep:
        build(cases, rng, c, numerics, size)
    partitioned = cases.compare(tmp_path, numerics)
    kernels = [ops for partition in offload_report(partitioned).partitions.values() for _, ops in partition]
    assert len(kernels) == len(sweep), kernels  # every nn.pad fused into its conv
    assert sum(ops[0] == "nn.pad" for ops in kernels) == sum(c.pad is not None for c, _ in sweep), kernels
