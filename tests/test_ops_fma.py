"""Float requantize at rounding boundaries (tests/fma_cases.py) against TVM-only, bit-exact: conv,
dense, requantize, qnn.mul and qnn.add, per-tensor and per-channel, under targets whose LLVM code
fuses the multiply-add (FMA) and targets that do not, with and without sse4.1 (numerics.float_form)."""
import numpy as np
import pytest
from tvm import relay

import fma_cases as fc
from conftest import random_int
from test_ops_common import NUMERICS, Cases, const

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
    for (zp, _), (s_lhs, s_out, acc) in fc.ADD.items():
        ratio = np.float64(fc.f32(s_lhs)) / np.float64(fc.f32(s_out))
        offset = -int(round(acc * ratio)) - zp  # the rhs contribution that centres the sum
        zb = -128 if offset > 0 else 127
        lhs, rhs = cases.var((1, 8), "int8", rng), cases.var((1, 8), "int8", rng)
        cases.inputs[lhs.name_hint] = np.full((1, 8), acc + fc.ADD_ZP_LHS, np.int8)
        cases.inputs[rhs.name_hint] = np.clip(zb + offset + np.arange(-4, 4), -128, 127).astype(np.int8)[None]
        cases.add(relay.qnn.op.add(lhs, rhs, const(fc.f32(s_lhs)), const(fc.ADD_ZP_LHS, "int32"),
                                   const(fc.f32(s_out)), const(zb, "int32"), const(fc.f32(s_out)),
                                   const(zp, "int32")))


@pytest.mark.parametrize("numerics", FMA_NUMERICS)
def test_float_requantize_boundaries_match_tvm(tmp_path, rng, numerics):
    cases = Cases()
    conv_cases(cases, rng)
    dense_cases(cases, rng)
    requantize_cases(cases, rng)
    binary_cases(cases, rng)
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

