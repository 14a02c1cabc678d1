"""refcg.conv2d against TVM-only: bit-exact over a parameter sweep."""
import pytest
from tvm import relay

from conftest import TARGET_F32, TARGET_LLVM, compare_with_tvm, random_int
from models import module, nchw_or_nhwc, qconv_block

SWEEP = [
    # layout, in_c, out_c, hw, kernel, strides, padding, per_channel, clip
    ("NCHW", 3, 8, 9, (3, 3), (1, 1), (1, 1), False, None),
    ("NCHW", 16, 32, 12, (3, 3), (2, 2), (1, 1), True, (-128, 127)),
    ("NCHW", 8, 5, 7, (1, 1), (1, 1), (0, 0), True, (0, 127)),
    ("NCHW", 4, 6, 10, (5, 3), (1, 2), (2, 1, 1, 0), False, (-20, 90)),
    ("NHWC", 3, 8, 9, (3, 3), (1, 1), (1, 1), False, None),
    ("NHWC", 16, 24, 11, (3, 3), (2, 2), (0, 0), True, (0, 127)),
    ("NHWC", 7, 9, 6, (1, 1), (1, 1), (0, 0), False, (-128, 100)),
    ("NHWC", 5, 4, 13, (3, 5), (3, 1), (1, 2, 0, 1), True, None),
]


@pytest.mark.parametrize("layout,in_c,out_c,hw,kernel,strides,padding,per_channel,clip", SWEEP)
@pytest.mark.parametrize("zps", [(0, 0, 0), (3, 0, -5), (-7, 0, 12)])
def test_conv2d_matches_tvm(tmp_path, rng, layout, in_c, out_c, hw, kernel, strides, padding, per_channel,
                            clip, zps):
    shape = nchw_or_nhwc(layout, 1, in_c, hw, hw)
    x = relay.var("x", shape=shape, dtype="int8")
    y = qconv_block(x, rng, in_c=in_c, out_c=out_c, kernel=kernel, strides=strides, padding=padding,
                    layout=layout, per_channel=per_channel, clip=clip, input_zp=zps[0], kernel_zp=zps[1],
                    output_zp=zps[2])
    compare_with_tvm(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, expect_partitions=1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv2d_tonearest(tmp_path, rng, layout, per_channel):
    shape = nchw_or_nhwc(layout, 1, 8, 10, 10)
    x = relay.var("x", shape=shape, dtype="int8")
    y = qconv_block(x, rng, in_c=8, out_c=16, layout=layout, per_channel=per_channel, rounding="TONEAREST",
                    input_zp=2, output_zp=-3)
    compare_with_tvm(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv2d_float32_requantize_target(tmp_path, rng, layout, per_channel):
    """Under an sse4.1 target TVM-only requantizes in float32; refcg must follow.

    Weights stay within [-63, 63]: TVM-only's own x86 int8 conv (vpmaddubsw) saturates
    int16 on full-range data and would be the wrong side of the comparison.
    """
    shape = nchw_or_nhwc(layout, 1, 8, 10, 10)
    x = relay.var("x", shape=shape, dtype="int8")
    y = qconv_block(x, rng, in_c=8, out_c=16, layout=layout, per_channel=per_channel, input_zp=1,
                    output_zp=4, weight_range=(-63, 63), clip=(-100, 120))
    compare_with_tvm(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, target=TARGET_F32)


def test_conv2d_chain_is_one_partition(tmp_path, rng):
    shape = (1, 8, 12, 12)
    x = relay.var("x", shape=shape, dtype="int8")
    y = qconv_block(x, rng, in_c=8, out_c=16, per_channel=True, clip=(0, 127))
    y = qconv_block(y, rng, in_c=16, out_c=16, strides=(2, 2), input_scale=0.1)
    y = qconv_block(y, rng, in_c=16, out_c=4, kernel=(1, 1), padding=(0, 0), input_scale=0.1)
    compare_with_tvm(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, expect_partitions=1,
                     target=TARGET_LLVM)
