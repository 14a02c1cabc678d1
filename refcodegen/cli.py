"""The ``refcg`` command: compile, run, report, emit and bench quantized models with refcg.

    refcg compile MODEL -o lib.so [--target x86|aarch64|"llvm ..."] [--input-shape name:1x3x224x224]
    refcg run lib.so [--inputs x.npz] [-o out.npz]
    refcg report MODEL
    refcg emit MODEL -o DIR
    refcg bench MODEL [--threads N]

MODEL is ONNX, TorchScript, TFLite or Relay text (see ``frontends.py``). Slow steps report progress on
stderr; errors name the op, the attribute and the reason, and exit with status 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

import numpy as np
import tvm

from . import runner
from .codegen import generate_c
from .emit import core_source
from .errors import RefcgError
from .frontends import load_model, parse_shape
from .partition import refcg_functions
from .report import offload_report

EMIT_MAKEFILE = """\
# Standalone build of the C that refcg generated for this model (for reading and experiments;
# relay.build + export_library does the same inside TVM). Needs only a C/C++ compiler.
TVM_INCLUDE := {includes}
CXX ?= g++
CFLAGS := -fPIC -Wall -Wextra -Werror $(addprefix -I,$(TVM_INCLUDE))
OBJECTS := {objects}

all: refcg.so
refcg.so: $(OBJECTS)
\t$(CXX) -shared $^ -o $@
%.o: %.c
\t$(CXX) -x c++ $(CFLAGS) -c $< -o $@
clean:
\trm -f $(OBJECTS) refcg.so
"""


def _load(args):
    shapes = dict(parse_shape(text) for text in args.input_shape)
    with runner.progress(f"importing {os.path.basename(args.model)}"):
        return load_model(args.model, shapes)


def _partition(model, target):
    with runner.progress("partitioning for refcg"):
        return runner.partition(model, target)


def cmd_compile(args):
    target = runner.target_string(args.target)
    model = _load(args)
    mod = runner.prepared(model) if args.tvm_only else _partition(model, target)
    with runner.progress(f"building {'TVM-only' if args.tvm_only else 'refcg'} for {target!r}"):
        runner.build(mod, target, args.output)
    runner.write_signature(args.output, model.inputs)
    print(f"wrote {args.output}")


def cmd_run(args):
    if not os.path.isfile(args.library):
        raise RefcgError("run", args.library, "no such file")
    module = runner.load(args.library)
    if args.inputs:
        inputs = dict(np.load(args.inputs))
    else:
        signature = runner.read_signature(args.library)
        if not signature:
            raise RefcgError("run", args.library, f"no {args.library}.json beside it: give --inputs x.npz")
        inputs = runner.random_inputs(signature, args.seed)
        print(f"random inputs (seed {args.seed}): "
              + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in inputs.items()))
    outputs = runner.run(module, inputs)
    for i, out in enumerate(outputs):
        flat = out.reshape(-1)
        print(f"output {i}: {out.dtype}{list(out.shape)} min {flat.min()} max {flat.max()} "
              f"first {np.array2string(flat[:8], separator=' ')}")
    if args.output:
        np.savez(args.output, **{f"output_{i}": out for i, out in enumerate(outputs)})
        print(f"wrote {args.output}")


def cmd_report(args):
    model = _load(args)
    report = offload_report(_partition(model, runner.target_string(args.target)))
    print(report)
    print(f"QNN ops offloaded: {report.qnn_fraction():.1%}")


def cmd_emit(args):
    target = runner.target_string(args.target)
    partitioned = _partition(_load(args), target)
    os.makedirs(args.output, exist_ok=True)
    objects = []
    with runner.progress("generating C"):
        for _, func in refcg_functions(partitioned):
            symbol, source = generate_c(func)
            with open(os.path.join(args.output, f"{symbol}.c"), "w", encoding="utf-8") as f:
                f.write(source)
            objects.append(f"{symbol}.o")
        with open(os.path.join(args.output, "refcg_core.c"), "w", encoding="utf-8") as f:
            f.write(core_source())  # once: every partition's C calls into it
        objects.append("refcg_core.o")
    includes = " ".join(tvm._ffi.libinfo.find_include_path())
    with open(os.path.join(args.output, "Makefile"), "w", encoding="utf-8") as f:
        f.write(EMIT_MAKEFILE.format(includes=includes, objects=" ".join(sorted(objects))))
    with open(os.path.join(args.output, "report.txt"), "w", encoding="utf-8") as f:
        f.write(f"{offload_report(partitioned)}\n")
    print(f"wrote {len(objects)} C file(s) (the core and one per partition), Makefile and report.txt to {args.output} (build: make -C {args.output})")


def bench(model, target: str, model_path: str | None = None, number: int = 5, repeat: int = 5,
          samples: int = 4):
    """Build TVM-only and refcg, run both and the format's own runtime (ONNX Runtime for ONNX,
    LiteRT for TFLite; given ``model_path``), print a table; return the figures and the report.

    Each backend runs ``samples`` random input sets: max |diff| vs TVM-only (in LSB for integer
    outputs) and top-1 agreement (arg-max of the first output) over all of them; latency on the first.
    """
    if runner.cross_arch(target):
        raise RefcgError("bench", target, "runs on this host only; compile for it and run it there")
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    input_sets = [runner.random_inputs(model.inputs, seed) for seed in range(samples)]
    backends = {}
    with tempfile.TemporaryDirectory() as tmp:
        partitioned = _partition(model, target)
        for name, mod in [("TVM-only", runner.prepared(model)), ("refcg", partitioned)]:
            with runner.progress(f"building {name}"):
                module = runner.load(runner.build(mod, target, os.path.join(tmp, f"{name}.so")))
            backends[name] = (lambda inputs, module=module: runner.run(module, inputs),
                              lambda module=module: runner.latency_ms(module, input_sets[0], number, repeat))
        if model_path is not None and model.frontend in runner.PEERS:
            name, open_peer, run_peer = runner.PEERS[model.frontend]
            handle = open_peer(model_path, threads)
            backends[name] = (lambda inputs: run_peer(handle, inputs),
                              lambda: runner.wall_latency_ms(lambda: run_peer(handle, input_sets[0]), number, repeat))
        results = {}
        for name, (run, latency) in backends.items():
            outputs = [run(inputs) for inputs in input_sets]
            with runner.progress(f"timing {name}"):
                results[name] = (outputs[0], latency(), outputs)
    reference = results["TVM-only"][2]
    unit = " (LSB)" if reference[0][0].dtype.kind in "iu" else ""
    print(f"{'backend':<14} {'ms':>9} {'vs TVM-only':>12} {'max |diff| vs TVM-only' + unit:>29} "
          f"{'top-1 = TVM-only':>17}")
    for name, (_, ms, outputs) in results.items():
        diff = max(runner.max_abs_diff(want, got) for want, got in zip(reference, outputs))
        agree = sum(int((runner.top1(want) == runner.top1(got)).sum()) for want, got in zip(reference, outputs))
        total = sum(runner.top1(want).size for want in reference)
        print(f"{name:<14} {ms:>9.3f} {results['TVM-only'][1] / ms:>11.2f}x {diff:>29.6g} {f'{agree}/{total}':>17}")
    report = offload_report(partitioned)
    peers = ", ".join(f"{peer} {threads} thread(s)" for peer, _, _ in runner.PEERS.values() if peer in results)
    print(f"QNN ops offloaded to refcg: {report.qnn_fraction():.1%}; "
          f"TVM threads {os.environ.get('TVM_NUM_THREADS', 'default')}{'; ' + peers if peers else ''}")
    return {name: result[:2] for name, result in results.items()}, report


def cmd_bench(args):
    bench(_load(args), runner.target_string(args.target), args.model, args.number, args.repeat, args.samples)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="refcg", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    def model_command(name, func, help_text):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("model", help="ONNX (.onnx), TorchScript (.pt/.ts), TFLite (.tflite) or Relay text (.relay/.txt)")
        p.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224",
                       help="input shape (repeat per input); required for TorchScript")
        p.add_argument("--target", default="x86", help="x86, aarch64 or a TVM target string (default x86)")
        p.set_defaults(func=func)
        return p

    p = model_command("compile", cmd_compile, "build a deployable library with refcg partitions")
    p.add_argument("-o", "--output", required=True, help="library path (.so)")
    p.add_argument("--tvm-only", action="store_true", help="build without refcg, for comparison")
    model_command("report", cmd_report, "print which ops refcg offloads and why others stay in TVM")
    p = model_command("emit", cmd_emit, "write the generated C and a standalone Makefile")
    p.add_argument("-o", "--output", required=True, help="directory")
    p = model_command("bench", cmd_bench,
                      "refcg vs TVM-only (vs ONNX Runtime or LiteRT) latency, differences, top-1 agreement")
    p.add_argument("--threads", type=int, default=1,
                   help="threads for TVM (TVM_NUM_THREADS) and the peer runtime, default 1")
    p.add_argument("--samples", type=int, default=4, help="random input sets compared (default 4)")
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)

    p = sub.add_parser("run", help="run a compiled library")
    p.add_argument("library")
    p.add_argument("--inputs", help=".npz with one array per input name (default: random, from lib.so.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", help="write outputs to this .npz")
    p.set_defaults(func=cmd_run)
    return top


def error_message(err: Exception) -> str:
    """One line naming op, attribute and reason; TVM wraps errors raised inside relay.build."""
    if isinstance(err, RefcgError):
        return f"{err.op}: {err.attribute}: {err.reason}"
    lines = [line.split("refcg: ")[-1].strip() for line in str(err).splitlines() if "refcg: " in line]
    return lines[-1] if lines else f"{type(err).__name__}: {str(err).strip().splitlines()[-1]}"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger("autotvm").setLevel(logging.ERROR)  # "operators have not been tuned": expected
    if getattr(args, "threads", None):
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    try:
        args.func(args)
    except (RefcgError, tvm.error.TVMError) as err:
        print(f"refcg: error: {error_message(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
