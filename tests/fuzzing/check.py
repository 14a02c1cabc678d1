"""Building and comparing fuzz chains: TVM-only against refcg for the same target, bit-exact.

x86 numerics run in this process; the aarch64 ones (``ARM_NUMERICS``) are cross-built here and run
by a ``runner`` on the emulated host (``tests/arm/host.py``). TVM-only's own failures and undefined
results are counted apart; a chain refcg refuses to build (RefcgError: e.g. armfuse cannot tell
TVM-only's aarch64 rounding) is isolated by bisection and counted as a refcg build error.
"""
from __future__ import annotations

import time
from collections import Counter

import numpy as np
import tvm
from tvm import relay

from arm.host import CROSS_CXX
from conftest import load, run
from fuzzing.chains import ALL_NUMERICS, ARM_NUMERICS, ChainSpec, build_batch, tvm_only_undefined
from refcodegen import RefcgError, objcache, offload_report, partition_for_refcg
from refcodegen.armfuse import INPUTS_ATTR, OUTPUTS_ATTR
from refcodegen.partition import refcg_functions
from test_ops_common import requantize_config


def merge_partitions(mod):
    """One refcg function per dependency level of the partitions ``main`` calls (fuzz speed).

    Merged, 50 chains in 40 partitions run through the same plan and kernels as one multi-output
    partition: one codegen call and one C file instead of 40 (this was 100 s of export when each
    partition's C still held the whole core; now it saves TVM's per-partition overhead). A partition's level is the longest chain of partitions its inputs come from (through
    ops left in TVM), so partitions of one level never feed each other and merge safely.
    Multi-output partitions stay as they are. The per-input and per-output boundary attributes
    (armfuse) are joined in order; the other attributes are those of the first partition.
    """
    main = mod["main"]
    ours = dict(refcg_functions(mod))
    level = {}

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.GlobalVar) and node.op in ours:
            below = []
            relay.analysis.post_order_visit(relay.Tuple(list(node.args)), lambda n: below.append(level.get(n, -1)))
            level[node] = 1 + max(below, default=-1)

    relay.analysis.post_order_visit(main.body, visit)
    groups = {}
    for call, depth in level.items():
        if not isinstance(mod[call.op].body, relay.Tuple):
            groups.setdefault(depth, []).append(call)
    groups = {depth: calls for depth, calls in groups.items() if len(calls) > 1}
    if not groups:
        return mod
    dropped = {call.op for calls in groups.values() for call in calls} | {mod.get_global_var("main")}
    merged_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in dropped}, attrs=mod.attrs)
    names = {depth: f"tvmgen_default_refcg_fuzz_merged_{depth}" for depth in groups}
    for depth, calls in groups.items():
        funcs = [mod[call.op] for call in calls]
        merged = relay.Function([p for f in funcs for p in f.params], relay.Tuple([f.body for f in funcs]))
        for key in funcs[0].attrs.keys():
            if key not in (INPUTS_ATTR, OUTPUTS_ATTR, "global_symbol"):
                merged = merged.with_attr(key, funcs[0].attrs[key])
        for key in (INPUTS_ATTR, OUTPUTS_ATTR):
            if all(key in f.attrs for f in funcs):
                merged = merged.with_attr(key, [int(v) for f in funcs for v in f.attrs[key]])
        merged_mod[relay.GlobalVar(names[depth])] = merged.with_attr("global_symbol", names[depth])
    merged_mod = relay.transform.InferType()(merged_mod)  # a call's GlobalVar must carry its type
    slot = {call: (depth, i) for depth, calls in groups.items() for i, call in enumerate(calls)}

    class Swap(relay.ExprMutator):
        def __init__(self):
            super().__init__()
            self.whole = {}

        def visit_call(self, call):
            if call not in slot:
                return super().visit_call(call)
            depth, index = slot[call]
            if depth not in self.whole:
                args = [self.visit(a) for c in groups[depth] for a in c.args]
                self.whole[depth] = relay.Call(merged_mod.get_global_var(names[depth]), args)
            return relay.TupleGetItem(self.whole[depth], index)

    merged_mod["main"] = relay.Function(main.params, Swap().visit(main.body), main.ret_type)
    return relay.transform.InferType()(merged_mod)


class TvmOnlyBuildError(Exception):
    """The reference itself cannot be built: no verdict on refcg for that chain."""


def tvm_only_build(specs: list[ChainSpec], numerics: str):
    """(TVM-only library, module, inputs) of ``specs``; call it inside the numerics' requantize_config."""
    mod, inputs = build_batch(specs, numerics)
    try:
        with tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=ALL_NUMERICS[numerics][0]), mod, inputs
    except tvm.TVMError as error:
        lines = str(error).strip().splitlines()
        at = next((i for i, line in enumerate(lines) if "Error:" in line), len(lines) - 1)
        raise TvmOnlyBuildError(" ".join(lines[at: at + 2])) from error  # the message and its first detail
    except Exception as error:  # noqa: BLE001 - refcg has no part in this build: whatever it raises is TVM's
        # seen: IndexError in the x86 int8 conv schedule (autotvm define_split), UnboundLocalError in the
        # arm_cpu strategy for NHWC int8 depthwise with +dotprod, ValueError in topi/x86/batch_matmul.py
        # (its schedule on aarch64 when a reshape is fused after the batch_matmul)
        raise TvmOnlyBuildError(repr(error)) from error


def isolate_unbuildable(specs: list[ChainSpec], numerics: str, error: str) -> tuple[list, list]:
    """Bisects ``specs`` (which TVM-only cannot build). Returns ([(spec, error)] of the chains it cannot
    build, [(specs, lib, module, inputs)] of the parts it built, in order): the built parts are kept so the
    batch is not built a second time."""
    if len(specs) == 1:
        return [(specs[0], error)], []
    bad, built = [], []
    for half in (specs[: len(specs) // 2], specs[len(specs) // 2:]):
        try:
            built.append((half, *tvm_only_build(half, numerics)))
        except TvmOnlyBuildError as half_error:
            half_bad, half_built = isolate_unbuildable(half, numerics, str(half_error))
            bad, built = bad + half_bad, built + half_built
    return bad, built


class _Phases:
    """Seconds per phase, added into ``totals`` (a Counter) when given: ``make fuzz`` prints them."""

    def __init__(self, totals):
        self.totals, self.last = totals, time.perf_counter()

    def __call__(self, phase: str):
        now = time.perf_counter()
        if self.totals is not None:
            self.totals[phase] += now - self.last
        self.last = now


def run_here(path, inputs) -> list:
    return run(load(str(path)), inputs)


def _export_and_run(lib, path, inputs, phase, who: str, numerics: str, runner):
    """export_library (the aarch64 cross compiler for ARM numerics) + run, timed as two phases."""
    cc = {"cc": CROSS_CXX} if numerics in ARM_NUMERICS else {}
    lib.export_library(str(path), fcompile=objcache.create_shared, **cc)  # the core compiles once per process
    phase(f"{who} export_library")
    outputs = runner(path, inputs)
    phase("load + run")
    return outputs


def _nothing(undefined: list, unbuildable: list, refused: list = ()) -> dict:
    return {"cases": 0, "mismatches": [], "undefined": undefined, "unbuildable": unbuildable,
            "refcg build errors": list(refused), "outputs": [], "partitions": 0, "offloaded": 0, "stayed": [],
            "composites": Counter()}


def refcg_build(specs: list[ChainSpec], numerics: str, merge: bool, mod=None):
    """(refcg library, partitioned module) of ``specs`` (``mod``: their module when already built).
    The target goes to partition_for_refcg, as the README asks: a cross-compiling user must (lookup
    tables and softmax cannot be computed for aarch64 here: they stay in TVM with that reason), and on
    FMA targets what TVM-only computes in a stage-by-stage conv kernel stays in TVM (stagewise.py)."""
    target = ALL_NUMERICS[numerics][0]
    mod = build_batch(specs, numerics)[0] if mod is None else mod
    partitioned = partition_for_refcg(mod, target=target)
    if merge:
        partitioned = merge_partitions(partitioned)
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(partitioned, target=target), partitioned


def isolate_refused(specs: list[ChainSpec], numerics: str, merge: bool, error: str) -> list:
    """[(spec, RefcgError text)] of the chains in ``specs`` (which refcg refuses to build) whose own
    refcg build raises RefcgError, by bisection."""
    if len(specs) == 1:
        return [(specs[0], error)]
    bad = []
    for half in (specs[: len(specs) // 2], specs[len(specs) // 2:]):
        try:
            refcg_build(half, numerics, merge)
        except RefcgError as half_error:
            bad += isolate_refused(half, numerics, merge, str(half_error))
    return bad


def same(want: np.ndarray, got: np.ndarray) -> bool:
    """Bit-exact (float outputs compared by their bits: NaN equals NaN)."""
    if want.dtype != got.dtype or want.shape != got.shape:
        return False
    if want.dtype.kind == "f":
        return np.array_equal(want.view(f"i{want.itemsize}"), got.view(f"i{got.itemsize}"))
    return np.array_equal(want, got)


def max_diff(want: np.ndarray, got: np.ndarray):
    """Largest |difference| (floats: in units of the last place), None when the shapes differ."""
    if want.shape != got.shape:
        return None
    if want.dtype.kind == "f" and got.dtype == want.dtype:
        want, got = want.view(f"i{want.itemsize}"), got.view(f"i{got.itemsize}")
    return np.abs(want.astype(np.int64) - got.astype(np.int64)).max(initial=0)


def tvm_only_check(specs: list[ChainSpec], numerics: str, tmp_path, runner=run_here) -> list:
    """Only TVM-only's side of ``check_batch``: build, export and run (the fuzz's triage of a chain
    that kills the process: does TVM-only alone do it?)."""
    target, config = ALL_NUMERICS[numerics]
    with requantize_config(target, config):
        lib, _, inputs = tvm_only_build(specs, numerics)
        return _export_and_run(lib, tmp_path / "tvm_only.so", inputs, _Phases(None), "TVM-only", numerics, runner)


def check_batch(specs: list[ChainSpec], numerics: str, tmp_path, merge: bool = False, timings=None,
                runner=run_here) -> dict:
    """Build TVM-only and refcg, compare every chain; returns counts and the mismatching specs.

    ``runner(library path, inputs)`` runs an exported library: here by default, on the emulated
    aarch64 host for ARM numerics (see ``fuzzing.arm``)."""
    phase = _Phases(timings)
    target, config = ALL_NUMERICS[numerics]
    # not even built: running TVM-only's division by zero can trap (SIGFPE) and kill the process
    undefined = [(spec, tvm_only_undefined(spec, numerics)) for spec in specs if tvm_only_undefined(spec, numerics)]
    specs = [spec for spec in specs if not tvm_only_undefined(spec, numerics)]
    if not specs:
        return _nothing(undefined, [])
    with requantize_config(target, config):
        unbuildable = []  # TVM's bugs, not refcg's: those chains are counted apart and left out
        try:
            built = [(specs, *tvm_only_build(specs, numerics))]
        except TvmOnlyBuildError as error:
            phase("TVM-only relay.build")
            unbuildable, built = isolate_unbuildable(specs, numerics, str(error))
            phase("isolating chains TVM-only cannot build")
            if not built:
                return _nothing(undefined, unbuildable)
        phase("TVM-only relay.build")
        reference = [out for i, (_, lib, _, inputs) in enumerate(built)
                     for out in _export_and_run(lib, tmp_path / f"tvm_only{i}.so", inputs, phase, "TVM-only",
                                                numerics, runner)]
        specs = [spec for part, *_ in built for spec in part]
        # a chain's inputs and weights come from its own seed, so the parts' reference outputs line up
        # with one module of all the chains TVM-only could build
        mod, inputs = built[0][2:] if len(built) == 1 else build_batch(specs, numerics)
        refused = []
        try:
            lib, partitioned = refcg_build(specs, numerics, merge, mod)
        except RefcgError as error:
            refused = isolate_refused(specs, numerics, merge, str(error))
            reference = [out for spec, out in zip(specs, reference) if all(spec is not bad for bad, _ in refused)]
            specs = [spec for spec in specs if all(spec is not bad for bad, _ in refused)]
            if not specs:
                return _nothing(undefined, unbuildable, refused)
            mod, inputs = build_batch(specs, numerics)
            lib, partitioned = refcg_build(specs, numerics, merge, mod)
        phase("refcg partition + relay.build")
        actual = _export_and_run(lib, tmp_path / "refcg.so", inputs, phase, "refcg", numerics, runner)
    assert len(reference) == len(actual) == len(specs)
    report = offload_report(partitioned)
    mismatches = [(spec, max_diff(want, got)) for spec, want, got in zip(specs, reference, actual)
                  if not same(want, got)]
    return {"cases": len(specs), "mismatches": mismatches, "undefined": undefined,
            "unbuildable": unbuildable, "refcg build errors": refused,
            "outputs": list(zip(reference, actual)),
            "partitions": len(refcg_functions(partitioned)),
            "offloaded": sum(report.offloaded_ops.values()), "stayed": report.stayed,
            "composites": Counter(c for kernels in report.partitions.values() for c, _ in kernels)}
