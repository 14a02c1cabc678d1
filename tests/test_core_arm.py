"""aarch64 variants of the C core (NEON smull/sadalp, NEON sdot): the x86 host computes the
reference outputs through cffi, writes them with the packed data into a C program, the cross
compiler builds it with the bundled core (-Wall -Wextra -Werror), and qemu-user runs it under
each variant, and on a cortex-a53 (no dotprod) where the dispatcher must pick plain NEON."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from core_cffi import DTYPE_CODE, Binary, Conv2D, Core, Dense
from refcodegen.emit import bundled_core, c_ints
from refcodegen.numerics import MODES, FloatLowering, make_requantize

import fma_cases as fc
from test_core_kernels import GATHER_CASES, full_range, gather_case

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
pytestmark = pytest.mark.skipif(not (CROSS and QEMU), reason="needs aarch64-linux-gnu-gcc and qemu-aarch64")


def c_value(value) -> str:
    """A C initializer: designated for dicts (field names as the header spells them), braced lists."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f".{k} = {c_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "{ " + ", ".join(c_value(v) for v in value) + " }"
    return str(value)


def c_float(v) -> str:
    """A float32 as a C constant expression that compiles to its exact bits (NaN and infinities too)."""
    v = np.float32(v)
    if np.isnan(v):
        return "__builtin_nanf(\"\")"
    if np.isinf(v):
        return "__builtin_inff()" if v > 0 else "-__builtin_inff()"
    return float(v).hex() + "f"


def c_struct(core, ctype: str, name: str, value) -> str:
    """``static const ctype name = {.field = ...}``; value: a dict or a cffi struct of that type."""
    fields = [field for field, _ in core.ffi.typeof(ctype).fields]
    if not isinstance(value, dict):  # a cffi struct: every field, arrays as lists
        value = {f: list(v) if isinstance(v, core.ffi.CData) else v for f in fields for v in [getattr(value, f)]}
    assert set(value) <= set(fields), set(value) - set(fields)
    return f"static const {ctype} {name} = {c_value(value)};\n"


def c_array(ctype: str, name: str, values) -> str:
    values = np.asarray(values).reshape(-1)
    return f"static const {ctype} {name}[{max(values.size, 1)}] = {{ {c_ints(values) if values.size else '0'} }};\n"


def requant_init(name: str, rq) -> tuple[str, dict]:
    """The arrays a refcg_requant points to (named after name) and its initializer's fields."""
    arrays = (c_array("int32_t", f"{name}_m", rq.multipliers) + c_array("int32_t", f"{name}_s", rq.shifts)
              + f"static const float {name}_f[] = {{ {', '.join(repr(float(v)) + 'f' for v in rq.scales_f32)} }};\n"
              + f"static const double {name}_d[] = {{ {', '.join(repr(float(v)) for v in rq.scales_f64)} }};\n")
    return arrays, dict(
        mode=rq.mode, per_channel=int(rq.per_channel), identity=int(rq.identity), input_zp=rq.input_zp,
        output_zp=rq.output_zp, out_min=rq.out_min, out_max=rq.out_max, multiplier=f"{name}_m",
        shift=f"{name}_s", scale_f32=f"{name}_f", scale_f64=f"{name}_d", fused=int(rq.fused),
        round_emulated=int(rq.round_emulated), addend_f32=f"{rq.addend!r}f", post_f32=f"{rq.post!r}f",
        addend_f64=repr(rq.addend), post_f64=repr(rq.post))


def emit_requant(core, name: str, rq) -> str:
    arrays, fields = requant_init(name, rq)
    return arrays + c_struct(core, "refcg_requant", name, fields)


def emit_conv(core, i: int, conv: Conv2D, x, rq, bias, want) -> str:
    f = conv.fast_data
    text = emit_requant(core, f"rq{i}", rq) + c_array("int8_t", f"w{i}", conv.weight) + c_array("int32_t", f"b{i}", bias)
    text += c_array("int8_t" if x.dtype == np.int8 else "uint8_t", f"x{i}", x) + c_array("int8_t", f"want{i}", want)
    text += c_struct(core, "refcg_conv2d_params", f"p{i}", conv.p)
    if f.gemm is not None:
        g = f.gemm
        text += c_array("int8_t", f"gw{i}", g.w) + c_array("int32_t", f"gu{i}", g.corr_u8) + c_array("int32_t", f"gs{i}", g.corr_s8)
        fast = dict(gemm=dict(kp=g.kp, np=g.np, w=f"gw{i}", corr_u8=f"gu{i}", corr_s8=f"gs{i}"))
    else:
        text += (c_array("int16_t", f"dw{i}", f.dw_w) + c_array("int32_t", f"du{i}", f.dw_corr_u8)
                 + c_array("int32_t", f"ds{i}", f.dw_corr_s8))
        fast = dict(dw_w=f"dw{i}", dw_corr_u8=f"du{i}", dw_corr_s8=f"ds{i}")
    text += c_struct(core, "refcg_conv2d_fast", f"f{i}", dict(kind=f.kind, cp=f.cp, **fast))
    text += c_struct(core, "refcg_conv2d_consts", f"k{i}", dict(weight=f"w{i}", bias=f"b{i}", requant=f"rq{i}"))
    return text


def emit_dense(core, i: int, dense: Dense, x, rq, want) -> str:
    g = dense.packed
    return (emit_requant(core, f"drq{i}", rq) + c_array("int8_t", f"dgw{i}", g.w)
            + c_array("int32_t", f"dgu{i}", g.corr_u8) + c_array("int32_t", f"dgs{i}", g.corr_s8)
            + c_array("int8_t", f"dx{i}", x) + c_array("int8_t", f"dwant{i}", want)
            + c_struct(core, "refcg_gemm_weights", f"dg{i}", dict(kp=g.kp, np=g.np, w=f"dgw{i}", corr_u8=f"dgu{i}",
                                                                   corr_s8=f"dgs{i}"))
            + c_struct(core, "refcg_dense_params", f"dp{i}", dense.p))


@pytest.fixture(scope="module")
def arm_binary(tmp_path_factory):
    core = Core()
    rng = np.random.default_rng(7)
    convs, checks = [], []
    shapes = [  # layout, in_c, out_c, hw, kernel, stride, pad, groups, in_dtype
        ("NHWC", 19, 37, (9, 8), (3, 3), (1, 1), (1, 1, 1, 1), 1, "int8"),
        ("NCHW", 5, 16, (7, 11), (3, 5), (2, 1), (1, 2, 0, 1), 1, "uint8"),
        ("NHWC", 35, 35, (8, 9), (3, 3), (2, 2), (1, 1, 1, 1), 35, "int8"),
        ("NCHW", 20, 20, (9, 37), (3, 3), (1, 1), (1, 1, 1, 1), 20, "int8"),  # plane kernels, pixel tails
        ("NCHW", 7, 7, (10, 21), (5, 5), (2, 2), (2, 2, 2, 2), 7, "uint8"),
    ]
    for i, (layout, cin, cout, (h, w), kernel, stride, pad, groups, dtype) in enumerate(shapes):
        x_nhwc = full_range(rng, (1, h, w, cin), dtype)
        x = x_nhwc if layout == "NHWC" else np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))
        weight = full_range(rng, (cout, *kernel, cin // groups), "int8")
        bias = rng.integers(-20000, 20000, cout).astype(np.int32)
        mode = [("UPWARD", "int64"), ("TONEAREST", "float32"), ("UPWARD", "int64-neon")][i % 3]
        rq = make_requantize(rng.uniform(1e-4, 4e-4, cout).astype("float32"), np.float32(1.0), 0, -3, "int8", *mode)
        izp = 3 if dtype == "int8" else 120
        conv = Conv2D(core, in_shape=x.shape, layout=layout, weight_ohwi=weight, strides=stride, padding=pad,
                      groups=groups, in_dtype=dtype, input_zp=izp, bias=bias, requant=rq)
        convs.append(emit_conv(core, i, conv, x, rq, bias, conv.run(x, fast=False)))
        checks.append(f"  bad += check(\"conv{i}\", refcg_conv2d(&p{i}, &k{i}, &f{i}, x{i}, out), want{i}, sizeof(want{i}));")
    # per-tensor scales past 1 (a left shift before the multiply) in both fixed-point modes, small values
    for i, mode in enumerate([("UPWARD", "int64"), ("UPWARD", "int64-neon")], len(convs)):
        x = rng.integers(-4, 5, (1, 5, 6, 16)).astype(np.int8)
        weight = rng.integers(-1, 2, (37, 1, 1, 16)).astype(np.int8)
        bias = rng.integers(-20, 20, 37).astype(np.int32)
        rq = make_requantize(np.float32(1.7), np.float32(1.0), 0, -3, "int8", *mode)
        conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=weight, input_zp=1, bias=bias, requant=rq)
        want = conv.run(x, fast=False)
        assert len(np.unique(want)) > 8 and rq.shifts[0] > 0
        convs.append(emit_conv(core, i, conv, x, rq, bias, want))
        checks.append(f"  bad += check(\"conv{i}\", refcg_conv2d(&p{i}, &k{i}, &f{i}, x{i}, out), want{i}, sizeof(want{i}));")
    # float32 rounding boundaries (tests/fma_cases.py) fused, with TVM's non-sse4.1 rounding, as aarch64 builds
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 16, 16, 1)
    for i, rounding in enumerate(("UPWARD", "TONEAREST"), len(convs)):
        bias = fc.per_channel_accs(-128, rounding)
        rq = make_requantize(fc.per_channel_scales(-128), fc.f32(fc.S_OUT), 0, -128, "int8", rounding, "float32",
                             lowering=FloatLowering(sse41=False, fma=True))
        conv = Conv2D(core, in_shape=x.shape, layout="NHWC", weight_ohwi=np.ones((len(bias), 1, 1, 1), np.int8),
                      bias=bias, requant=rq)
        convs.append(emit_conv(core, i, conv, x, rq, bias, conv.run(x, fast=False)))
        checks.append(f"  bad += check(\"conv{i}\", refcg_conv2d(&p{i}, &k{i}, &f{i}, x{i}, out), want{i}, sizeof(want{i}));")
    x = full_range(rng, (5, 300), "int8")
    weight = full_range(rng, (70, 300), "int8")
    rq = make_requantize(rng.uniform(1e-4, 2e-4, 70).astype("float32"), np.float32(1.0), 0, 1, "int8", "UPWARD", "float32")
    dense = Dense(core, weight_nk=weight, batch=5, input_zp=-2, requant=rq)
    conv = Conv2D(core, in_shape=(1, 5, 1, 300), layout="NHWC", weight_ohwi=weight.reshape(70, 1, 1, 300),
                  input_zp=-2, requant=rq)
    convs.append(emit_dense(core, 0, dense, x, rq, conv.run(x.reshape(1, 5, 1, 300), fast=False)))
    checks.append("  bad += check(\"dense0\", refcg_dense(&dp0, &dg0, &drq0, dx0, out), dwant0, sizeof(dwant0));")
    for i, (kind, dtype) in enumerate([("max", "int8"), ("avg", "uint8")]):  # pools on NCHW planes
        x = full_range(rng, (1, 6, 13, 37), dtype)
        values = dict(batch=1, in_h=13, in_w=37, channels=6, out_h=7, out_w=19, kernel_h=3, kernel_w=3, stride_h=2,
                      stride_w=2, dilation_h=1, dilation_w=1, pad_top=1, pad_left=1, pad_bottom=1, pad_right=1,
                      is_avg=int(kind == "avg"), count_include_pad=0, in_dtype=DTYPE_CODE[dtype],
                      out_dtype=DTYPE_CODE[dtype], in_stride=[6 * 13 * 37, 37, 1, 13 * 37],
                      out_stride=[6 * 7 * 19, 19, 1, 7 * 19])
        p = core.ffi.new("refcg_pool2d_params*", values)
        want = np.empty((1, 6, 7, 19), dtype)
        assert core.lib.refcg_pool2d_ref(p, core.ffi.from_buffer(x), core.ffi.from_buffer(want)) == 0
        convs.append(c_array("int8_t" if dtype == "int8" else "uint8_t", f"px{i}", x) + c_array("int8_t", f"pwant{i}", want.view(np.int8))
                     + c_struct(core, "refcg_pool2d_params", f"pp{i}", values))
        checks.append(f"  bad += check(\"pool{i}\", refcg_pool2d(&pp{i}, px{i}, out), pwant{i}, sizeof(pwant{i}));")
    for i, (outer, reduce, inner, dtype) in enumerate([(2, 785, 24, "int8"), (1, 49, 300, "uint8")]):  # means
        x = full_range(rng, (outer, reduce, inner), dtype)
        values = dict(outer=outer, reduce=reduce, inner=inner, is_mean=1, in_dtype=DTYPE_CODE[dtype],
                      out_dtype=DTYPE_CODE[dtype])
        p = core.ffi.new("refcg_reduce_params*", values)
        want = np.empty((outer, inner), dtype)
        assert core.lib.refcg_reduce_ref(p, core.ffi.from_buffer(x), core.ffi.from_buffer(want)) == 0
        convs.append(c_array("int8_t" if dtype == "int8" else "uint8_t", f"rx{i}", x)
                     + c_array("int8_t", f"rwant{i}", want.view(np.int8)) + c_struct(core, "refcg_reduce_params", f"rp{i}", values))
        checks.append(f"  bad += check(\"reduce{i}\", refcg_reduce(&rp{i}, rx{i}, out), rwant{i}, sizeof(rwant{i}));")
    for i, case in enumerate(GATHER_CASES[:3] + GATHER_CASES[6:]):  # channel shuffles (tbl), random tables (bytes)
        big, values, take, want = gather_case(case)
        convs.append(c_array("uint8_t", f"gx{i}", big) + c_array("int32_t", f"gtake{i}", take)
                     + c_array("int8_t", f"gwant{i}", want.view(np.int8))
                     + c_struct(core, "refcg_copy_params", f"gp{i}",
                                dict(values, take=["NULL"] * (values["ndim"] - 1) + [f"gtake{i}"])))
        checks.append(f"  bad += check(\"gather{i}\", refcg_copy(&gp{i}, gx{i}, out), gwant{i}, sizeof(gwant{i}));")
    for i, (rows, row_len, stride, out_xor) in enumerate([(1, 4296, 4296, 0), (1, 103, 103, 0), (7, 96, 160, 0x80)]):
        table = rng.integers(0, 256, 256).astype("uint8")  # lookups: 16-byte steps, tails, rows apart
        x = rng.integers(0, 256, rows * row_len).astype("uint8")
        x[:256 if x.size >= 256 else 0] = np.arange(256 if x.size >= 256 else 0)  # every index where it fits
        want = np.full((rows, stride), 7, "uint8")
        want[:, :row_len] = (table ^ out_xor)[x].reshape(rows, row_len)
        values = dict(size=x.size, row_len=row_len, out_row_stride=stride, out_xor=out_xor)
        convs.append(c_array("uint8_t", f"lx{i}", x) + c_array("uint8_t", f"ltable{i}", table)
                     + c_array("int8_t", f"lwant{i}", want.view(np.int8)) + c_struct(core, "refcg_lut_params", f"lp{i}", values))
        checks.append(f"  bad += check(\"lut{i}\", (memset(out, 7, sizeof(lwant{i})), refcg_lut(&lp{i}, ltable{i}, lx{i}, out)),"
                      f" lwant{i}, sizeof(lwant{i}));")
    modes = list(MODES)  # (rounding, compute) pairs
    # binary ops (tabulated operands on NEON): a residual add, a channel broadcast with a row tail, the
    # requantize modes; mul in NEON lanes (both fixed-point modes), in a float mode element by element
    for i, (op, (sa, sb), (xs, ys), (rounding, compute)) in enumerate([
            ("add", (0.4728913, 0.3196284), ((1, 9, 7, 37), (1, 9, 7, 37)), modes[0]),
            ("sub", (0.7, 0.45), ((1, 5, 3, 37), (1, 1, 1, 37)), modes[1]),
            ("add", (1.7, 0.6), ((3, 4500), (4500,)), modes[3]),
            ("mul", (0.002, 0.002), ((1, 6, 5, 24), (1, 1, 1, 24)), modes[-1]),
            ("mul", (0.002, 0.002), ((1, 20, 20, 37), (1, 1, 1, 37)), modes[0]),  # widened rows, tails
            ("mul", (0.002, 0.002), ((1, 5, 3, 37), (1, 5, 3, 37)), modes[3])]):
        x, y = full_range(rng, xs, "int8"), full_range(rng, ys, "uint8")
        zps = (-3, 131, 7)
        if op == "mul":
            rq_a = rq_b = make_requantize(np.float32(sa), np.float32(1.0), 0, zps[2], "int8", rounding, compute)
        else:
            rq_a = make_requantize(np.float32(sa), np.float32(1.0), zps[0], zps[2], "int32", rounding, compute)
            rq_b = make_requantize(np.float32(sb), np.float32(1.0), zps[1], zps[2], "int32", rounding, compute)
        binary = Binary(core, op, x.shape, y.shape, x.dtype, y.dtype, "int8", rq_a, rq_b, zps, (-128, 127))
        want = binary.run(x, y, reference=True)
        assert len(np.unique(want)) > 8
        (arrays_a, rqa), (arrays_b, rqb) = requant_init(f"bra{i}", rq_a), requant_init(f"brb{i}", rq_b)
        fields = {f: list(getattr(binary.p, f)) if f in ("shape", "a_stride", "b_stride") else getattr(binary.p, f)
                  for f in ("op", "ndim", "shape", "a_stride", "b_stride", "a_dtype", "b_dtype", "out_dtype", "a_zp",
                            "b_zp", "out_zp", "out_min", "out_max")}
        convs.append(arrays_a + arrays_b + c_array("int8_t", f"bx{i}", x) + c_array("uint8_t", f"by{i}", y)
                     + c_array("int8_t", f"bwant{i}", want)
                     + c_struct(core, "refcg_binary_params", f"bp{i}", dict(fields, rq_a=rqa, rq_b=rqb)))
        checks.append(f"  bad += check(\"binary{i}\", refcg_binary(&bp{i}, bx{i}, by{i}, out), bwant{i}, sizeof(bwant{i}));")
    # 8-bit requantizes (a table looked up on NEON): contiguous, into a concatenation's rows, in place
    for i, (outer, n, stride, offset, rounding, compute) in enumerate([(1, 4103, 4103, 0, *modes[0]),
                                                                       (6, 58, 116, 58, *modes[1]),
                                                                       (3, 40, 40, 0, *modes[4])]):
        x = full_range(rng, (outer, n), "uint8")
        rq = make_requantize(np.float32(0.37), np.float32(0.41), 128, -5, "int8", rounding, compute)
        values = dict(outer=outer, channels=n, inner=1, in_dtype=DTYPE_CODE["uint8"], out_dtype=DTYPE_CODE["int8"],
                      out_outer_stride=stride, out_offset=offset)
        p = core.ffi.new("refcg_requantize_params*", values)
        p.rq = core.requant(rq)[0]
        want = np.full(outer * stride + offset, 7, "int8")
        assert core.lib.refcg_requantize_ref(p, core.ffi.from_buffer(x), core.ffi.from_buffer(want)) == 0
        assert len(np.unique(want)) > 8
        arrays, rqf = requant_init(f"qrq{i}", rq)
        convs.append(arrays + c_array("uint8_t", f"qx{i}", x) + c_array("int8_t", f"qwant{i}", want)
                     + c_struct(core, "refcg_requantize_params", f"qp{i}", dict(values, rq=rqf)))
        inplace = i == 2  # the output is the input: the lookup rows read and write each row in place
        call = (f"(memcpy(out, qx{i}, sizeof(qx{i})), refcg_requantize(&qp{i}, out, out))" if inplace else
                f"(memset(out, 7, sizeof(qwant{i})), refcg_requantize(&qp{i}, qx{i}, out))")
        checks.append(f"  bad += check(\"requantize{i}\", {call}, qwant{i}, sizeof(qwant{i}));")
    # qnn.quantize (NEON lanes): per channel dividing, per tensor multiplying by a reciprocal, half-way
    # values, NaN and infinities, chunk and row tails
    for i, (channels, inner, dtype, multiply) in enumerate([(3, 150, "int8", 0), (1, 4103, "uint8", 1)]):
        scales = np.array([0.0173, 0.021, 0.5][:channels], "float32")
        zps = np.array([-3, 0, 10][:channels] if dtype == "int8" else [128], "int32")
        x = (rng.standard_normal((channels, inner)) * 3).astype("float32")
        x[:, :40] = (np.arange(-20, 20) + 0.5).astype("float32") * scales[:, None]  # ties after the division
        x[0, 40:44] = [np.nan, np.inf, -np.inf, 1e30]
        stored = np.float32(1.0) / scales if multiply else scales
        values = dict(outer=1, channels=channels, inner=inner, quant_dtype=DTYPE_CODE[dtype], multiply=multiply)
        q = core.ffi.new("refcg_quantize_params*", values)
        scale_c, zp_c = core.ffi.from_buffer("float[]", stored), core.ffi.from_buffer("int32_t[]", zps)
        q.scale, q.zero_point = scale_c, zp_c
        want = np.empty(x.shape, dtype)
        assert core.lib.refcg_quantize_ref(q, core.ffi.cast("float*", core.ffi.from_buffer(x)), core.ffi.from_buffer(want)) == 0
        assert len(np.unique(want)) > 8
        convs.append(f"static const float fx{i}[] = {{ {', '.join(c_float(v) for v in x.reshape(-1))} }};\n"
                     + f"static const float fs{i}[] = {{ {', '.join(c_float(v) for v in stored)} }};\n"
                     + c_array("int32_t", f"fz{i}", zps) + c_array("int8_t", f"fwant{i}", want.view(np.int8))
                     + c_struct(core, "refcg_quantize_params", f"fp{i}", dict(values, scale=f"fs{i}", zero_point=f"fz{i}")))
        checks.append(f"  bad += check(\"quantize{i}\", refcg_quantize(&fp{i}, fx{i}, out), fwant{i}, sizeof(fwant{i}));")
    program = ("#include <stdio.h>\n#include <stdint.h>\n#include <string.h>\n" + bundled_core() + "\n"
               + "".join(convs) + """
static int8_t out[1 << 16];
static int check(const char* what, int status, const int8_t* want, size_t n) {
  if (status != 0 || memcmp(out, want, n) != 0) { printf("MISMATCH %s\\n", what); return 1; }
  return 0;
}
int main(void) {
  int bad = 0;
""" + "\n".join(checks) + """
  printf("isa=%s bad=%d\\n", refcg_isa_name(), bad);
  return bad;
}
""")
    work = tmp_path_factory.mktemp("arm")
    (work / "core_arm.c").write_text(program)
    exe = work / "core_arm"
    subprocess.run([CROSS, "-O2", "-ffp-contract=off", "-static", "-Wall", "-Wextra", "-Werror",  # as the prelude
                    str(work / "core_arm.c"), "-o", str(exe), "-lm"], check=True, capture_output=True)
    return exe


@pytest.mark.parametrize("cpu,isa,expect", [("max", "", "dotprod"), ("max", "neon", "neon"),
                                            ("max", "scalar", "scalar"), ("cortex-a53", "", "neon")])
def test_arm_variants_bit_exact(arm_binary, cpu, isa, expect):
    env = dict(os.environ, QEMU_CPU=cpu, REFCG_ISA=isa)
    result = subprocess.run([QEMU, str(arm_binary)], env=env, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == f"isa={expect} bad=0", result.stdout + result.stderr
