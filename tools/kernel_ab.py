"""The convs (and residual adds, a squeeze-excite mul) of a mobile network one by one, this checkout's
core against another revision's, in one process: CPU time of the calling thread (serial core: one
thread), median of interleaved runs, and the two outputs compared byte for byte. For a runtime change,
before the whole-network bench.

    PYTHONPATH=.:tests .venv/bin/python -m tools.kernel_ab --against HEAD [--isa avx512vnni avx2]
        [--only dw] [--dtype int8 uint8] [--layout NCHW] [--runs 15] [--workdir DIR] [--no-check]

``--workdir``: a runtime/ tree to compare instead of this checkout's (e.g. a second copy being edited).
Shapes: MobileNetV2's NHWC convs at 224 and ResNet's stem and K = 64-256 1x1s (name: HxW, channels, kernel,
stride; ``--layout NCHW``: the same on planar tensors), int64 UPWARD requantize (TVM's `llvm` numerics), per-channel scales, input zero point 3 (uint8) /
-3 (int8). The cores here are compiled by cffi (gcc -O3); generated libraries compile the same core with
g++ under `#pragma GCC optimize("O3")` alone, whose register allocation can differ (a change 1.10x here ran
0.87x in MobileNetV2): confirm a kernel change on a network built both ways before keeping it.
``--isa avxvnni`` on a host with AVX-512 VNNI and no AVX-VNNI times the variant's EVEX stand-in
(core_cffi.avxvnni_as_evex; the same code with 16 ymm registers); the baseline revision must know it.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from core_cffi import Binary, Conv2D, Core, avxvnni_as_evex
from refcodegen.numerics import make_requantize
from tools.bench_epilogue import bundle_of, bundle_of_dir, thread_ms

# name -> (hw, cin, cout, k, stride, depthwise)
SHAPES = {
    "stem 3->32 s2@224": (224, 3, 32, 3, 2, False),
    "1x1 16->96@112": (112, 16, 96, 1, 1, False),
    "1x1 32->16@112": (112, 32, 16, 1, 1, False),
    "1x1 24->144@56": (56, 24, 144, 1, 1, False),
    "1x1 144->24@56": (56, 144, 24, 1, 1, False),
    "1x1 96->576@14": (14, 96, 576, 1, 1, False),
    "1x1 32->192@28": (28, 32, 192, 1, 1, False),
    "1x1 64->384@14": (14, 64, 384, 1, 1, False),
    "1x1 40->240@28": (28, 40, 240, 1, 1, False),
    "1x1 320->1280@7": (7, 320, 1280, 1, 1, False),
    "1x1 160->960@7": (7, 160, 960, 1, 1, False),
    "1x1 960->160@7": (7, 960, 160, 1, 1, False),
    "stem7x7 3->64 s2@224": (224, 3, 64, 7, 2, False),  # ResNet's and GoogLeNet's
    "1x1 64->64@56": (56, 64, 64, 1, 1, False),
    "1x1 64->256@56": (56, 64, 256, 1, 1, False),
    "1x1 256->64@56": (56, 256, 64, 1, 1, False),
    "1x1 128->512@28": (28, 128, 512, 1, 1, False),
    "3x3 64->64@56": (56, 64, 64, 3, 1, False),  # ResNet-18's body
    "3x3 128->128@28": (28, 128, 128, 3, 1, False),
    "dw3x3 32@112": (112, 32, 32, 3, 1, True),
    "dw3x3 s2 96@112": (112, 96, 96, 3, 2, True),
    "dw3x3 144@56": (56, 144, 144, 3, 1, True),
    "dw3x3 s2 144@56": (56, 144, 144, 3, 2, True),
    "dw3x3 576@14": (14, 576, 576, 3, 1, True),
    "dw3x3 960@7": (7, 960, 960, 3, 1, True),
    "dw5x5 672@14": (14, 672, 672, 5, 1, True),
}
# residual adds (name -> NHWC shape): ResNet-50's and MobileNetV2's
ADDS = {"add 56x56x256": (1, 56, 56, 256), "add 14x14x1024": (1, 14, 14, 1024), "add 56x56x24": (1, 56, 56, 24),
        "mul 112x112x32 by 32": (1, 112, 112, 32)}  # squeeze-excite's channel scale (EfficientNet)


def convs_of(cores, name, dtype, rng, layout="NHWC"):
    hw, cin, cout, k, stride, dw = SHAPES[name]
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (1, hw, hw, cin) if layout == "NHWC" else (1, cin, hw, hw)).astype(dtype)
    w = rng.integers(-127, 128, (cout, k, k, 1 if dw else cin)).astype(np.int8)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    scales = rng.uniform(0.5, 1.5, cout).astype(np.float32) / (40.0 * k * k * (1 if dw else cin))
    rq = make_requantize(scales, np.float32(1.0), 0, -3, "int8", "UPWARD", "int64")
    pad = (k // 2,) * 4 if stride == 1 else (k // 2 - 1 + (hw % 2), k // 2 - 1 + (hw % 2), k // 2, k // 2)
    convs = {label: Conv2D(core, in_shape=x.shape, layout=layout, weight_ohwi=w, bias=bias, requant=rq,
                           strides=(stride, stride), padding=pad, groups=cin if dw else 1, in_dtype=dtype,
                           input_zp=3 if dtype == "uint8" else -3, reference_weights=False)
             for label, core in cores.items()}
    return x, convs


def adds_of(cores, name, dtype, rng):
    """qnn.add of two tensors with their own scales and zero points (int32 operand requantize, as
    refcodegen/ops/binary.py plans it), int64 UPWARD, clipped like a fused ReLU; or qnn.mul by a
    per-channel vector (one requantize of the product)."""
    shape = ADDS[name]
    op, y_shape = ("mul", (1, 1, 1, shape[-1])) if name.startswith("mul") else ("add", shape)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x, y = (rng.integers(lo, hi, s).astype(dtype) for s in (shape, y_shape))
    zps = (3, -5, 1) if dtype == "int8" else (120, 131, 7)
    rq_a = make_requantize(np.float32(0.031), np.float32(0.05), zps[0], zps[2], "int32", "UPWARD", "int64")
    rq_b = make_requantize(np.float32(0.043), np.float32(0.05), zps[1], zps[2], "int32", "UPWARD", "int64")
    out_range = (zps[2], 127 if dtype == "int8" else 255)
    if op == "mul":  # one requantize of the product, clamped to the output range
        rq_a = rq_b = make_requantize(np.float32(0.031 * 0.004), np.float32(0.05), 0, zps[2], dtype, "UPWARD", "int64")
    adds = {label: Binary(core, op, shape, y_shape, dtype, dtype, dtype, rq_a, rq_b, zps, out_range)
            for label, core in cores.items()}
    return (x, y), adds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision whose core is the baseline (old)")
    parser.add_argument("--workdir", default=None, help="runtime/ directory of the new core (default: this checkout's)")
    parser.add_argument("--isa", nargs="*", default=["avx512vnni", "avx2"])
    parser.add_argument("--dtype", nargs="*", default=["int8"])
    parser.add_argument("--only", default="", help="shapes whose name contains this")
    parser.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW"], help="the convs' tensors")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--no-check", action="store_true", help="time a core whose output is knowingly wrong (bounds)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        new = bundle_of_dir(Path(args.workdir)) if args.workdir else None
        evex = "avxvnni" in args.isa and avxvnni_as_evex()
        cores = {"old": Core(source=bundle_of(args.against, Path(work)), avxvnni_evex=evex),
                 "new": Core(source=new, avxvnni_evex=evex)}
    rng = np.random.default_rng(0)
    print(f"ms per call, 1 thread, CPU time, median of {args.runs} interleaved runs; old = {args.against}")
    print(f"{'shape':<20} {'dtype':<6} {'isa':<11} {'old':>8} {'new':>8} {'new/old speed':>14}")
    total = {isa: [0.0, 0.0] for isa in args.isa}
    for name in (n for n in list(SHAPES) + list(ADDS) if args.only in n):
        for dtype in args.dtype:
            inputs, kernels = adds_of(cores, name, dtype, rng) if name in ADDS else \
                convs_of(cores, name, dtype, rng, args.layout)
            inputs = inputs if name in ADDS else (inputs,)
            for isa in args.isa:
                for core in cores.values():
                    core.use(isa)
                outs = [kernel.run(*inputs) for kernel in kernels.values()]
                assert args.no_check or np.array_equal(outs[0], outs[1]), f"{name} {dtype} {isa}: old and new differ"
                work = getattr(kernels["old"], "macs", 0) or 10 * np.prod(outs[0].shape)
                repeat = max(1, int(2e7 // work))
                times = {label: [] for label in kernels}
                for _ in range(args.runs):
                    for label, kernel in kernels.items():
                        times[label] += thread_ms(lambda: kernel.run(*inputs), repeat, 1)
                old, new = (statistics.median(times[label]) for label in ("old", "new"))
                total[isa][0] += old
                total[isa][1] += new
                print(f"{name:<20} {dtype:<6} {isa:<11} {old:8.4f} {new:8.4f} {old / new:13.3f}x", flush=True)
    for isa, (old, new) in total.items():
        if new == 0:  # no shape matched --only
            continue
        print(f"{'sum':<20} {'':<6} {isa:<11} {old:8.4f} {new:8.4f} {old / new:13.3f}x")


if __name__ == "__main__":
    main()
