"""AddressSanitizer + UndefinedBehaviorSanitizer over the C core (cffi) and exported models.

The instrumented code runs in a child Python with libasan preloaded (Python itself is not
instrumented); any report makes the child exit non-zero (``-fno-sanitize-recover=all``) and the
test shows its stderr. Every kernel variant this host supports runs (refcg_set_isa in the cffi
build; REFCG_ISA and a fresh copy of the library per variant in exported models).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import build_and_load, run
from refcodegen import offload_report, partition_for_refcg
from refcodegen.partition import refcg_functions
from core_cffi import Core, avxvnni_as_evex, header_cdef
from refcodegen.emit import bundled_core
from fuzzing.chains import ChainSpec, build_batch
from fuzzing.check import merge_partitions

pytestmark = pytest.mark.slow  # make test-slow (CI): minutes of builds

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def libasan() -> str:
    path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(path):
        pytest.fail(f"gcc has no libasan.so ({path!r}): install the gcc sanitizer runtime")
    return path


def run_sanitized(script: str, cwd: Path) -> str:
    """Run ``script`` in a child Python under ASan/UBSan; fail with its stderr on any report."""
    env = dict(os.environ, LD_PRELOAD=libasan(), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=99",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=98", PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=600)
    report = child.stderr[-6000:]
    assert child.returncode == 0, f"exit {child.returncode}\n{report}"
    assert "AddressSanitizer" not in child.stderr and "runtime error:" not in child.stderr, report
    return child.stdout


def test_the_harness_catches_a_heap_overflow(tmp_path):
    """The check itself: an off-by-one read in instrumented code fails the child."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int read_past(int n);")
    ffi.set_source("_refcg_asan_probe", "#include <stdlib.h>\nint read_past(int n) { int* p = malloc(n * sizeof(int));"
                   " for (int i = 0; i < n; ++i) p[i] = i; int v = p[n]; free(p); return v; }",
                   extra_compile_args=SANITIZE, extra_link_args=SANITIZE[:1])
    so = ffi.compile(tmpdir=str(tmp_path), verbose=False)
    script = f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("_refcg_asan_probe", {so!r})
        module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
        print(module.lib.read_past(5))
    """
    with pytest.raises(AssertionError, match="heap-buffer-overflow"):
        run_sanitized(script, tmp_path)


def test_core_under_sanitizers(tmp_path):
    """Every variant against the scalar reference on conv (plain, strided, grouped, depthwise, NCHW/NHWC,
    uint8) and dense shapes with odd sizes and tails, compiled with -fsanitize=address,undefined."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(header_cdef())
    evex = "#define REFCG_AVXVNNI_AS_EVEX\n" if avxvnni_as_evex() else ""  # the AVX-VNNI variant runs here too
    ffi.set_source("_refcg_core_sanitized", evex + "#include <stdint.h>\n#include <stddef.h>\n" + bundled_core(),
                   extra_compile_args=["-O1", "-ffp-contract=off", *SANITIZE], extra_link_args=SANITIZE[:1])
    so = ffi.compile(tmpdir=str(tmp_path), verbose=False)
    out = run_sanitized(f"""
        import importlib.util, os
        import numpy as np
        from core_cffi import Conv2D, Core, Dense
        from refcodegen.numerics import make_requantize
        spec = importlib.util.spec_from_file_location("_refcg_core_sanitized", {so!r})
        module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
        core = Core.__new__(Core); core.ffi, core.lib, core._keep = module.ffi, module.lib, []
        rng = np.random.default_rng(7)
        def data(shape, dtype):
            info = np.iinfo(dtype); x = rng.integers(info.min, int(info.max) + 1, size=shape)
            x.reshape(-1)[: x.size // 3] = info.min
            return x.astype(dtype)
        rq = lambda n: make_requantize(rng.uniform(1e-4, 1e-3, n).astype("float32"), np.float32(0.05), 0, 3,
                                       "int8", "UPWARD", "int64")
        convs = [  # in_c, out_c, hw, kernel, stride, pad, dilation, groups, layout, in dtype
            (3, 17, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "NHWC", "int8"),
            (16, 33, (7, 6), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "NCHW", "uint8"),
            (8, 8, (10, 9), (3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 8, "NHWC", "int8"),
            (12, 24, (8, 8), (3, 2), (1, 2), (2, 1, 0, 1), (2, 1), 4, "NCHW", "int8"),
            (5, 15, (6, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 5, "NHWC", "uint8"),
            # AVX2 Winograd: odd output sides, a 1-channel last block, NCHW out; an unpadded input read in place
            (16, 17, (9, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "uint8"),
            (32, 24, (8, 8), (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, "NHWC", "int8"),
        ]
        count = 0
        for in_c, out_c, (h, w), (kh, kw), stride, pad, dil, groups, layout, dtype in convs:
            shape = (1, h, w, in_c) if layout == "NHWC" else (1, in_c, h, w)
            weight = data((out_c, kh, kw, in_c // groups), "int8")
            conv = Conv2D(core, in_shape=shape, layout=layout, weight_ohwi=weight, strides=stride, padding=pad,
                          dilation=dil, groups=groups, in_dtype=dtype, input_zp=-7 if dtype == "int8" else 130,
                          bias=rng.integers(-9999, 9999, out_c), requant=rq(out_c))
            x = data(shape, dtype)
            want = conv.run(x, fast=False)
            for isa in core.variants():
                core.use(isa)
                assert np.array_equal(conv.run(x), want), (isa, layout, in_c, out_c, groups)
                count += 1
        for batch, features, units, dtype in [(1, 1024, 10, "int8"), (3, 37, 19, "uint8"), (64, 65, 33, "int8")]:
            dense = Dense(core, weight_nk=data((units, features), "int8"), batch=batch, in_dtype=dtype,
                          input_zp=5 if dtype == "int8" else 128, bias=rng.integers(-999, 999, units),
                          requant=rq(units))
            x = data((batch, features), dtype)
            outs = []
            for isa in core.variants():
                core.use(isa)
                outs.append(dense.run(x)); count += 1
            assert all(np.array_equal(o, outs[-1]) for o in outs), "dense variants differ"
        print(count, core.variants())
    """, tmp_path)
    runs, variants = out.split(" ", 1)
    assert int(runs) >= 8 * 2, out  # at least the scalar and one SIMD variant per shape


# Representative chains (the fuzzer's spec format): every kernel family, both layouts, both dtypes.
def _rq(dtype="int8", scale=0.07, zp=3, rounding="None", clip=None):
    return {"out_dtype": dtype, "out_scale": scale, "out_zp": zp, "rounding": rounding, "clip": clip}


REPRESENTATIVE = [
    ChainSpec((1, 6, 9, 9), "NCHW", "int8", 0.05, -3, [
        {"op": "conv2d", "out_c": 12, "kernel": (3, 3), "strides": (2, 1), "dilation": (1, 1), "padding": (1, 1, 0, 2),
         "groups": 1, "w_dtype": "int8", "kernel_zp": 0, "per_channel": True, "bias": 1 << 16, "bias_form": "bias_add",
         **_rq(clip=(0, 127))},
        {"op": "pool", "kind": "max", "size": (2, 2), "strides": (2, 2), "padding": (0, 0, 1, 1), "ceil_mode": True,
         "count_include_pad": False},
        {"op": "dense", "units": 7, "w_dtype": "int8", "kernel_zp": 0, "per_channel": False, "bias": 1 << 10,
         **_rq("uint8", 0.1, 128)}], seed=1),
    ChainSpec((2, 7, 8, 8), "NHWC", "uint8", 0.02, 128, [
        {"op": "conv2d", "out_c": 8, "kernel": (3, 3), "strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1),
         "groups": 8, "w_dtype": "uint8", "kernel_zp": 128, "per_channel": False, "bias": None, "bias_form": "add",
         **_rq("uint8", 0.04, 120)},
        {"op": "binary", "kind": "add", "other": (8, 1), "flip": False, "const": False, "o_scale": 0.03,
         "o_zp": 100, "out_scale": 0.05, "out_zp": 110, "clip": None},
        {"op": "pool", "kind": "avg", "size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1), "ceil_mode": False,
         "count_include_pad": True}], seed=2),
    ChainSpec((1, 3, 5, 4), "NCHW", "int8", 0.1, 0, [
        {"op": "binary", "kind": "mul", "other": (3, 1, 4), "flip": True, "const": True, "o_scale": 0.02, "o_zp": -5,
         "out_scale": 0.08, "out_zp": 2, "clip": (-100, 100)},
        {"op": "concat", "axis": 1, "extra": 2, "o_scale": 0.3, "o_zp": 4, "out_scale": 0.2, "out_zp": -1},
        {"op": "requantize", "axis": 1, "per_channel": True, **_rq("uint8", 0.1, 128, "TONEAREST")}], seed=3),
    ChainSpec((3, 40), "", "int8", 0.03, 2, [
        {"op": "dense", "units": 17, "w_dtype": "uint8", "kernel_zp": 120, "per_channel": True, "bias": 1 << 20,
         **_rq()},
        {"op": "binary", "kind": "subtract", "other": (17,), "flip": False, "const": True, "o_scale": 0.05, "o_zp": 0,
         "out_scale": 0.09, "out_zp": 1, "clip": None},
        {"op": "dense", "units": 5, "w_dtype": "int8", "kernel_zp": 0, "per_channel": False, "bias": None,
         "out_dtype": "int32"}], seed=4),
    ChainSpec((1, 9, 6, 5), "NHWC", "int8", 0.04, 1, [
        {"op": "pool", "kind": "global"},
        {"op": "conv2d", "out_c": 4, "kernel": (1, 1), "strides": (1, 1), "dilation": (1, 1), "padding": (0, 0, 0, 0),
         "groups": 1, "w_dtype": "int8", "kernel_zp": 0, "per_channel": False, "bias": 1 << 10, "bias_form": "add",
         **_rq()}], seed=5),
    # refcg.copy rows: a nearest resize (NHWC pixels: memcpy), a pad on both sides, a transpose (gathers)
    ChainSpec((1, 5, 7, 3), "NHWC", "int8", 0.05, 0, [
        {"op": "copy", "kind": "resize", "size": [9, 4], "mode": "half_pixel", "rounding": "round_prefer_ceil"},
        {"op": "copy", "kind": "pad", "widths": [(0, 0), (1, 0), (0, 2), (0, 1)], "value": -3},
        {"op": "copy", "kind": "transpose", "axes": [0, 3, 1, 2]}], seed=6),
]


def test_exported_model_under_sanitizers(tmp_path):
    """One partition holding every kernel family, exported with -fsanitize=address,undefined, run in a
    sanitized child under every variant; outputs equal TVM-only."""
    mod, inputs = build_batch(REPRESENTATIVE, "llvm")
    reference = run(build_and_load(mod, "llvm", tmp_path, "tvm_only"), inputs)
    partitioned = partition_for_refcg(mod)
    assert not [op for op in offload_report(partitioned).stayed_ops if op != "tuple"], offload_report(partitioned)
    partitioned = merge_partitions(partitioned)
    assert len(refcg_functions(partitioned)) == 1
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partitioned, target="llvm")
    lib.export_library(str(tmp_path / "refcg_asan.so"), options=SANITIZE)
    np.savez(tmp_path / "inputs.npz", **inputs)
    variants = Core().variants()
    out = run_sanitized(f"""
        import os, shutil
        import numpy as np, tvm
        from tvm.contrib import graph_executor
        inputs = dict(np.load("inputs.npz"))
        for isa in {variants!r}:
            os.environ["REFCG_ISA"] = isa  # read at the first call of a freshly loaded copy
            lib = tvm.runtime.load_module(shutil.copy("refcg_asan.so", f"refcg_asan_{{isa}}.so"))
            gm = graph_executor.GraphModule(lib["default"](tvm.cpu()))
            for k, v in inputs.items():
                gm.set_input(k, v)
            gm.run()
            np.savez(f"out_{{isa}}.npz", *[gm.get_output(i).numpy() for i in range(gm.get_num_outputs())])
        print("ok")
    """, tmp_path)
    assert out.strip() == "ok"
    assert len(list(tmp_path.glob("out_*.npz"))) == len(variants)
    for path in sorted(tmp_path.glob("out_*.npz")):
        got = np.load(path)
        for i, want in enumerate(reference):
            assert np.array_equal(got[f"arr_{i}"], want), (path.name, i)
