"""Float requantize at rounding boundaries (tests/fma_cases.py) against TVM-only, bit-exact: conv,
dense, requantize, qnn.mul and qnn.add, per-tensor and per-channel, under targets whose LLVM code
fuses the multiply-add (FMA) and targets that do not, with and without sse4.1 (numerics.float_form);
the convs TVM-only computes stage by stage (refcodegen/stagewise.py), with the rule read from its IR."""
import itertools
import re

import numpy as np
import pytest
import tvm
from tvm import relay

import fma_cases as fc
from conftest import random_int, slow_params
from models import module, qconv_block
from refcodegen import RefcgError, offload_report, partition_for_refcg
from test_ops_common import NUMERICS, Cases, compare, const, qadd, qparams, requantize_config
from test_ops_lut import tflite_hardswish, with_its_table_op

# (target, requantize_config); conv/dense/requantize carry both roundings as attributes,
# qnn.add/mul follow the config
FMA_NUMERICS = {
    "fma": NUMERICS["float32"],
    "fma-tonearest": ("llvm -mcpu=skylake", {"rounding": "TONEAREST"}),
    "nofma": NUMERICS["float32-nofma"],
    "no-sse41": ("llvm", {"compute_dtype": "float32"}),  # TVM's floor/round emulations, no fold
    "fma-float64": ("llvm -mcpu=haswell", {"compute_dtype": "float64"}),
}
ROUNDINGS = ("UPWARD", "TONEAREST")


def requantize(x, in_scale, out_zp, out_dtype="int8", axis=-1, rounding="None", in_zp=0):
    return relay.qnn.op.requantize(x, relay.const(np.asarray(in_scale, "float32")), const(in_zp, "int32"),
                                   const(fc.f32(fc.S_OUT)), const(out_zp, "int32"), axis=axis,
                                   rounding=rounding, out_dtype=out_dtype)


def all_int8(shape):
    """Every int8 value, repeated to fill ``shape``: acc = bias + x reaches bias itself."""
    return np.resize(np.arange(-128, 128, dtype=np.int8), shape)


def conv_cases(cases: Cases, rng):
    """1x1 NHWC conv of one input channel with unit weights: channel k accumulates bias[k] + x."""
    def conv(in_scale, bias, zp, rounding):
        x = cases.var((1, 16, 16, 1), "int8", rng)
        cases.inputs[x.name_hint] = all_int8((1, 16, 16, 1))
        w = relay.const(np.ones((1, 1, 1, len(bias)), np.int8))
        y = relay.qnn.op.conv2d(x, w, const(0, "int32"), const(0, "int32"), const(1.0), const(1.0),
                                kernel_size=(1, 1), channels=len(bias), data_layout="NHWC", kernel_layout="HWIO")
        y = relay.nn.bias_add(y, relay.const(np.asarray(bias, np.int32)), axis=3)
        cases.add(requantize(y, in_scale, zp, axis=3, rounding=rounding))

    for zp in fc.PER_CHANNEL:  # (module size: each case once, per channel or per tensor)
        for rounding in ROUNDINGS:
            if zp == -128:
                conv(fc.per_channel_scales(zp), fc.per_channel_accs(zp, rounding), zp, rounding)
            else:
                conv(fc.f32(fc.PER_TENSOR_SCALE), fc.PER_TENSOR[zp][rounding], zp, rounding)


def dense_cases(cases: Cases, rng):
    """qnn.dense with one input feature and unit weights: unit u accumulates bias[u] + x."""
    for zp in (5,):
        for rounding in ROUNDINGS:
            bias = fc.per_channel_accs(zp, rounding)
            x = cases.var((256, 1), "int8", rng)
            cases.inputs[x.name_hint] = all_int8((256, 1))
            y = relay.qnn.op.dense(x, relay.const(np.ones((len(bias), 1), np.int8)), const(0, "int32"),
                                   const(0, "int32"), const(1.0), const(1.0), units=len(bias))
            y = relay.nn.bias_add(y, relay.const(bias), axis=1)
            cases.add(requantize(y, fc.per_channel_scales(zp), zp, axis=1, rounding=rounding))


def requantize_cases(cases: Cases, rng):
    """Boundary accumulators per channel (axis 1) and per tensor; int32 outputs of full-range
    accumulators with a ratio near 0.7, where (x*m + zp) + 0.5 and x*m + (zp + 0.5) differ."""
    for rounding in ROUNDINGS:
        accs = fc.per_channel_accs(5, rounding)
        x = cases.var((3, len(accs)), "int32", rng)
        cases.inputs[x.name_hint] = accs + np.arange(-1, 2, dtype=np.int32)[:, None]
        cases.add(requantize(x, fc.per_channel_scales(5), 5, axis=1, rounding=rounding))
        accs = np.asarray(fc.PER_TENSOR[-128][rounding], np.int32)
        x = cases.var((1, len(accs)), "int32", rng)
        cases.inputs[x.name_hint] = accs[None]
        cases.add(requantize(x, fc.f32(fc.PER_TENSOR_SCALE), -128, rounding=rounding))
        x = cases.var((2, 4096), "int32", rng)
        cases.add(requantize(x, np.float32(0.0164706), 5, "int32", rounding=rounding, in_zp=7))


def binary_cases(cases: Cases, rng):
    """qnn.mul on the boundary product (plus random pairs); qnn.add on each stored boundary, its
    other operand at the output scale (no multiply) keeping the sum inside int8."""
    a, b = cases.var((1, 64), "int8", rng), cases.var((1, 64), "int8", rng)
    cases.inputs[a.name_hint][0, :2] = fc.MUL_PAIR
    cases.inputs[b.name_hint][0, :2] = fc.MUL_PAIR[::-1]
    sa, sb, so = (const(fc.f32(bits)) for bits in fc.MUL_SCALES)
    cases.add(relay.qnn.op.mul(a, b, sa, const(0, "int32"), sb, const(0, "int32"), so, const(fc.MUL_ZP, "int32")))
    # a constant lhs too: TVM-only folds its requantize when it builds, on the host target (no FMA)
    for ((zp, _), (s_lhs, s_out, acc)), constant in itertools.product(fc.ADD.items(), (False, True)):
        ratio = np.float64(fc.f32(s_lhs)) / np.float64(fc.f32(s_out))
        offset = -int(round(acc * ratio)) - zp  # the rhs contribution that centres the sum
        zb = -128 if offset > 0 else 127
        boundary = np.full((1, 8), acc + fc.ADD_ZP_LHS, np.int8)
        lhs = relay.const(boundary) if constant else cases.var((1, 8), "int8", rng)
        rhs = cases.var((1, 8), "int8", rng)
        if not constant:
            cases.inputs[lhs.name_hint] = boundary
        cases.inputs[rhs.name_hint] = np.clip(zb + offset + np.arange(-4, 4), -128, 127).astype(np.int8)[None]
        cases.add(relay.qnn.op.add(lhs, rhs, const(fc.f32(s_lhs)), const(fc.ADD_ZP_LHS, "int32"),
                                   const(fc.f32(s_out)), const(zb, "int32"), const(fc.f32(s_out)),
                                   const(zp, "int32")))


@pytest.mark.parametrize("numerics", slow_params(FMA_NUMERICS, "fma-tonearest", "no-sse41", "fma-float64"))
def test_float_requantize_boundaries_match_tvm(tmp_path, rng, numerics):
    cases = Cases()
    conv_cases(cases, rng)
    dense_cases(cases, rng)
    requantize_cases(cases, rng)
    binary_cases(cases, rng)
    stagewise_conv_cases(cases, rng)
    cases.compare(tmp_path, FMA_NUMERICS[numerics])


def test_boundary_cases_separate_fused_and_unfused():
    """Each stored case is a real boundary: numpy's float64 evaluation of both forms (exact here:
    the product has 48 bits and the sum stays within 53) gives different integers."""
    def forms(acc, m, zp, rounding):
        x, m = np.float64(np.float32(acc)), np.float64(m)
        addend = zp + (0.5 if rounding == "UPWARD" else 0.0)
        fused = np.float32(x * m + addend)  # one rounding (x * m exact in float64)
        split = np.float32(np.float64(np.float32(x * m)) + addend)
        rnd = np.floor if rounding == "UPWARD" else lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5)
        return rnd(fused), rnd(split)

    def ratio(bits):
        return np.float32(np.float64(fc.f32(bits)) / np.float64(fc.f32(fc.S_OUT)))

    checked = 0
    for zp, channels in fc.PER_CHANNEL.items():
        for bits, *accs in channels:
            for rounding, acc in zip(ROUNDINGS, accs):
                fused, split = forms(acc, ratio(bits), zp, rounding)
                assert fused != split, (zp, bits, rounding, acc)
                checked += 1
        for rounding, accs in fc.PER_TENSOR[zp].items():
            for acc in accs:
                fused, split = forms(acc, ratio(fc.PER_TENSOR_SCALE), zp, rounding)
                assert fused != split and -128 <= min(fused, split) and max(fused, split) <= 127
                checked += 1
    assert checked == 2 * 16 + 20



def stagewise_conv_cases(cases: Cases, rng):
    """1x1 convs TVM-only schedules stage by stage on x86 (stagewise.conv_stagewise): depthwise NHWC,
    grouped NHWC and dilated depthwise NCHW; unit weights make channel k accumulate bias[k] + x[k]."""
    for zp in fc.PER_CHANNEL:
        for rounding in ROUNDINGS:
            bias, channels = fc.per_channel_accs(zp, rounding), len(fc.PER_CHANNEL[zp])
            for layout, groups, dilation in (("NHWC", channels, 1), ("NHWC", channels // 2, 1), ("NCHW", channels, 2)):
                per_group, axis = channels // groups, layout.index("C")
                one = all_int8((1, 16, 16, 1) if layout == "NHWC" else (1, 1, 16, 16))
                x = cases.var(np.broadcast_shapes(one.shape, (1, 1, 1, channels) if axis == 3 else (1, channels, 1, 1)),
                              "int8", rng)
                cases.inputs[x.name_hint] = np.broadcast_to(one, x.type_annotation.concrete_shape).copy()
                unit = (np.arange(per_group)[:, None] == np.arange(channels)[None, :] % per_group).astype(np.int8)
                if layout == "NCHW":
                    weight, kernel_layout = unit.T[:, :, None, None], "OIHW"
                elif groups == channels:
                    weight, kernel_layout = unit.T.reshape(1, 1, channels, 1), "HWOI"  # TFLite's depthwise
                else:
                    weight, kernel_layout = unit[None, None], "HWIO"
                y = relay.qnn.op.conv2d(x, relay.const(weight), const(0, "int32"), const(0, "int32"), const(1.0),
                                        const(1.0), kernel_size=(1, 1), channels=channels, groups=groups,
                                        dilation=(dilation, dilation), data_layout=layout, kernel_layout=kernel_layout)
                y = relay.nn.bias_add(y, relay.const(bias), axis=axis)
                cases.add(requantize(y, fc.per_channel_scales(zp), zp, axis=axis, rounding=rounding))


ARM_NEON = "llvm -keys=arm_cpu,cpu -device=arm_cpu -mattr=+neon -mtriple=aarch64-linux-gnu"
# (target, layout, kernel layout, in channels, groups, dilation): one row per branch of conv_stagewise
STAGEWISE_BRANCHES = [
    ("llvm -mcpu=skylake", "NHWC", "HWOI", 8, 8, 1), ("llvm -mcpu=skylake", "NHWC", "HWIO", 8, 4, 1),
    ("llvm -mcpu=skylake", "NHWC", "HWIO", 8, 1, 1), ("llvm -mcpu=skylake", "NCHW", "OIHW", 8, 8, 1),
    ("llvm -mcpu=skylake", "NCHW", "OIHW", 8, 8, 2), ("llvm -mcpu=skylake", "NCHW", "OIHW", 8, 4, 2),
    (ARM_NEON, "NHWC", "HWIO", 8, 4, 1), (ARM_NEON, "NHWC", "HWOI", 8, 8, 1), (ARM_NEON, "NHWC", "HWIO", 8, 8, 1),
    (ARM_NEON, "NCHW", "OIHW", 8, 8, 2),
]


@pytest.mark.parametrize("target,layout,kernel_layout,channels,groups,dilation", STAGEWISE_BRANCHES)
def test_stagewise_rule_reads_like_tvm_llvm_ir(target, layout, kernel_layout, channels, groups, dilation):
    """conv_stagewise against TVM-only's LLVM IR of a 3x3 conv + float32 requantize (UPWARD, zp 5: a
    multiply and an add): inlined, the two are one llvm.fmuladd; stage by stage, an fmul stored apart."""
    from refcodegen.stagewise import conv_stagewise

    shape = (1, 8, 8, channels) if layout == "NHWC" else (1, channels, 8, 8)
    dims = {"O": channels, "I": channels // groups, "H": 3, "W": 3}
    if kernel_layout == "HWOI":
        dims = {"H": 3, "W": 3, "O": channels, "I": 1}
    weight = np.ones([dims[d] for d in kernel_layout], np.int8)
    x = relay.var("x", shape=shape, dtype="int8")
    conv = relay.qnn.op.conv2d(x, relay.const(weight), const(3, "int32"), const(0, "int32"), const(0.05),
                               const(0.01), kernel_size=(3, 3), channels=channels, groups=groups, padding=(1, 1),
                               dilation=(dilation, dilation), data_layout=layout, kernel_layout=kernel_layout)
    y = relay.qnn.op.requantize(conv, const(0.0005), const(0, "int32"), const(0.1), const(5, "int32"),
                                rounding="UPWARD", compute_dtype="float32", axis=layout.index("C"))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    with tvm.transform.PassContext(opt_level=3):
        ir = relay.build(mod, target=target).get_lib().get_source("ll")
    fused = re.search(r"call [^\n]*@llvm\.fmuladd", ir) is not None
    stagewise_ir = not fused and " = fmul " in ir
    assert fused != stagewise_ir, "neither form in the IR"
    rule = conv_stagewise(tvm.target.Target(target), mod["main"].body.args[0])
    assert (rule is not None) == stagewise_ir, (rule, target)


def test_what_a_stagewise_conv_kernel_computes_stays_in_tvm_with_it(tmp_path, rng):
    """A depthwise NHWC conv read by a qnn.add: on an FMA target TVM-only computes the add's requantizes
    in the conv's kernel, stage by stage, where refcg's add kernel would fuse them: both stay in TVM.
    A depthwise conv read by nothing that rounds is offloaded; without FMA nothing stays."""
    x, other, lone = (relay.var(n, shape=(1, 8, 8, 16), dtype="int8") for n in ("x", "other", "lone"))
    inputs = {v.name_hint: random_int(rng, (1, 8, 8, 16), "int8") for v in (x, other, lone)}

    def dw(data):
        return qconv_block(data, rng, in_c=16, out_c=16, groups=16, layout="NHWC", per_channel=True,
                           output_zp=5, rounding="UPWARD", input_scale=0.05, output_scale=0.1)

    mod = module([x, other, lone], relay.Tuple([qadd(dw(x), other, 0.1, 5, 0.1, 0, 0.2, 3), dw(lone)]))
    (tmp_path / "fma").mkdir(), (tmp_path / "nofma").mkdir()
    report = offload_report(compare(mod, inputs, tmp_path / "fma", "float32", partition_target=True))
    reasons = {name: reason for name, _, reason in report.stayed}
    assert "also computes the refcg.binary after it" in reasons["qnn.conv2d"], report
    assert "stays in TVM with the conv" in reasons["qnn.add"], report
    assert report.offloaded_ops["qnn.conv2d"] == 1, report
    report = offload_report(compare(mod, inputs, tmp_path / "nofma", "float32-nofma", partition_target=True))
    assert report.offloaded_ops["qnn.conv2d"] == 2 and "qnn.add" not in report.stayed_ops, report
    # partitioned without the target, the FMA build refuses instead of rounding the add wrongly
    with pytest.raises(RefcgError, match="stage by stage.*pass target="):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(mod), target=NUMERICS["float32"][0])


def test_a_stagewise_conv_left_in_tvm_is_seen_without_the_target(tmp_path, rng):
    """A depthwise NHWC conv TVM keeps (its weight is a run-time input) read by a requantize: TVM-only
    computes the requantize in the conv's stage-by-stage kernel. Given the FMA target, the requantize
    stays in TVM with it; partitioned without it, the FMA build refuses (the partition records which
    inputs such a TVM kernel may compute); without FMA it is offloaded. Bit-exact where built."""
    x, w, other = relay.var("x", shape=(1, 8, 8, 16), dtype="int8"), relay.var("w", shape=(3, 3, 16, 1), dtype="int8"), \
        relay.var("other", shape=(1, 8, 8, 16), dtype="int8")
    inputs = {"x": random_int(rng, (1, 8, 8, 16), "int8"), "w": random_int(rng, (3, 3, 16, 1), "int8"),
              "other": random_int(rng, (1, 8, 8, 16), "int8")}
    conv = relay.qnn.op.conv2d(x, w, const(3, "int32"), const(0, "int32"), const(0.05), const(0.01), kernel_size=(3, 3),
                               channels=16, groups=16, padding=(1, 1), data_layout="NHWC", kernel_layout="HWOI")
    y = relay.qnn.op.requantize(conv, const(0.0005), const(0, "int32"), const(0.1), const(5, "int32"), axis=3,
                                rounding="UPWARD", compute_dtype="float32")
    mod = module([x, w, other], relay.Tuple([y, qadd(other, other, 0.1, 5, 0.1, 5, 0.2, 3)]))
    (tmp_path / "fma").mkdir(), (tmp_path / "nofma").mkdir()
    report = offload_report(compare(mod, inputs, tmp_path / "fma", "float32", partition_target=True))
    reasons = {name: reason for name, _, reason in report.stayed}
    assert "stays in TVM with the conv" in reasons["qnn.requantize"], report
    with pytest.raises(RefcgError, match="input .* left in TVM.*pass target="):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(mod), target=NUMERICS["float32"][0])
    report = offload_report(compare(mod, inputs, tmp_path / "nofma", "float32-nofma"))
    assert report.offloaded_ops["qnn.requantize"] == 1 and "needs constant weights" in str(report), report


# TFLite hard-swish qparams (dequantize scale and zero point, quantize scale and zero point) whose table
# differs at one value between a kernel that contracts the gate's x * s + 3 into one fma and one that
# rounds every stage apart (constant divisors become reciprocal multiplies in both): found by emulating
# the two in numpy float32
HARDSWISH_APART = (0.0669958, -9, 0.056886937, 0)


def test_a_table_op_in_a_stagewise_conv_kernel_is_computed_as_that_kernel_does(tmp_path, rng):
    """A depthwise NHWC conv read only by a hard-swish (TFLite form), on an FMA target: TVM-only computes
    the hard-swish in the conv's kernel, every stage rounded apart. Given the target, refcg offloads both
    and computes the table in such a kernel, bit-exact: the identity conv passes every 8-bit value, one of
    which a table computed in a kernel of its own gets wrong; so is a swish (EfficientNet's qnn.mul of a
    tensor and its sigmoid, one table there). A hard-swish read by a conv and a qnn.add
    ends the kernel too (MobileNetV3's squeeze-excite: a mean and a qnn.mul): all offloaded; read by two
    qnn.adds, where the kernel ends is not settled: the conv stays in TVM with them. Without the target
    the codegen computes the table as well (the partition shows where the kernel ends), and refuses the
    unsettled case."""
    from refcodegen import lut
    from refcodegen.stagewise import STAGEWISE_TABLE_ATTR

    s_in, zp_in, s_out, zp_out = HARDSWISH_APART

    def hardswish(y):
        return relay.qnn.op.quantize(tflite_hardswish(relay.qnn.op.dequantize(y, *qparams(s_in, zp_in))),
                                     *qparams(s_out, zp_out), out_dtype="int8")

    x = relay.var("x", shape=(1, 1, 16, 16), dtype="int8")
    weight = np.zeros((3, 3, 16, 1), "int8")
    weight[1, 1] = 1
    conv = relay.qnn.op.conv2d(x, relay.const(weight), const(0, "int32"), const(0, "int32"), const(0.5), const(2.0),
                               kernel_size=(3, 3), channels=16, groups=16, padding=(1, 1), data_layout="NHWC",
                               kernel_layout="HWOI")
    identity = relay.qnn.op.requantize(conv, const(1.0), const(0, "int32"), const(1.0), const(0, "int32"), axis=3,
                                       rounding="UPWARD", compute_dtype="float32")
    inputs = {"x": np.arange(256, dtype="uint8").view("int8").reshape(1, 1, 16, 16)}
    for name in ("one", "more", "untold"):
        (tmp_path / name).mkdir()
    mod = module([x], hardswish(identity))
    report = offload_report(compare(mod, inputs, tmp_path / "one", "float32", partition_target=True))
    assert not report.stayed_ops and report.offloaded_ops["qnn.conv2d"] == 1, report

    def dw_hardswish(data):
        return hardswish(qconv_block(data, rng, in_c=16, out_c=16, groups=16, layout="NHWC", per_channel=True,
                                     rounding="UPWARD", input_scale=0.05, output_scale=0.1))

    y, z = dw_hardswish(x), dw_hardswish(x)
    swish = with_its_table_op(qconv_block(x, rng, in_c=16, out_c=16, groups=16, layout="NHWC", per_channel=True,
                                          rounding="UPWARD", input_scale=0.05, output_scale=0.07), "int8", "qnn.mul",
                              table_first=False, qnn_form=False)  # EfficientNet's
    pointwise = qconv_block(y, rng, in_c=16, out_c=8, kernel=(1, 1), padding=(0, 0), layout="NHWC",
                            input_scale=s_out, input_zp=zp_out, rounding="UPWARD")
    ends = [pointwise, qadd(y, x, s_out, zp_out, 0.1, 0, 0.2, 3)]
    unsettled = [qadd(z, x, s_out, zp_out, 0.1, 0, 0.2, 3), qadd(z, x, s_out, zp_out, 0.1, 0, 0.3, -2)]
    report = offload_report(compare(module([x], relay.Tuple(ends + unsettled + [swish])), inputs, tmp_path / "more",
                                    "float32", partition_target=True))
    assert report.offloaded_ops["qnn.conv2d"] == 3 and report.stayed_ops["qnn.conv2d"] == 1, report
    assert report.offloaded_ops["qnn.add"] == 1 and report.stayed_ops["qnn.add"] == 2, report
    assert report.offloaded_ops["qnn.mul"] == 1, report

    # the case separates the two kernels: the table of a kernel of its own differs at value 14
    target, config = NUMERICS["float32"]
    v = relay.var("v", shape=(1, 1, 16, 16), dtype="int8")
    table_op = relay.transform.InferType()(module([v], hardswish(v)))["main"]
    with requantize_config(target, config):
        apart = lut.lookup_table(table_op.with_attr(STAGEWISE_TABLE_ATTR, 1), target)
        alone = lut.lookup_table(table_op, target)
    assert list(np.nonzero(apart != alone)[0]) == [14], (apart, alone)

    # without the target the codegen finds that kernel in the partition: the same table
    compare(mod, inputs, tmp_path / "untold", "float32")
    with pytest.raises(RefcgError, match="stage by stage.*pass target="):
        with requantize_config(target, config), tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(module([x], relay.Tuple(unsettled))), target=target)
