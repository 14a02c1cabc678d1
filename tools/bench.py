"""make bench: refcg vs TVM-only vs ONNX Runtime, interleaved in one process, 1 and 2 threads.

Workloads are generated in code with fixed seeds (full-range int8 weights for the single ops).
TVM-only baselines are built in child processes: TVM 0.19 with LLVM 22 aborts the whole
process when it builds int8 conv/dense for a VNNI target, so each candidate target is tried in
its own process (which also runs it once: some builds die with SIGILL at run time) and the
best one that builds and runs is timed here. Timing: `rounds` rounds, each runs
every runner for a batch of iterations in turn; the table shows the best round's time per
iteration. With 1 thread every runner (TVM's pool of one, ORT intra_op=1, refcg) computes on
the calling thread and the clock is that thread's CPU time, which other processes on a shared
machine do not inflate; with 2 threads it is the wall clock (the load average is printed).
Where the host runs a better variant, refcg also runs forced to AVX2 (REFCG_ISA=avx2, rows "refcg
avx2"): what an AVX2-only machine gets. The ISA column names what each row computes with.
refcg is built for `llvm` (int64 fixed-point requantize, compared with TVM-only llvm) and again for the
best TVM target (row "refcg @MCPU": that target's float32 requantize, compared with TVM-only MCPU).
Networks (--networks [NAME ...], `make bench-networks`): the zoo (examples/zoo.py) at its real input size
(--size N for a smaller one), refcg and TVM-only vs the runtimes its users run on the same converted model:
PyTorch fbgemm and ONNX Runtime (torch.onnx.export) for torchvision's, LiteRT with XNNPACK for the .tflite.
Usage, from the repository root: python -m tools.bench [--only NAME ...] [--threads 1 2] [--rounds 7] [--json PATH]
                                 python -m tools.bench --networks [NAME ...] [--size N] [--threads 1 2] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
# TVM sizes its thread pool once, from TVM_NUM_THREADS or else hardware_concurrency() / 2 on x86
# (it assumes hyper-threading): on a 2-vCPU VM that is ONE thread, and config_threadpool cannot
# raise it later. So the pool gets every CPU here and set_threads() narrows it per measurement.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count()))
REPO = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402

# best first; the VNNI ones abort on int8 conv/dense with this TVM/LLVM, the others build
TVM_TARGETS = ["llvm -mcpu=sapphirerapids", "llvm -mcpu=cascadelake", "llvm -mcpu=skylake-avx512",
               "llvm -mcpu=skylake"]
TVM_AVX2_TARGET = "llvm -mcpu=skylake"  # AVX2 + FMA, no AVX-512
PEAK_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
/* 12 independent accumulators, one instruction each per iteration, in asm so the compiler adds
 * no register moves to the loop. */
#define PEAK_BODY(T, ZERO, INSN)                                                              \
  T c0 = ZERO, c1 = ZERO, c2 = ZERO, c3 = ZERO, c4 = ZERO, c5 = ZERO, c6 = ZERO, c7 = ZERO,   \
    c8 = ZERO, c9 = ZERO, c10 = ZERO, c11 = ZERO;                                             \
  for (long i = 0; i < iters; ++i)                                                            \
    __asm__ volatile(INSN("0") INSN("1") INSN("2") INSN("3") INSN("4") INSN("5") INSN("6")    \
                     INSN("7") INSN("8") INSN("9") INSN("10") INSN("11")                     \
                     : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3), [c4] "+v"(c4), \
                       [c5] "+v"(c5), [c6] "+v"(c6), [c7] "+v"(c7), [c8] "+v"(c8), [c9] "+v"(c9), \
                       [c10] "+v"(c10), [c11] "+v"(c11)                                       \
                     : [a] "v"(a), [b] "v"(b));                                               \
  T sum[12] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};                             \
  int32_t out = 0, lane;                                                                      \
  for (int j = 0; j < 12; ++j) { memcpy(&lane, &sum[j], 4); out += lane; }                     \
  return out;
#define DPBUSD(n) "vpdpbusd %[b], %[a], %[c" n "]\n\t"
#define DPBUSD_VEX(n) "%{vex%} vpdpbusd %[b], %[a], %[c" n "]\n\t"
#define MADDWD(n) "vpmaddwd %[b], %[a], %[c" n "]\n\t"
__attribute__((target("avx512f,avx512vnni"))) int32_t peak_avx512vnni(long iters, int32_t seed) {
  const __m512i a = _mm512_set1_epi32(seed), b = _mm512_set1_epi32(seed + 1);
  PEAK_BODY(__m512i, _mm512_setzero_si512(), DPBUSD)
}
__attribute__((target("avx2,avxvnni"))) int32_t peak_avxvnni(long iters, int32_t seed) {
  const __m256i a = _mm256_set1_epi32(seed), b = _mm256_set1_epi32(seed + 1);
  PEAK_BODY(__m256i, _mm256_setzero_si256(), DPBUSD_VEX)
}
/* vpmaddwd alone (16 MAC per ymm instruction, what the AVX2 kernel issues; the kernel's
 * vpaddd runs on other ports) */
__attribute__((target("avx2"))) int32_t peak_avx2_vpmaddwd(long iters, int32_t seed) {
  const __m256i a = _mm256_set1_epi32(seed), b = _mm256_set1_epi32(seed + 1);
  PEAK_BODY(__m256i, _mm256_setzero_si256(), MADDWD)
}
/* What the AVX2 kernel issues on blocks proven not to saturate: vpmaddubsw (32 MAC), vpmaddwd by
 * ones, vpaddd; 6 independent chains (6 accumulators + 6 products + 3 operands: 16 ymm on AVX2). */
#define UBSW(n) "vpmaddubsw %[b], %[a], %%ymm" #n "\n\tvpmaddwd %[o], %%ymm" #n ", %%ymm" #n "\n\t" \
                "vpaddd %%ymm" #n ", %[c" #n "], %[c" #n "]\n\t"
__attribute__((target("avx2"))) int32_t peak_avx2_vpmaddubsw(long iters, int32_t seed) {
  const __m256i a = _mm256_set1_epi32(seed), b = _mm256_set1_epi32(seed + 1), o = _mm256_set1_epi16(1);
  __m256i c0 = a, c1 = a, c2 = a, c3 = a, c4 = a, c5 = a;
  for (long i = 0; i < iters; ++i)
    __asm__ volatile(UBSW(0) UBSW(1) UBSW(2) UBSW(3) UBSW(4) UBSW(5)
                     : [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3), [c4] "+x"(c4), [c5] "+x"(c5)
                     : [a] "x"(a), [b] "x"(b), [o] "x"(o)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5");
  __m256i sum[6] = {c0, c1, c2, c3, c4, c5};
  int32_t out = 0, lane;
  for (int j = 0; j < 6; ++j) { memcpy(&lane, &sum[j], 4); out += lane; }
  return out;
}
"""
# MACs per loop iteration: 12 instructions of 64 MAC per zmm vpdpbusd, 32 per ymm, 16 per ymm
# vpmaddwd; 6 vpmaddubsw chains of 32
PEAKS = {"avx512vnni": 12 * 64, "avxvnni": 12 * 32, "avx2_vpmaddwd": 12 * 16, "avx2_vpmaddubsw": 6 * 32}


def measure_peaks() -> dict:
    import cffi

    from tests.core_cffi import Core

    core = Core()
    ffi = cffi.FFI()
    ffi.cdef("".join(f"int32_t peak_{name}(long, int32_t);" for name in PEAKS))
    ffi.set_source("_refcg_peak", PEAK_SOURCE, extra_compile_args=["-O3"])
    build = Path(tempfile.gettempdir()) / "refcg-peak"
    build.mkdir(exist_ok=True)
    so = ffi.compile(tmpdir=str(build), verbose=False)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_refcg_peak", so)
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)
    supported = {"avx512vnni": "avx512vnni", "avxvnni": "avxvnni", "avx2_vpmaddwd": "avx2", "avx2_vpmaddubsw": "avx2"}
    peaks = {}
    for name, macs in PEAKS.items():
        if not core.lib.refcg_isa_supported(supported[name].encode()):
            continue
        fn = getattr(lib.lib, f"peak_{name}")
        iters, best = 2_000_000, 0.0
        for _ in range(5):  # thread CPU time: not inflated when other processes share the core
            start = time.thread_time()
            fn(iters, 1)
            best = max(best, iters * macs / (time.thread_time() - start) / 1e9)
        peaks[name] = best
    return peaks


# ---------------------------------------------------------------- workloads (fixed seeds)
def _conv(name: str):
    from tvm import relay

    from examples.networks import qconv

    rng = np.random.default_rng(6)
    depthwise = name == "dw3x3_32x112"
    c, hw = (32, 112) if depthwise else (64, 56)
    x = relay.var("input", shape=(1, c, hw, hw), dtype="int8")
    y = qconv(x, rng, in_c=c, out_c=c, groups=c if depthwise else 1, per_channel=not name.startswith("conv3x3_pt"),
              input_zp=-2, output_zp=3, output_scale=4.0 if not depthwise else 0.5,
              weight_range=W7_RANGE if name.endswith("_w7") else None)
    return y, x


def _dense_data(name: str):
    """m, k, n, weights [n][k] and bias of a dense workload."""
    m, k, n = {"dense_1x1024x1000": (1, 1024, 1000), "dense_64x512x512": (64, 512, 512)}[name.removesuffix("_w7")]
    rng = np.random.default_rng(7)
    lo, hi = W7_RANGE if name.endswith("_w7") else (-128, 127)
    return m, k, n, rng.integers(lo, hi + 1, (n, k)).astype("int8"), rng.integers(-5000, 5000, n).astype("int32")


def _dense(name: str):
    from tvm import relay

    m, k, n, w, bias = _dense_data(name)
    x = relay.var("input", shape=(m, k), dtype="int8")
    y = relay.qnn.op.dense(x, relay.const(w), relay.const(0), relay.const(0), relay.const(np.float32(0.05)),
                           relay.const(np.float32(0.01)), units=n)
    y = relay.nn.bias_add(y, relay.const(bias))
    y = relay.qnn.op.requantize(y, relay.const(np.float32(0.0005)), relay.const(0), relay.const(np.float32(4.0)),
                                relay.const(0), out_dtype="int8")
    return y, x


def _network(name: str):
    from examples import networks

    build = {"resnet18_style": networks.resnet18_style, "mobilenetv2_style": networks.mobilenetv2_style}[name]
    mod, _, _, _ = build(size=224, layout="NCHW")
    return mod


NETWORKS = ("resnet18_style", "mobilenetv2_style")
# _w7: weights in [-64, 63], where AVX2 proves vpmaddubsw cannot saturate (TVM's x86 int8 schedules,
# which use it unproven, are exact there too); the others draw full-range weights
W7_RANGE = (-64, 63)
WORKLOADS = ["conv3x3_pt", "conv3x3_pt_w7", "conv3x3_pc", "dw3x3_32x112", "dense_1x1024x1000", "dense_64x512x512",
             "dense_64x512x512_w7", *NETWORKS]


# ---------------------------------------------------------------- the zoo: workloads named "<network>@<size>"
_zoo_built = {}  # workload -> (zoo.Built, refcodegen Model), this process's


def zoo_workload(name: str):
    """(zoo.Network, size) of a "<network>@<size>" workload, or None."""
    from examples import zoo

    network, _, size = name.partition("@")
    return (zoo.NETWORKS[network], int(size)) if size and network in zoo.NETWORKS else None


def zoo_model(name: str):
    """(zoo.Built, Model) of a zoo workload: built once (the .pt file is reused by the children)."""
    if name not in _zoo_built:
        network, size = zoo_workload(name)
        built = network.build(os.environ["REFCG_ZOO_DIR"], size)  # this run's directory, shared with its children
        _zoo_built[name] = built, built.model()
    return _zoo_built[name]


def zoo_peers(name: str, threads: int, x: np.ndarray) -> tuple[dict, dict]:
    """Runners and outputs of the runtimes the network's users run, on the same converted model and input."""
    from examples import zoo
    from refcodegen import runner

    built, _ = zoo_model(name)
    runners, outputs = {}, {}
    if zoo.PYTORCH in built.network.peers:
        import torch

        torch.backends.quantized.engine = "fbgemm"
        torch.set_num_threads(threads)
        tensor, result = torch.from_numpy(x), {}

        def run_torch():
            with torch.no_grad():
                result["y"] = built.traced(tensor)

        run_torch()
        runners[zoo.PYTORCH], outputs[zoo.PYTORCH] = run_torch, lambda: result["y"].numpy()
    if zoo.LITERT in built.network.peers:
        interpreter = runner.litert_interpreter(built.path, threads)
        feed, result = {interpreter.get_input_details()[0]["name"]: x}, {}

        def run_litert():
            result["y"] = runner.litert_run(interpreter, feed)[0]

        run_litert()
        runners[zoo.LITERT], outputs[zoo.LITERT] = run_litert, lambda: result["y"]
    return runners, outputs


def relay_module(name: str):
    import tvm
    from tvm import relay

    if zoo_workload(name):
        from refcodegen import runner

        return runner.prepared(zoo_model(name)[1])
    if name in NETWORKS:
        return _network(name)
    y, x = _dense(name) if name.startswith("dense") else _conv(name)
    return tvm.IRModule.from_expr(relay.Function([x], y))


def count_macs(mod) -> int:
    """Multiply-accumulates of every qnn.conv2d / qnn.dense in the module."""
    import tvm
    from tvm import relay

    mod = relay.transform.InferType()(mod)
    total = [0]

    def visit(expr):
        if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
            if expr.op.name not in ("qnn.conv2d", "qnn.dense"):
                return
            out = [int(d) for d in expr.checked_type.shape]
            w = [int(d) for d in expr.args[1].checked_type.shape]
            if expr.op.name == "qnn.conv2d":
                layout = str(expr.attrs.kernel_layout)
                total[0] += int(np.prod(out)) * w[layout.index("H")] * w[layout.index("W")] * w[layout.index("I")]
            elif expr.op.name == "qnn.dense":
                total[0] += int(np.prod(out)) * w[1]

    relay.analysis.post_order_visit(mod["main"], visit)
    return total[0]


def example_input(mod, name: str = "") -> np.ndarray:
    from tvm import relay

    if zoo_workload(name):  # the framework's example (a float image for PyTorch), one input
        built, model = zoo_model(name)
        return next(iter(built.example(model).values()))
    ttype = relay.transform.InferType()(mod)["main"].params[0].checked_type
    return np.random.default_rng(3).integers(-128, 128, [int(d) for d in ttype.shape]).astype(str(ttype.dtype))


# ---------------------------------------------------------------- builds
def build_child(name: str, target: str, path: str, refcg: bool) -> None:
    """Runs in a child process: build one workload for one target and export it."""
    import tvm
    from tvm import relay

    mod = relay_module(name)
    if refcg:
        from refcodegen import partition_for_refcg

        # zoo: prepared already; the target decides what stays in TVM (stagewise convs, tables)
        mod = partition_for_refcg(mod, target=target, fold_batch_norm=not zoo_workload(name))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    lib.export_library(path)
    # run it once here too: e.g. a sapphirerapids dense builds but executes AMX instructions the
    # process may not use (SIGILL), which must not kill the benchmark process
    graph_runner(path, example_input(mod, name))


def build_in_child(name: str, target: str, path: str, refcg: bool = False) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "tools.bench", "--build-child", name, target, path, "1" if refcg else "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if result.returncode == 0:
        return True, ""
    if result.returncode == -4:
        return False, "SIGILL when run"
    tail = (result.stderr or result.stdout).strip().splitlines()
    return False, f"exit {result.returncode}: {tail[-1] if tail else ''}"[:160]


def isa_runner(path: str, x: np.ndarray, isa: str):
    """graph_runner on a copy of the refcg library with its variant forced: a fresh copy (dlopen would
    hand back the loaded one, whose core has chosen already) loaded and run once with REFCG_ISA set."""
    import shutil

    copy = shutil.copy(path, path.replace(".so", f"_{isa}.so"))
    saved = os.environ.get("REFCG_ISA")
    os.environ["REFCG_ISA"] = isa
    try:
        return graph_runner(copy, x)  # runs once: the core reads REFCG_ISA at its first call
    finally:
        os.environ.pop("REFCG_ISA") if saved is None else os.environ.__setitem__("REFCG_ISA", saved)


def graph_runner(path: str, x: np.ndarray):
    import tvm
    from tvm.contrib import graph_executor

    module = graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))
    module.set_input(0, x)
    module.run()
    return module.run, lambda: module.get_output(0).numpy()


# ---------------------------------------------------------------- ONNX Runtime models (same shapes)
def onnx_model(name: str, mod, path: str) -> str | None:
    """The same computation as an ONNX QOperator graph (single ops: same weights; networks: same
    architecture through ORT's own quantize_static, weights differ)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    from onnx import TensorProto, helper, numpy_helper

    if zoo_workload(name):
        return zoo_model(name)[0].onnx()[0]
    if name in NETWORKS:
        return _onnx_network(name, path)
    call = mod["main"].body
    while call.op.name != ("qnn.conv2d" if name[:4] in ("conv", "dw3x") else "qnn.dense"):
        call = call.args[0]
    requant = mod["main"].body
    while requant.op.name != "qnn.requantize":
        requant = requant.args[0]
    bias = requant.args[0].args[1].data.numpy()
    shape = list(example_input(mod).shape)
    w = call.args[1].data.numpy()
    in_scale, w_scale = float(call.args[4].data.numpy()), call.args[5].data.numpy().astype(np.float32)
    out_scale, out_zp = float(requant.args[3].data.numpy()), int(requant.args[4].data.numpy())
    in_zp = int(call.args[2].data.numpy())
    inits = [numpy_helper.from_array(np.array(in_scale, np.float32), "xs"),
             numpy_helper.from_array(np.array(in_zp, np.int8), "xz"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "ys"),
             numpy_helper.from_array(np.array(out_zp, np.int8), "yz")]
    if call.op.name == "qnn.conv2d":
        groups = int(call.attrs.groups)
        inits += [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_scale.reshape(-1), "ws"),
                  numpy_helper.from_array(np.zeros(w_scale.size, np.int8), "wz"),
                  numpy_helper.from_array(bias.astype(np.int32), "b")]
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                                kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=groups)
        nodes = [node]
    else:  # QLinearMatMul has no bias input: add it in int32 through MatMulInteger instead
        inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), "w"),
                  numpy_helper.from_array(np.array(float(w_scale), np.float32), "ws"),
                  numpy_helper.from_array(np.array(0, np.int8), "wz"),
                  numpy_helper.from_array(bias.astype(np.int32), "b"),
                  numpy_helper.from_array(np.array(in_scale * float(w_scale), np.float32), "accs")]
        nodes = [helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["acc"]),
                 helper.make_node("Add", ["acc", "b"], ["accb"]),
                 helper.make_node("Cast", ["accb"], ["accf"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["accf", "accs"], ["f"]),
                 helper.make_node("QuantizeLinear", ["f", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.INT8, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _onnx_network(name: str, path: str) -> str:
    from examples.onnx_models import _Graph, quantize

    g = _Graph(5)
    if name == "resnet18_style":
        x = g.node("MaxPool", [g.conv("input", 3, 64, k=7, stride=2)], kernel_shape=[3, 3], strides=[2, 2],
                   pads=[1, 1, 1, 1])
        c = 64
        for stage, out_c in enumerate([64, 128, 256, 512]):
            for block in range(2):
                s = 2 if stage > 0 and block == 0 else 1
                shortcut = x if s == 1 and c == out_c else g.conv(x, c, out_c, k=1, stride=s, act=None)
                y = g.conv(g.conv(x, c, out_c, stride=s), out_c, out_c, act=None)
                x, c = g.node("Relu", [g.node("Add", [y, shortcut])]), out_c
    else:
        x, c = g.conv("input", 3, 32, stride=2, act="relu6"), 32
        for t, out_c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                               (6, 160, 3, 2), (6, 320, 1, 1)]:
            for i in range(n):
                stride, hidden = (s if i == 0 else 1), c * t
                y = g.conv(x, c, hidden, k=1, act="relu6") if t != 1 else x
                y = g.conv(y, hidden, hidden, stride=stride, groups=hidden, act="relu6")
                y = g.conv(y, hidden, out_c, k=1, act=None)
                x = g.node("Add", [x, y]) if stride == 1 and c == out_c else y
                c = out_c
        x, c = g.conv(x, c, 1280, k=1, act="relu6"), 1280
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    model = g.model((1, 3, 224, 224), g.gemm(x, c, 1000))
    return quantize(model, path, fmt="qoperator", per_channel=True, samples=2)


def ort_runner(path: str, threads: int):
    import onnx
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    meta = onnx.load(path).graph.input[0]
    shape = [d.dim_value for d in meta.type.tensor_type.shape.dim]
    if meta.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
        feed = np.random.default_rng(3).normal(0, 1, shape).astype(np.float32)
    else:
        feed = np.random.default_rng(3).integers(-128, 128, shape).astype(np.int8)
    inputs = {meta.name: feed}
    result = {}

    def run():
        result["y"] = session.run(None, inputs)[0]

    run()
    return run, lambda: result["y"]


# ---------------------------------------------------------------- timing
def interleaved(runners: dict, rounds: int, clock, budget_s: float = 0.05) -> dict:
    numbers = {}
    for name, fn in runners.items():  # warm up, pick a batch size of ~budget_s
        fn()
        start = time.perf_counter()
        fn()
        numbers[name] = max(1, min(200, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    samples = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            start = clock()
            for _ in range(numbers[name]):
                fn()
            samples[name].append((clock() - start) / numbers[name])
    # best round: on a shared machine the fastest round is the least disturbed one
    return {name: float(np.min(v)) for name, v in samples.items()}


def set_threads(threads: int) -> None:
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=WORKLOADS)
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=None)
    parser.add_argument("--networks", nargs="*", default=None, help="zoo networks (default: all of them)")
    parser.add_argument("--size", type=int, default=None, help="zoo input size (default: each network's own)")
    parser.add_argument("--build-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_child:
        name, target, path, refcg = args.build_child
        build_child(name, target, path, refcg == "1")
        return
    if args.networks is not None:
        from examples import zoo

        unknown = sorted(set(args.networks) - set(zoo.NETWORKS))
        if unknown:
            parser.error(f"unknown networks {unknown} (known: {', '.join(zoo.NETWORKS)})")
        args.only = [f"{n}@{args.size or zoo.NETWORKS[n].size}" for n in args.networks or zoo.NETWORKS]

    from refcodegen import runner as runner_module
    from tests.core_cffi import Core

    peaks = measure_peaks()
    peak_name = "avx512vnni" if "avx512vnni" in peaks else ("avxvnni" if "avxvnni" in peaks else "avx2_vpmaddubsw")
    peak = peaks.get(peak_name, float("nan"))
    core = Core()
    refcg_isa = core.isa_name()
    # the AVX2 variant beside the best one (REFCG_ISA=avx2): what an AVX2-only machine runs
    extra_isas = [isa for isa in ("avx2",) if isa != refcg_isa and core.lib.refcg_isa_supported(isa.encode())]
    print("measured peak, 1 thread (independent accumulators): "
          + ", ".join(f"{k} {v:.1f} GMAC/s" for k, v in peaks.items()))
    print(f"% of peak below is against {peak_name} (refcg avx2 rows: avx2_vpmaddubsw); refcg ISA: {refcg_isa}"
          f"{' (+ ' + ', '.join(extra_isas) + ')' if extra_isas else ''}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="refcg-bench-"))
    os.environ["REFCG_ZOO_DIR"] = str(work)
    rows = []
    for name in args.only:
        mod = relay_module(name)
        macs = count_macs(mod)
        x = example_input(mod, name)
        runners, notes, outputs = {}, [], {}
        ok, err = build_in_child(name, "llvm", str(work / f"{name}_refcg.so"), refcg=True)
        if ok:
            runners["refcg"], outputs["refcg"] = graph_runner(str(work / f"{name}_refcg.so"), x)
            for isa in extra_isas:
                runners[f"refcg {isa}"], outputs[f"refcg {isa}"] = isa_runner(str(work / f"{name}_refcg.so"), x, isa)
        else:
            notes.append(f"refcg build failed: {err}")
        ok, err = build_in_child(name, "llvm", str(work / f"{name}_llvm.so"))
        if ok:
            runners["tvm llvm"], outputs["tvm llvm"] = graph_runner(str(work / f"{name}_llvm.so"), x)
        def target_runner(target: str, refcg: bool = False) -> bool:
            """TVM-only (row "tvm MCPU") or refcg (row "refcg @MCPU") built for target and run."""
            mcpu = target.split("=")[-1]
            key = f"refcg @{mcpu}" if refcg else f"tvm {mcpu}"
            path = str(work / f"{name}_{'refcg_' if refcg else ''}{mcpu}.so")
            ok, err = build_in_child(name, target, path, refcg=refcg)
            if ok:
                runners[key], outputs[key] = graph_runner(path, x)
            else:
                notes.append(f"{'refcg' if refcg else 'TVM-only'} '{target}' did not build or run ({err})")
            return ok

        best = next((target for target in TVM_TARGETS if target_runner(target)), None)
        if extra_isas and best != TVM_AVX2_TARGET:  # beside refcg's avx2 rows: TVM's peer on AVX2-only x86
            target_runner(TVM_AVX2_TARGET)
        if best:  # refcg built for TVM's best target: that build's numerics (float32 requantize), bit-exact with it
            target_runner(best, refcg=True)
        if name in NETWORKS or zoo_workload(name):
            check_not_degenerate(name, outputs)
        onnx_path = onnx_model(name, mod, str(work / f"{name}.onnx"))
        if zoo_workload(name):
            notes.append(f"refcg built for target 'llvm' (int64 fixed-point requantize), computing with {refcg_isa}")
            if not onnx_path:
                notes.append(f"no ONNX Runtime row: {zoo_model(name)[0].onnx()[1]}")
        if name.startswith("dense"):  # the GEMM kernel itself (cffi build: 1 thread)
            for isa in [refcg_isa, *extra_isas]:
                runners["refcg core 1T" + ("" if isa == refcg_isa else f" {isa}")] = core_dense_runner(name, x, isa)
        for threads in args.threads:
            set_threads(threads)
            active = dict(runners)
            if threads != 1:
                active = {k: v for k, v in active.items() if not k.startswith("refcg core 1T")}
            if onnx_path:
                active["onnxruntime"], outputs["onnxruntime"] = ort_runner(onnx_path, threads)
            if zoo_workload(name):
                peers, peer_outputs = zoo_peers(name, threads, x)
                active.update(peers)
                outputs.update(peer_outputs)
            # 1 thread: every runner computes on this thread, so its CPU time is the latency
            # undisturbed by other processes; more threads: wall clock, and ONNX Runtime in a block of
            # its own, since its spinning workers would take the cores TVM's pool needs (so do PyTorch's
            # and LiteRT's: a block each)
            if threads == 1:
                times = interleaved(active, args.rounds, time.thread_time)
            else:
                times = {}
                for prefix in ("onnx", "pytorch", "litert"):
                    times.update(interleaved({k: active.pop(k) for k in list(active) if k.startswith(prefix)},
                                             args.rounds, time.perf_counter))
                times = {**interleaved(active, args.rounds, time.perf_counter), **times}
            ref_ms = times.get("refcg", float("nan")) * 1e3
            for runner, seconds in times.items():
                # each refcg build against TVM-only for its own target
                exact = outputs.get(f"tvm {runner.split('@')[-1]}" if "@" in runner else "tvm llvm")
                gmacs = macs / seconds / 1e9
                isa = runner_isa(runner, refcg_isa)
                row_peak = peaks.get("avx2_vpmaddubsw", float("nan")) if isa == "avx2" else peak
                diff = ""
                # ONNX Runtime draws its own input; zoo peers requantize their own way (their diff is
                # informative), the two bench networks are not compared
                if exact is not None and runner in outputs and not runner.startswith("onnx") and name not in NETWORKS:
                    diff = runner_module.max_abs_diff([outputs[runner]()], [exact()])
                rows.append(dict(workload=name, threads=threads, runner=runner, isa=isa, ms=seconds * 1e3, gmacs=gmacs,
                                 peak_pct=100 * gmacs / (row_peak * threads), vs_refcg=seconds * 1e3 / ref_ms,
                                 maxdiff=diff))
        print_rows([r for r in rows if r["workload"] == name], macs)
        for note in notes:
            print(f"  note: {note}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(peaks=peaks, rows=rows), indent=1))


def check_not_degenerate(name: str, outputs: dict) -> None:
    """A network whose output takes a few values would be timed on a vacuous computation: stop."""
    from refcodegen.runner import degenerate

    for runner, output in outputs.items():
        reason = degenerate([output()])
        if reason:
            raise SystemExit(f"{name}: {runner}: degenerate network output, {reason}")


def runner_isa(runner: str, refcg_isa: str) -> str:
    """The instruction set a runner computes with: refcg's variant, TVM's -mcpu, ORT's own choice."""
    if runner.startswith("refcg"):
        forced = runner.split()[-1]  # "refcg avx2": forced; "refcg @skylake-avx512": the dispatch's choice
        return forced if forced in ("avx2", "avxvnni", "avx512vnni", "neon", "dotprod", "scalar") else refcg_isa
    if runner.startswith("tvm"):
        return "x86-64 (llvm)" if runner == "tvm llvm" else runner.split()[-1] + (" (avx2)" if runner.endswith("skylake") else "")
    if runner.startswith("pytorch"):
        return "fbgemm dispatch"
    if runner.startswith("litert"):
        return "XNNPACK dispatch"
    return "MLAS dispatch"


def core_dense_runner(name: str, x: np.ndarray, isa: str):
    from tests.core_cffi import Core, Dense
    from refcodegen.numerics import make_requantize

    m, k, n, w, bias = _dense_data(name)
    rq = make_requantize(np.float32(0.0005), np.float32(4.0), 0, 0, "int8", "UPWARD", "int64")
    core = Core()
    dense = Dense(core, weight_nk=w, batch=m, bias=bias, requant=rq)
    out = np.empty((m, n), np.int8)

    def run():
        core.use(isa)  # one process-wide variant: set before every call (an atomic store)
        return dense.run(x, out)

    return run


def print_rows(rows: list, macs: int) -> None:
    if not rows:
        return
    print(f"\n{rows[0]['workload']}  ({macs / 1e6:.1f} M MAC)")
    print(f"  {'thr':>3} {'runner':<26} {'ISA':<16} {'ms':>9} {'GMAC/s':>8} {'%peak':>6} {'x refcg':>8} "
          f"{'maxdiff vs tvm':>15}")
    for r in rows:
        print(f"  {r['threads']:>3} {r['runner']:<26} {r['isa']:<16} {r['ms']:>9.3f} {r['gmacs']:>8.1f} "
              f"{r['peak_pct']:>5.1f}% {r['vs_refcg']:>8.2f} {str(r['maxdiff']):>15}")


if __name__ == "__main__":
    main()
