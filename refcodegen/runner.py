"""Build, export, load, run and time a Relay model, with or without refcg (for the CLI and demo)."""
from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from contextlib import contextmanager

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from . import objcache
from .errors import RefcgError
from .partition import partition_for_refcg, prepare_passes

# --target shorthands; any other value is used as a TVM target string.
TARGETS = {
    "x86": "llvm",
    "aarch64": "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon",
}
CROSS_CXX = {"aarch64": "aarch64-linux-gnu-g++"}


def target_string(name: str) -> str:
    return TARGETS.get(name, name)


@contextmanager
def progress(step: str):
    """Say what a slow step is doing and how long it took (on stderr, so stdout stays data)."""
    print(f"[refcg] {step} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    print(f"[refcg] {step}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def partition(model, target: str):
    return partition_for_refcg(model.mod, model.params, target=target, **model.partition_options)


def prepared(model):
    """The graph refcg partitions, before partitioning: params bound, frontend clean-ups run.

    This is the TVM-only reference refcg must match bit for bit. FakeQuantizationToInteger
    changes numerics (float dequantize -> op -> quantize becomes integer QNN), so a TVM-only
    build of the unprepared graph legitimately differs by a few LSB.
    """
    mod = model.mod
    if model.params:
        mod = tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(mod["main"], model.params))
    options = model.partition_options
    passes = prepare_passes(options.get("fold_batch_norm", True), options.get("fake_quantization_to_integer", False))
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def cross_arch(target: str) -> str | None:
    """The architecture a target cross-compiles for, or None for this host."""
    triple = str(tvm.target.Target(target).attrs.get("mtriple", ""))
    arch = triple.split("-")[0]
    return arch if arch in CROSS_CXX and arch != platform.machine() else None


def build(mod, target: str, path: str):
    """relay.build + export_library (cross-compiled when the target is not the host), each C file
    compiled once per content (refcodegen.objcache: the core, a minute of g++ -O3, is the same file
    in every library)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    arch = cross_arch(target)
    export = {"fcompile": objcache.create_shared}
    if arch is not None:
        if shutil.which(CROSS_CXX[arch]) is None:
            raise RefcgError("export", target, f"cross compiler {CROSS_CXX[arch]} not found")
        export["cc"] = CROSS_CXX[arch]
    lib.export_library(path, **export)
    return path


def write_signature(path: str, inputs: dict):
    """``lib.so.json``: input names, shapes and dtypes, so ``refcg run`` can make inputs."""
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump({name: {"shape": list(shape), "dtype": dtype} for name, (shape, dtype) in inputs.items()}, f)


def read_signature(path: str) -> dict:
    try:
        with open(path + ".json", encoding="utf-8") as f:
            return {name: (tuple(v["shape"]), v["dtype"]) for name, v in json.load(f).items()}
    except FileNotFoundError:
        return {}


def random_inputs(inputs: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {}
    for name, (shape, dtype) in inputs.items():
        if np.dtype(dtype).kind == "f":
            data[name] = rng.normal(0, 1, shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            data[name] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    return data


def load(path: str):
    return graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))


def run(module, inputs: dict) -> list[np.ndarray]:
    for name, value in inputs.items():
        module.set_input(name, value)
    module.run()
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


def latency_ms(module, inputs: dict, number: int = 5, repeat: int = 5) -> float:
    """Best-of-``repeat`` mean latency over ``number`` runs."""
    for name, value in inputs.items():
        module.set_input(name, value)
    timer = module.module.time_evaluator("run", tvm.cpu(), number=number, repeat=repeat)
    return min(timer().results) * 1e3


def onnxruntime_session(path: str, threads: int = 1):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def onnxruntime_run(session, inputs: dict) -> list[np.ndarray]:
    return session.run(None, inputs)


def litert_interpreter(path: str, threads: int = 1):
    """LiteRT's interpreter (XNNPACK delegate, its default on CPU) for a ``.tflite`` file."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise RefcgError("bench", "ai_edge_litert", "not installed: pip install 'refcodegen[tflite-models]'") from None
    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    return interpreter


def litert_run(interpreter, inputs: dict) -> list[np.ndarray]:
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], inputs[detail["name"]])
    interpreter.invoke()
    return [interpreter.get_tensor(detail["index"]).copy() for detail in interpreter.get_output_details()]


# The runtime each model format's users compare with: name, (path, threads) -> handle, run.
PEERS = {
    "onnx": ("ONNX Runtime", onnxruntime_session, onnxruntime_run),
    "tflite": ("LiteRT", litert_interpreter, litert_run),
}


def wall_latency_ms(call, number: int = 5, repeat: int = 5) -> float:
    """Best-of-``repeat`` mean wall time of ``call()`` over ``number`` calls (runtimes outside TVM)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1e3


def top1(outputs: list) -> np.ndarray:
    """Arg-max over the last axis of the first output: the class a classifier picks."""
    return np.argmax(outputs[0].reshape(-1, outputs[0].shape[-1]), axis=-1)


def max_abs_diff(a: list, b: list) -> float:
    return max(float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max(initial=0)) for x, y in zip(a, b))


# A network's outputs must take many values, or a bit-exact comparison says little: random weights
# with untouched batch-norm statistics can quantize a whole network to one constant output.
MIN_DISTINCT = 16


def degenerate(outputs: list, minimum: int = MIN_DISTINCT) -> str | None:
    """Why ``outputs`` are degenerate (an output with fewer than ``minimum`` distinct values, or
    half its size when smaller), or None."""
    for i, out in enumerate(outputs):
        want = min(minimum, (out.size + 1) // 2)
        found = len(np.unique(out))
        if found < want:
            return (f"output {i} {out.dtype}{list(out.shape)} takes {found} distinct value(s) "
                    f"(at least {want} expected): {np.unique(out)[:4]}")
    return None
