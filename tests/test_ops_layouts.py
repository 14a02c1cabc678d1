"""Layouts planned across a partition (plan.plan_layouts): an NCHW network keeps its intermediates
channels last inside the partition, every kernel reads and writes them through strides, the partition's
inputs and outputs keep their logical layout. Bit-exact against TVM-only, and checked on the plan."""
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import compare_with_tvm, random_int
from examples.networks import QuantNet
from refcodegen import codegen, objcache, partition_for_refcg

CHANNELS_LAST = (0, 2, 3, 1)  # NCHW stored as NHWC
# the steps that take re-laid-out tensors (a concatenate runs as requantize parts, one per input)
KERNELS = ("conv2d", "pool2d", "binary", "requantize", "reduce")


def chain(layout="NCHW"):
    """conv -> max pool -> 1x1 conv -> residual add (both operands re-laid out) -> depthwise conv ->
    concatenate over channels -> 3x3 conv (a partition output) and a global mean (another one)."""
    net = QuantNet(17, layout)
    x = relay.var("x", shape=net.shape(1, 8, 12, 12), dtype="int8")
    a = net.conv(x, 8, 16, 3)
    p = net.max_pool(a)
    s = net.add(net.conv(p, 16, 16, 1), p, relu=True)
    d = net.conv(s, 16, 16, 3, groups=16, relu6=True)
    scale, zero = relay.const(np.float32(net.act_scale)), relay.const(0)
    cat = relay.qnn.op.concatenate([s, d], [relay.const(np.float32(net.act_scale * 1.5)), scale], [zero, zero],
                                   scale, zero, axis=net.axis)
    out = net.conv(cat, 32, 8, 3, relu=False)
    return net.module(x, relay.Tuple([out, net.global_pool(cat)])), x


def capture_plans(monkeypatch) -> list:
    """The kernel plans codegen makes, in order."""
    plans, build_plan = [], codegen.build_plan

    def spy(func, symbol, target):
        plans.append(build_plan(func, symbol, target))
        return plans[-1]

    monkeypatch.setattr(codegen, "build_plan", spy)
    return plans


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_layouts_planned_across_partition(tmp_path, rng, monkeypatch, layout):
    mod, x = chain(layout)
    plans = capture_plans(monkeypatch)
    inputs = {"x": random_int(rng, [int(d) for d in x.type_annotation.shape], "int8")}
    compare_with_tvm(mod, inputs, tmp_path, expect_partitions=1)
    (plan,) = plans
    families = [step.family for step in plan.steps]
    assert families[:8] == ["conv2d", "pool2d", "conv2d", "binary", "conv2d", "requantize", "conv2d", "reduce"], \
        families
    conv_strides = [(s.values["params"]["in_stride"], s.values["params"]["out_stride"])
                    for s in plan.steps if s.family == "conv2d"]
    if layout == "NHWC":  # already channels last: nothing to re-lay out
        assert all(buf.perm is None for s in plan.steps for buf in (*s.inputs, s.output))
        return
    for step in plan.steps:
        for buf in (*step.inputs, step.output):
            if step.family in KERNELS and buf.kind == "scratch" and not (step.family == "reduce" and buf is step.output):
                # no conversion step and no transposing copy inside a kernel: every tensor between two
                # kernels is stored as the kernels compute (channels last)
                assert buf.perm == CHANNELS_LAST, (step.name, step.family, buf)
            if buf.kind in ("input", "output"):
                assert buf.perm is None, (step.name, buf)
    # the first conv reads the NCHW input (W contiguous), the others read channels last; the last one
    # writes the NCHW partition output
    h, w = 12, 12
    assert conv_strides[0][0] == [8 * h * w, w, 1, h * w]
    assert all(ins[3] == 1 for ins, _ in conv_strides[1:])
    assert all(outs[3] == 1 for _, outs in conv_strides[:-1])
    assert conv_strides[-1][1][2] == 1 and conv_strides[-1][1][3] == 6 * 6


def test_partition_output_and_mixed_operands_stay_logical(tmp_path, rng, monkeypatch):
    """An add of a re-laid-out conv result and a partition input (logical), whose result is a partition
    output: strided operands of both layouts, the output written in its logical layout."""
    net = QuantNet(5, "NCHW")
    x = relay.var("x", shape=(1, 8, 6, 10), dtype="int8")
    y = net.add(net.conv(net.conv(x, 8, 8, 3), 8, 8, 1), x)
    plans = capture_plans(monkeypatch)
    compare_with_tvm(net.module(x, y), {"x": random_int(rng, (1, 8, 6, 10), "int8")}, tmp_path, expect_partitions=1)
    add = plans[0].steps[-1]
    assert add.family == "binary" and add.output.kind == "output" and add.output.perm is None
    assert [b.perm for b in add.inputs] == [CHANNELS_LAST, None]


def test_kernel_without_the_layout_keeps_its_tensors_logical(tmp_path, rng, monkeypatch):
    """A depthwise conv with a channel multiplier has its fast kernel on planes only: the tensors it
    reads and writes stay NCHW; the tensor between the two later convs is still re-laid out."""
    net = QuantNet(9, "NCHW")
    x = relay.var("x", shape=(1, 8, 10, 10), dtype="int8")
    y = net.conv(net.conv(net.conv(net.conv(x, 8, 8, 3), 8, 16, 3, groups=8), 16, 8, 1), 8, 8, 3)
    plans = capture_plans(monkeypatch)
    compare_with_tvm(net.module(x, y), {"x": random_int(rng, (1, 8, 10, 10), "int8")}, tmp_path, expect_partitions=1)
    assert [step.output.perm for step in plans[0].steps] == [None, None, CHANNELS_LAST, None]


@pytest.mark.slow  # make test-slow (CI): -DREFCG_PROFILE makes its own core object, a minute of g++ -O3
def test_profile_build_reports_every_step(tmp_path):
    """-DREFCG_PROFILE: each step's CPU time is printed when the library unloads (a child process)."""
    net = QuantNet(3, "NCHW")
    x = relay.var("x", shape=(1, 4, 8, 8), dtype="int8")
    mod = net.module(x, net.max_pool(net.conv(x, 4, 8, 3)))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partition_for_refcg(mod), target="llvm")
    path = str(tmp_path / "profiled.so")
    lib.export_library(path, fcompile=objcache.create_shared, options=["-DREFCG_PROFILE"])
    script = ("import sys, numpy as np, tvm\nfrom tvm.contrib import graph_executor\n"
              "m = graph_executor.GraphModule(tvm.runtime.load_module(sys.argv[1])['default'](tvm.cpu()))\n"
              "m.set_input(0, np.zeros((1, 4, 8, 8), 'int8'))\nm.run()\nm.run()\n")
    result = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, check=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("refcg profile")]
    assert [line.split(" ms  ")[1].split(" ")[:2] for line in lines] == [["k0", "conv2d"], ["k1", "pool2d"]], \
        result.stderr


def test_elementwise_kernels_keep_the_layout(tmp_path, rng, monkeypatch):
    """A table op (qnn.sigmoid), a clip and a per-channel qnn.requantize between convs run on the
    channels-last tensors as they are (one flat run / slabs around the channel axis there)."""
    net = QuantNet(11, "NCHW")
    x = relay.var("x", shape=(1, 8, 9, 7), dtype="int8")
    s, z = relay.const(np.float32(net.act_scale)), relay.const(0)
    y = relay.qnn.op.sigmoid(net.conv(x, 8, 8, 3), s, z, relay.const(np.float32(1 / 256)), relay.const(-128))
    y = relay.clip(net.max_pool(y), -100, 90)
    y = net.add(net.conv(y, 8, 8, 1), y)
    y = relay.qnn.op.requantize(y, relay.const(rng.uniform(0.05, 0.2, 8).astype("float32")), z,
                                relay.const(np.float32(net.act_scale * 1.5)), z, axis=1, out_dtype="int8")
    y = net.conv(y, 8, 4, 3)
    plans = capture_plans(monkeypatch)
    compare_with_tvm(net.module(x, y), {"x": random_int(rng, (1, 8, 9, 7), "int8")}, tmp_path, expect_partitions=1)
    steps = plans[0].steps
    assert [s.family for s in steps] == ["conv2d", "lut", "pool2d", "copy", "conv2d", "binary", "requantize", "conv2d"]
    assert all(s.output.perm == CHANNELS_LAST for s in steps[:-1]) and steps[-1].output.perm is None


def test_data_movement_keeps_the_layout(tmp_path, rng, monkeypatch):
    """ShuffleNet's unit between convs: a concatenation, a channel shuffle (reshape -> transpose ->
    reshape: one gather step), two channel slices; then an H/W transpose and a pad. Every copy reads and
    writes the channels-last tensors as they are: no conversion between two kernels."""
    net = QuantNet(13, "NCHW")
    x = relay.var("x", shape=(1, 8, 6, 7), dtype="int8")
    a, b = net.conv(x, 8, 6, 3), net.conv(x, 8, 6, 1)
    scale, zero = relay.const(np.float32(net.act_scale)), relay.const(0)
    cat = relay.qnn.op.concatenate([a, b], [scale, scale], [zero, zero], scale, zero, axis=1)
    shuffled = relay.reshape(relay.transpose(relay.reshape(cat, (1, 2, 6, 6, 7)), (0, 2, 1, 3, 4)), (1, 12, 6, 7))
    left = relay.strided_slice(shuffled, begin=[0], end=[6], axes=[1])
    right = net.conv(relay.strided_slice(shuffled, begin=[6], end=[12], axes=[1]), 6, 6, 1)
    y = relay.transpose(net.add(left, right), (0, 1, 3, 2))
    y = relay.nn.pad(y, ((0, 0), (0, 0), (1, 0), (0, 2)), pad_value=relay.const(-3, "int8"))
    y = net.conv(y, 6, 4, 3)
    plans = capture_plans(monkeypatch)
    compare_with_tvm(net.module(x, y), {"x": random_int(rng, (1, 8, 6, 7), "int8")}, tmp_path, expect_partitions=1)
    steps = plans[0].steps
    assert [s.family for s in steps] == ["conv2d", "conv2d", "requantize", "copy", "copy", "copy", "conv2d", "binary",
                                         "copy", "copy", "conv2d"], [s.family for s in steps]
    assert steps[3].values["ops"] == "reshape -> transpose -> reshape"
    # the shuffle: a gather along the last (channel) axis of the channels-last tensor
    take = steps[3].values["params"]["take"]
    assert take[:3] == [None] * 3 and take[3] == [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]
    assert all(s.output.perm == CHANNELS_LAST for s in steps[:-1]) and steps[-1].output.perm is None
    assert all(buf.perm == CHANNELS_LAST for s in steps[1:] for buf in s.inputs if buf.kind == "scratch")


def test_a_reshape_transpose_reshape_that_mixes_axes_is_three_copies(tmp_path, rng, monkeypatch):
    """(C, H*W) transposed to (H*W, C) and read back as (C, H, W): no per-axis gather, so the three ops
    are copies of their own, bit-exact."""
    x = relay.var("x", shape=(1, 6, 4, 5), dtype="int8")
    y = relay.reshape(relay.transpose(relay.reshape(x, (1, 6, 20)), (0, 2, 1)), (1, 6, 4, 5))
    plans = capture_plans(monkeypatch)
    compare_with_tvm(tvm.IRModule.from_expr(relay.Function([x], relay.clip(y, -100, 100))),
                     {"x": random_int(rng, (1, 6, 4, 5), "int8")}, tmp_path, expect_partitions=1)
    assert [s.values["ops"] for s in plans[0].steps] == ["transpose", "clip"]  # the reshapes are views


def inverted_residual(layout: str, stride: int, keras_pad: bool, dtype: str = "uint8", activation: str = ""):
    """1x1 expand (then a table op: activation "hardswish", or "swish", x * sigmoid(x) as EfficientNet's)
    -> depthwise 3x3 (stride 1 or 2; keras_pad: an nn.pad by (0, 1) then valid, as Keras pads a stride-2
    depthwise) -> 1x1 project on 8-bit tensors of dtype: the depthwise conv's input lives inside its
    halo. Returns the module, its input and the depthwise conv's input zero point."""
    from examples.networks import qconv

    rng = np.random.default_rng(31 + stride)
    shape = (1, 16, 14, 12) if layout == "NCHW" else (1, 14, 12, 16)  # even: stride 2 reads no bottom row
    x = relay.var("x", shape=shape, dtype=dtype)
    zp_in, zp = (128, 3) if dtype == "uint8" else (0, -125)
    common = dict(layout=layout, per_channel=True, out_dtype=dtype, clip=(zp, np.iinfo(dtype).max),
                  input_scale=0.05, output_scale=0.05, weight_range=(-20, 20))
    e = qconv(x, rng, in_c=16, out_c=32, kernel=(1, 1), padding=(0, 0), input_zp=zp_in, output_zp=zp, **common)
    s, z, q = relay.const(0.05), relay.const(zp), relay.const(0.02)
    if activation == "hardswish":
        e = relay.qnn.op.hardswish(e, s, z, q, z)
    elif activation == "swish":
        e = relay.qnn.op.mul(e, relay.qnn.op.sigmoid(e, s, z, relay.const(1 / 256), z), s, z, relay.const(1 / 256), z, q, z)
    if keras_pad:
        widths = [(0, 0), (0, 1), (0, 1), (0, 0)] if layout == "NHWC" else [(0, 0), (0, 0), (0, 1), (0, 1)]
        e = relay.nn.pad(e, widths, relay.const(zp, dtype))
    d = qconv(e, rng, in_c=32, out_c=32, groups=32, strides=(stride, stride), padding=(0, 0) if keras_pad else (1, 1),
              input_zp=zp, output_zp=zp, **common)
    out = qconv(d, rng, in_c=32, out_c=16, kernel=(1, 1), padding=(0, 0), input_zp=zp, output_zp=zp_in, **common)
    return tvm.IRModule.from_expr(relay.Function([x], out)), x, zp


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,keras_pad", [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_depthwise_reads_its_input_in_place(tmp_path, rng, monkeypatch, layout, stride, keras_pad, dtype):
    """The expand conv writes inside a halo of the depthwise conv's padding, the depthwise conv fills it
    and reads the tensor as its padded copy (plan.plan_halos; refcg_conv2d's in-place depthwise rows on
    the x86 variants); an int8 one stored flipped, in their uint8 domain (plan.plan_flips): bit-exact
    with TVM-only, the halo, the zero points and the conv's parameters as planned."""
    mod, x, zp = inverted_residual(layout, stride, keras_pad, dtype)
    plans = capture_plans(monkeypatch)
    inputs = {"x": random_int(rng, [int(d) for d in x.type_annotation.shape], dtype)}
    compare_with_tvm(mod, inputs, tmp_path, expect_partitions=1)
    (plan,) = plans
    halos = [s.values["halo"] for s in plan.steps if s.values.get("halo")]
    want = (0, 0, 1, 1) if keras_pad else (1, 1, 1 if stride == 1 else 0, 1 if stride == 1 else 0)
    flip = dtype == "int8"  # the test host is x86 and llvm requantizes in int64
    assert [(h["top"], h["left"], h["bottom"], h["right"], h["value"]) for h in halos] == [(*want, zp + 128 * flip)]
    expand, depthwise, project = plan.steps
    assert expand.output.halo == want and expand.output.flipped == flip and depthwise.values["params"]["pad_top"] == 0
    assert expand.values["requant"].output_zp == zp + 128 * flip == depthwise.values["params"]["input_zp"]
    # the depthwise output, read by the project conv alone, is stored flipped too; the partition's output is not
    assert depthwise.output.flipped == flip and project.values["params"]["input_zp"] == zp + 128 * flip
    assert not project.output.flipped
    assert [call.entry for call in depthwise.calls] == ["refcg_fill_halo", "refcg_conv2d"]
    h, w = 14 + want[0] + want[2], 12 + want[1] + want[3]
    stride_hw = [32 * w, 32]  # the halo's rows and pixels included
    assert depthwise.values["params"]["in_h"] == h and depthwise.values["params"]["in_w"] == w
    assert expand.values["params"]["out_stride"][1:3] == stride_hw == depthwise.values["params"]["in_stride"][1:3]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,keras_pad", [(1, False), (2, True)])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("activation", ["hardswish", "swish"])
def test_depthwise_reads_a_table_ops_output_in_place(tmp_path, rng, monkeypatch, layout, stride, keras_pad, dtype,
                                                     activation):
    """MobileNetV3's and EfficientNet's depthwise inputs come from a table op (refcg_lut): it writes its
    rows inside the halo (refcg_lut_params' out_row_stride), an int8 result flipped by its table (out_xor,
    exact under any numerics): bit-exact with TVM-only, read in place."""
    mod, x, zp = inverted_residual(layout, stride, keras_pad, dtype, activation)
    plans = capture_plans(monkeypatch)
    inputs = {"x": random_int(rng, [int(d) for d in x.type_annotation.shape], dtype)}
    compare_with_tvm(mod, inputs, tmp_path, expect_partitions=1)
    (plan,) = plans
    expand, table, depthwise, project = plan.steps
    want = (0, 0, 1, 1) if keras_pad else (1, 1, 1, 1)
    flip = dtype == "int8"
    assert expand.output.halo is None and table.output.halo == want and table.output.flipped == flip
    w = 12 + want[1] + want[3]
    assert (table.values["row_len"], table.values["out_row_stride"], table.values["out_xor"]) == \
        (12 * 32, w * 32, 0x80 * flip)
    assert [call.entry for call in depthwise.calls] == ["refcg_fill_halo", "refcg_conv2d"]
    assert depthwise.values["params"]["input_zp"] == zp + 128 * flip and depthwise.values["params"]["pad_top"] == 0


def test_float_numerics_keep_int8_unflipped(tmp_path, rng, monkeypatch):
    """A float32 requantize (an -mcpu build) rounds zero point + 128 apart from + 128: the int8 tensor in
    the halo stays int8 (the x86 depthwise rows flip its bytes as they read it in place,
    refcg_dw_config.flips), bit-exact all the same."""
    mod, x, zp = inverted_residual("NHWC", 1, False, "int8")
    plans = capture_plans(monkeypatch)
    inputs = {"x": random_int(rng, [int(d) for d in x.type_annotation.shape], "int8")}
    compare_with_tvm(mod, inputs, tmp_path, target="llvm -mcpu=haswell", expect_partitions=1,
                     partition_target=True)
    (plan,) = plans
    assert plan.steps[0].output.halo == (1, 1, 1, 1) and not plan.steps[0].output.flipped
    assert plan.steps[1].values["halo"]["value"] == zp


def residual_blocks():
    """int8 NHWC: conv a -> conv b -> c = qnn.add(a, b) -> conv d -> e = qnn.mul(c, d) + clip -> conv out,
    and a max pool of e (a second output): every zero point and scale its own."""
    from examples.networks import qconv

    rng = np.random.default_rng(47)
    x = relay.var("x", shape=(1, 8, 9, 16), dtype="int8")
    common = dict(layout="NHWC", per_channel=True, weight_range=(-40, 40), input_scale=0.05, output_scale=0.05)
    a = qconv(x, rng, in_c=16, out_c=16, kernel=(1, 1), padding=(0, 0), input_zp=4, output_zp=-5, **common)
    b = qconv(a, rng, in_c=16, out_c=16, input_zp=-5, output_zp=7, **common)
    c = relay.qnn.op.add(a, b, relay.const(np.float32(0.05)), relay.const(-5), relay.const(np.float32(0.05)),
                         relay.const(7), relay.const(np.float32(0.08)), relay.const(3))
    d = qconv(c, rng, in_c=16, out_c=16, kernel=(1, 1), padding=(0, 0), input_zp=3, output_zp=-9, **common)
    e = relay.qnn.op.mul(c, d, relay.const(np.float32(0.08)), relay.const(3), relay.const(np.float32(0.05)),
                         relay.const(-9), relay.const(np.float32(0.04)), relay.const(2))
    e = relay.clip(e, -100, 100)
    out = qconv(e, rng, in_c=16, out_c=8, kernel=(1, 1), padding=(0, 0), input_zp=2, output_zp=1, **common)
    pool = relay.nn.max_pool2d(e, pool_size=(2, 2), strides=(2, 2), layout="NHWC")
    return tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([out, pool]))), x


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=haswell"])
def test_residual_block_outputs_flipped(tmp_path, rng, monkeypatch, target):
    """A residual block's output, which its add and the next block's expand conv read, stored flipped in
    int64 numerics (plan.plan_flips: binary ops read and write flipped there), so the conv reads it in
    place: bit-exact with TVM-only; a tensor a max pool reads too stays int8, and so does everything
    under float numerics (an -mcpu build)."""
    mod, x = residual_blocks()
    plans = capture_plans(monkeypatch)
    inputs = {"x": random_int(rng, (1, 8, 9, 16), "int8")}
    compare_with_tvm(mod, inputs, tmp_path, target=target, expect_partitions=1, partition_target=True)
    (plan,) = plans
    assert [s.family for s in plan.steps] == ["conv2d", "conv2d", "binary", "conv2d", "binary", "conv2d", "pool2d"]
    a, b, c, d, e, out, pool = plan.steps
    flip = target == "llvm"  # the test host is x86 and llvm requantizes in int64
    assert [s.output.flipped for s in (a, b, c, d, e, out, pool)] == [flip] * 4 + [False] * 3
    add, mul = c.values["params"], e.values["params"]
    want_dtype = "REFCG_U8" if flip else "REFCG_S8"
    assert (add["a_dtype"], add["b_dtype"], add["out_dtype"], mul["a_dtype"], mul["b_dtype"]) == (want_dtype,) * 5
    assert (add["a_zp"], add["b_zp"], add["out_zp"], mul["a_zp"], mul["b_zp"]) == \
        (-5 + 128 * flip, 7 + 128 * flip, 3 + 128 * flip, 3 + 128 * flip, -9 + 128 * flip)
    assert (mul["out_dtype"], mul["out_zp"], mul["out_min"], mul["out_max"]) == ("REFCG_S8", 2, -100, 100)
    assert d.values["params"]["input_zp"] == 3 + 128 * flip and out.values["params"]["input_zp"] == 2
