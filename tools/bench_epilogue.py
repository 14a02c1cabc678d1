"""The requantize epilogue alone, per numerics mode and variant, this checkout's core against another
revision's in one process (tests/epilogue_harness.c appended to both): CPU time of the calling
thread, median of interleaved runs. Optionally a 1x1 small-K conv end to end through the same two cores.

    cd tests && python -m tools.bench_epilogue --against be352ce [--conv]   (from the repository root: PYTHONPATH=.:tests)
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from core_cffi import DTYPE_CODE, Conv2D, Core
from refcodegen import emit
from refcodegen.numerics import FloatLowering, make_requantize

MODES = [("UPWARD", "int64"), ("TONEAREST", "int64"), ("UPWARD", "float32"), ("TONEAREST", "float32"),
         ("UPWARD", "float64"), ("TONEAREST", "float64")]
FMA = FloatLowering(sse41=True, fma=True)  # -mcpu=skylake's float form


def bundle_of(revision: str, work: Path) -> str:
    """The bundled core of ``revision`` (its runtime/ checked out into ``work``)."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", revision, "runtime"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    return bundle_of_dir(work / "runtime")


def bundle_of_dir(runtime: Path) -> str:
    """The bundled core of the runtime/ tree at ``runtime``."""
    saved = emit.core_sources, emit.core_include_dir
    try:
        emit.core_sources = lambda: sorted(runtime.glob("*.c"))
        emit.core_include_dir = lambda: runtime / "include"
        return emit.bundled_core.__wrapped__()
    finally:
        emit.core_sources, emit.core_include_dir = saved


def thread_ms(fn, repeat: int, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.thread_time()
        for _ in range(repeat):
            fn()
        times.append((time.thread_time() - t0) * 1e3 / repeat)
    return times


def epilogue_case(cores, isa, planar, rq_py, acc, corr, pixels, channels, runs):
    """Median ms per core (interleaved run by run), after checking both against the scalar epilogue."""
    out = {}
    calls = {}
    for name, core in cores.items():
        rq = core.requant(rq_py)
        o = np.empty(pixels * channels, np.int8)
        ref = np.empty_like(o)
        assert core.lib.refcg_harness_epilogue(b"scalar", planar, rq, core.ptr(acc, "int32_t*"),
                                               core.ptr(corr, "int32_t*"), pixels, channels,
                                               core.ffi.from_buffer(ref), DTYPE_CODE["int8"]) == 0
        args = (isa.encode(), planar, rq, core.ptr(acc, "int32_t*"), core.ptr(corr, "int32_t*"), pixels, channels,
                core.ffi.from_buffer(o), DTYPE_CODE["int8"])
        assert core.lib.refcg_harness_epilogue(*args) == 0 and np.array_equal(o, ref), (name, isa, planar)
        calls[name] = (core.lib.refcg_harness_epilogue, args)
        out[name] = []
    for _ in range(runs):
        for name, (fn, args) in calls.items():
            out[name] += thread_ms(lambda: fn(*args), 5, 1)
    return {name: statistics.median(t) for name, t in out.items()}


def conv_case(cores, isa, rq_py, rng, hw, cin, cout, runs, depthwise=False):
    """A 1x1 conv (or a depthwise 3x3 with cin == cout), NCHW: the plane kernels."""
    x = rng.integers(-128, 128, (1, cin, hw, hw)).astype(np.int8)
    k, groups = (3, cin) if depthwise else (1, 1)
    w = rng.integers(-128, 128, (cout, k, k, cin // groups)).astype(np.int8)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    convs = {name: Conv2D(core, in_shape=x.shape, layout="NCHW", weight_ohwi=w, bias=bias, requant=rq_py,
                          input_zp=3, padding=(k // 2,) * 4, groups=groups, reference_weights=depthwise)
             for name, core in cores.items()}
    results = {name: [] for name in cores}
    for core in cores.values():
        core.use(isa)
    first = [conv.run(x) for conv in convs.values()]
    assert all(np.array_equal(first[0], r) for r in first)
    for _ in range(runs):
        for name, conv in convs.items():
            results[name] += thread_ms(lambda: conv.run(x), 3, 1)
    return {name: statistics.median(t) for name, t in results.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="be352ce", help="git revision whose core is the baseline")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--isa", nargs="*", default=["avx512vnni", "avx2"])
    parser.add_argument("--channels", nargs="*", type=int, default=[24, 144])
    parser.add_argument("--conv", action="store_true", help="also a 1x1 conv 56x56, K=24 -> 144 channels, and a depthwise 3x3, end to end")
    parser.add_argument("--conv-only", action="store_true", help="only the conv")
    parser.add_argument("--modes", nargs="*", default=[f"{r}/{c}" for r, c in MODES], help="e.g. UPWARD/int64")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        cores = {"old": Core(source=bundle_of(args.against, Path(work)), harness=True), "new": Core(harness=True)}
    rng = np.random.default_rng(0)
    pixels = 56 * 56
    print(f"requantize epilogue, {pixels} pixels, int8 out, per-channel scales; ms, CPU time, loaded machine "
          f"(median of {args.runs}); old = {args.against}")
    print(f"{'mode':<18} {'isa':<11} {'layout':<7} {'C':>4} {'old':>8} {'new':>8} {'speedup':>8}")
    modes = [(r, c) for r, c in MODES if f"{r}/{c}" in args.modes]
    for rounding, compute in [] if args.conv_only else modes:
        for channels in args.channels:
            acc = np.append(np.round(rng.normal(0, 3000, pixels * channels)), np.zeros(16)).astype(np.int32)
            corr = rng.integers(-20000, 20000, channels).astype(np.int32)
            scales = rng.uniform(0.5, 1.5, channels).astype(np.float32) / 100.0
            rq = make_requantize(scales, np.float32(1.0), 0, -3, "int8", rounding, compute, lowering=FMA)
            for isa in args.isa:
                for planar in (0, 1):
                    t = epilogue_case(cores, isa, planar, rq, acc, corr, pixels, channels, args.runs)
                    print(f"{rounding + '/' + compute:<18} {isa:<11} {'NCHW' if planar else 'NHWC':<7} {channels:>4} "
                          f"{t['old']:8.3f} {t['new']:8.3f} {t['old'] / t['new']:7.2f}x", flush=True)
    if args.conv or args.conv_only:
        print("1x1 conv NCHW 56x56, 24 -> 144 channels (planar kernel), int8 out; ms, CPU time, loaded machine")
        for rounding, compute in modes:
            scales = rng.uniform(0.5, 1.5, 144).astype(np.float32) / 3000.0
            rq = make_requantize(scales, np.float32(1.0), 3, -3, "int8", rounding, compute, lowering=FMA)
            for isa in args.isa:
                t = conv_case(cores, isa, rq, rng, 56, 24, 144, args.runs)
                print(f"{rounding + '/' + compute:<18} {isa:<11} {t['old']:8.3f} {t['new']:8.3f} "
                      f"{t['old'] / t['new']:7.2f}x", flush=True)
        print("depthwise 3x3 NCHW 56x56, 144 channels (plane kernel), int8 out")
        for rounding, compute in modes:
            scales = rng.uniform(0.5, 1.5, 144).astype(np.float32) / 300.0
            rq = make_requantize(scales, np.float32(1.0), 3, -3, "int8", rounding, compute, lowering=FMA)
            for isa in args.isa:
                t = conv_case(cores, isa, rq, rng, 56, 144, 144, args.runs, depthwise=True)
                print(f"{rounding + '/' + compute:<18} {isa:<11} {t['old']:8.3f} {t['new']:8.3f} "
                      f"{t['old'] / t['new']:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
