"""``make fuzz``: many random QNN chains, refcg against TVM-only, bit-exact.

Uses the hypothesis strategies of ``fuzzing.chains``. Each build holds ``--batch`` independent
chains (one output each), so one TVM-only and one refcg build check them all; the refcg partitions
of a batch are merged into one (see ``merge_partitions``). Chains come from ``fuzz_batches`` (distinct chains, pooled per numerics: target /
requantize_config). Mismatches are printed as specs and appended to ``--failures`` (JSON lines)
for regression tests; chains whose TVM-only result is undefined or wrong are counted apart. ``--jobs``
processes (default: one per core) draw from seeds ``seed``, ``seed+1``...: chains are distinct within a
process; two seeds can draw the same chain (hypothesis' all-minimal one, say), which is checked twice.
``--arm`` (``make fuzz-arm``): the aarch64 numerics, cross-built and run on the emulated host
(tools/arm/setup.sh) against TVM-only built for the same target; chains refcg refuses to build
(RefcgError) are counted as refcg build errors.

    cd tests && python -m fuzzing --cases 10000 --batch 20 --seed 1 --jobs 2
    cd tests && python -m fuzzing --arm --cases 1000 --jobs 1
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import strategies as st

from fuzzing.chains import ALL_NUMERICS, ARM_NUMERICS, families, fuzz_batches
from fuzzing.check import check_batch, run_here, tvm_only_check


def large_constants(layers: int = 11, channels: int = 512) -> int:
    """Codegen + export time and peak RSS for ~25M int8 weights (ResNet-50 sized): 3x3 convs."""
    import resource

    import numpy as np
    import tvm
    from tvm import relay

    import refcodegen  # noqa: F401
    from models import module, qconv_block
    from refcodegen import partition_for_refcg

    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, channels, 7, 7), dtype="int8")
    y = x
    for _ in range(layers):
        y = qconv_block(y, rng, in_c=channels, out_c=channels, input_scale=0.1)
    weights = layers * channels * channels * 9
    start = time.time()
    mod = partition_for_refcg(module([x], y))
    partitioned = time.time()
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm")
    built = time.time()
    source_mb = sum(len(m.get_source()) for m in lib.get_lib().imported_modules) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        # the compiler's own peak: forked children inherit Python's RSS figure, so ask time(1)
        wrapper = Path(tmp) / "cxx"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/time -a -o {tmp}/rss -f %M g++ "$@"\n')
        wrapper.chmod(0o755)
        lib.export_library(f"{tmp}/big.so", cc=str(wrapper))
        exported = time.time()
        so_mb = Path(f"{tmp}/big.so").stat().st_size / 1e6
        children = max(int(v) for v in Path(f"{tmp}/rss").read_text().split()) / 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{weights / 1e6:.1f}M int8 weights in {layers} convs: partition {partitioned - start:.1f} s, "
          f"relay.build (codegen) {built - partitioned:.1f} s, export_library {exported - built:.1f} s; "
          f"C source {source_mb:.0f} MB, .so {so_mb:.0f} MB; peak RSS python {own:.0f} MB, g++ {children:.0f} MB")
    return 0


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (g++): what a busy machine's
    wall clock hides."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def cache_tvm_libinfo():
    """TVM's lowering asks ``tvm.support.libinfo()`` (a ~100-entry map rebuilt through the FFI) once
    per tensor dimension: ~10% of a fuzz build's CPU. Its answer is fixed for the process, so cache it;
    what TVM compiles does not change."""
    import functools

    import tvm.support
    from tvm.relay.backend import te_compiler

    te_compiler.libinfo = functools.lru_cache(maxsize=None)(tvm.support.libinfo)


def fuzz(args) -> dict:
    """One process: ``args.cases`` chains from ``args.seed``; returns the counters for the summary."""
    cache_tvm_libinfo()
    totals = Counter()
    stayed = Counter()
    drawn, composites = Counter(), Counter()  # families drawn (chains.families), refcg kernels built
    timings = Counter()  # seconds per phase, over all batches
    start = time.time()
    stop = []  # set by SIGTERM
    host = None  # the emulated aarch64 host, for ARM numerics

    def record(**entry):
        with open(args.failures, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def check(specs, numerics):
        nonlocal host
        if numerics in ARM_NUMERICS and host is None:
            from fuzzing.arm import EmulatedHost
            host = EmulatedHost()
        runner = host.runner(numerics) if numerics in ARM_NUMERICS else run_here
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = check_batch(specs, numerics, Path(tmp), merge=True, timings=timings, runner=runner)
            except Exception as error:  # a build failure is a finding too: count it, keep going
                totals["build errors"] += 1
                print(f"BUILD ERROR ({numerics}): {type(error).__name__}: {str(error).splitlines()[-1:]}", flush=True)
                record(numerics=numerics, error=str(error)[-2000:], specs=[dataclasses.asdict(s) for s in specs])
                return
        totals["batches"] += 1
        totals["cases"] += result["cases"]
        totals["mismatches"] += len(result["mismatches"])
        totals["refcg build errors"] += len(result["refcg build errors"])
        totals["chains TVM-only leaves undefined or gets wrong (not compared)"] += len(result["undefined"])
        totals["chains TVM-only cannot build (not compared)"] += len(result["unbuildable"])
        drawn.update(name for spec in specs for name in families(spec))
        composites.update(result["composites"])
        for spec, error in result["unbuildable"]:  # TVM's bug: kept to explain, not a refcg failure
            print(f"TVM-ONLY BUILD ERROR ({numerics}): {error[:200]}: {spec!r}", flush=True)
            record(numerics=numerics, tvm_only_error=error, spec=dataclasses.asdict(spec))
        for spec, error in result["refcg build errors"]:  # refcg refused (RefcgError): a finding
            print(f"REFCG BUILD ERROR ({numerics}): {error[:300]}: {spec!r}", flush=True)
            record(numerics=numerics, refcg_error=error, spec=dataclasses.asdict(spec))
        totals["refcg partitions"] += result["partitions"]
        totals["offloaded ops"] += result["offloaded"]
        totals["ops left in TVM"] += len(result["stayed"])
        stayed.update(reason for op, _, reason in result["stayed"] if op != "tuple")
        for spec, diff in result["mismatches"]:
            print(f"MISMATCH ({numerics}, max diff {diff}): {spec!r}", flush=True)
            record(numerics=numerics, max_diff=None if diff is None else int(diff), spec=dataclasses.asdict(spec))
        print(f"[seed {args.seed}, {time.time() - start:7.0f} s, {sum(timings.values()) / max(1, totals['cases']):.2f} s/case, "
              f"cpu {cpu_seconds() / max(1, totals['cases']):.2f} s/case] "
              f"batch {totals['batches']:4d} {numerics:<15} "
              f"cases {totals['cases']:6d}  mismatches {totals['mismatches']}  "
              f"offloaded ops {totals['offloaded ops']}  left in TVM {totals['ops left in TVM']}", flush=True)

    # kill PID: finish the current build, then print the summary
    signal.signal(signal.SIGTERM, lambda *_: stop.append(print("\nSIGTERM: stopping after this build", flush=True)))
    drawing = fuzz_batches(args.cases, args.batch, args.seed,
                           **({"numerics": st.sampled_from(args.numerics)} if args.numerics else {}))
    def counters(finished: bool) -> dict:
        return {"totals": totals, "timings": timings, "stayed": stayed, "drawn": drawn, "composites": composites,
                "cpu": cpu_seconds(), "finished": finished}

    in_flight = Path(f"{args.summary}.batch") if args.worker else None
    # test of the supervision (test_fuzz.py): "SEED:N" aborts the worker of that seed at its Nth batch
    abort_seed, _, abort_batch = os.environ.get("REFCG_FUZZ_ABORT", "-1:-1").partition(":")
    started = 0
    try:
        while not stop:
            drawn_at = time.perf_counter()
            specs, numerics = next(drawing, (None, None))
            timings["hypothesis (drawing)"] += time.perf_counter() - drawn_at
            if specs is None:
                break
            if in_flight:  # a build or run that kills this process leaves its batch for the parent to triage
                in_flight.write_bytes(pickle.dumps((specs, numerics)))
            started += 1
            if (args.seed, started) == (int(abort_seed), int(abort_batch)):
                os.abort()
            check(specs, numerics)
            if in_flight:
                write_json(Path(args.summary), counters(False))  # what is vouched for so far
                in_flight.unlink()
    finally:
        if host is not None:
            host.close()
    return counters(True)


def write_json(path: Path, value) -> None:
    """Atomically: a process killed while writing leaves the previous version."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(value))
    part.replace(path)


def _worker(args, tmp: str, name: str, cases: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen([
        sys.executable, "-m", "fuzzing", "--worker", "--jobs", "1", "--cases", str(cases), "--batch", str(args.batch),
        "--seed", str(seed), "--failures", f"{tmp}/failures{name}.jsonl", "--summary", f"{tmp}/summary{name}.json",
        *(["--numerics", *args.numerics] if args.numerics else [])], cwd=TESTS)


def accounted(totals) -> int:
    """Chains a worker drew and gave a verdict on (compared, or counted apart with a reason)."""
    return totals.get("cases", 0) + totals.get("chains TVM-only leaves undefined or gets wrong (not compared)", 0) \
        + totals.get("chains TVM-only cannot build (not compared)", 0) + totals.get("refcg build errors", 0)


def fuzz_parallel(args) -> dict:
    """``args.jobs`` worker processes (seeds seed .. seed+jobs-1) sharing ``args.cases``; returns their
    counters summed. Each worker writes its failures apart; they are appended to ``args.failures`` at
    the end. kill PID stops every worker after its current build.

    A worker killed by a build or a run (an LLVM assertion, a crash in a kernel) loses only the batch
    in flight: its counters are saved after every batch, the batch is triaged chain by chain
    (``triage``) and a new worker (another seed) checks the chains still to do."""
    merged = {"totals": Counter(), "timings": Counter(), "stayed": Counter(), "drawn": Counter(),
              "composites": Counter(), "cpu": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        todo = {job: args.cases // args.jobs + (job < args.cases % args.jobs) for job in range(args.jobs)}
        running = {job: (0, _worker(args, tmp, f"{job}_0", todo[job], args.seed + job)) for job in todo}
        signal.signal(signal.SIGTERM, lambda *_: [child.terminate() for _, child in running.values()])
        while running:
            time.sleep(0.2)
            for job, (attempt, child) in list(running.items()):
                code = child.poll()
                if code is None:
                    continue
                del running[job]
                name = f"{job}_{attempt}"
                summary_path = Path(f"{tmp}/summary{name}.json")
                summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
                if summary is not None:
                    for key, value in summary.items():
                        if isinstance(value, dict):
                            merged[key].update(value)  # keeps zero counts ("mismatches 0"), unlike +
                        elif key != "finished":
                            merged[key] += value
                    todo[job] -= accounted(summary["totals"])
                failures = Path(f"{tmp}/failures{name}.jsonl")
                if failures.exists():
                    with open(args.failures, "a") as out:
                        out.write(failures.read_text())
                if summary is not None and summary.get("finished"):
                    continue
                in_flight = Path(f"{tmp}/summary{name}.json.batch")
                print(f"seed {args.seed + job + 1000 * attempt}: the fuzz process died (exit code {code})", flush=True)
                if not in_flight.exists():  # died outside a batch: nothing to triage, nothing more to trust
                    merged["totals"]["processes that died"] += 1
                    continue
                specs, numerics = pickle.loads(in_flight.read_bytes())
                merged["totals"].update(triage(specs, numerics, args.failures, tmp))
                todo[job] -= len(specs)
                if todo[job] > 0 and attempt < MAX_RESTARTS:
                    running[job] = (attempt + 1, _worker(args, tmp, f"{job}_{attempt + 1}", todo[job],
                                                         args.seed + job + 1000 * (attempt + 1)))
                elif todo[job] > 0:
                    merged["totals"]["processes that died"] += 1  # gave up: the campaign is short of chains
    return merged


MAX_RESTARTS = 5
TESTS = Path(__file__).resolve().parent.parent  # tests/: the package and the modules it imports


# --replay exit codes (0: compared, equal); anything else, a signal included, is a process that died
REPLAY = {11: "mismatches", 12: "refcg build errors", 13: "chains TVM-only cannot build (not compared)",
          14: "build errors"}


def triage(specs, numerics: str, failures: str, tmp: str) -> Counter:
    """Each chain of a batch that killed its worker, alone, in a process of its own: the whole check
    (counted like any chain), then, if that dies, TVM-only alone. A chain that kills TVM-only is TVM's
    bug (not compared); one that kills only the refcg side is a refcg failure; a death no single
    chain repeats is counted as a process that died."""
    found = Counter()
    for i, spec in enumerate(specs):
        path = Path(f"{tmp}/triage{i}.pickle")
        path.write_bytes(pickle.dumps(([spec], numerics)))
        whole = subprocess.run([sys.executable, "-m", "fuzzing", "--replay", str(path), "whole"], cwd=TESTS,
                               capture_output=True, text=True)
        if whole.returncode == 0 or whole.returncode in REPLAY:
            found["cases" if whole.returncode == 0 else REPLAY[whole.returncode]] += 1
            if whole.returncode in (11, 12, 14):
                print(f"{REPLAY[whole.returncode].upper()} ({numerics}, replayed alone): {spec!r}\n"
                      f"{whole.stdout[-1000:]}", flush=True)
                with open(failures, "a") as out:
                    out.write(json.dumps({"numerics": numerics, "replayed": REPLAY[whole.returncode],
                                          "output": whole.stdout[-2000:], "spec": dataclasses.asdict(spec)}) + "\n")
            continue
        alone = subprocess.run([sys.executable, "-m", "fuzzing", "--replay", str(path), "tvm-only"], cwd=TESTS,
                               capture_output=True, text=True).returncode
        verdict = "chains that kill refcg" if alone in (0, 14) else "chains that kill TVM-only (not compared)"
        found[verdict] += 1
        print(f"{verdict.upper()} ({numerics}): {spec!r}", flush=True)
        with open(failures, "a") as out:
            out.write(json.dumps({"numerics": numerics, "killed": verdict, "spec": dataclasses.asdict(spec)}) + "\n")
    if not any(key.startswith("chains that kill") for key in found):
        found["processes that died"] += 1  # no chain alone repeats it: recorded for a closer look
        with open(failures, "a") as out:
            out.write(json.dumps({"numerics": numerics, "killed": "the batch, no chain alone",
                                  "specs": [dataclasses.asdict(spec) for spec in specs]}) + "\n")
    return found


def replay(path: str, phase: str) -> int:
    """``--replay FILE whole|tvm-only`` (triage): check a pickled one-chain batch (exit 0 or a ``REPLAY``
    code), or build, export and run only its TVM-only side (0, or 14 for an error); a crash kills it."""
    specs, numerics = pickle.loads(Path(path).read_bytes())
    host = None
    if numerics in ARM_NUMERICS:
        from fuzzing.arm import EmulatedHost
        host = EmulatedHost()
    # the emulated server starts only when a library is run (a build that aborts never needs it)
    runner = (lambda lib, inputs: host.runner(numerics)(lib, inputs)) if host else run_here
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if phase == "tvm-only":
                tvm_only_check(specs, numerics, Path(tmp), runner)
                return 0
            result = check_batch(specs, numerics, Path(tmp), merge=True, runner=runner)
            print(result["mismatches"], result["refcg build errors"], flush=True)
            if result["mismatches"]:
                return 11
            if result["refcg build errors"]:
                return 12
            return 0 if result["cases"] else 13  # TVM-only leaves it undefined or cannot build it
    except Exception as error:
        print(f"{type(error).__name__}: {error}", flush=True)
        return 14
    finally:
        if host is not None:
            host.close()


def print_summary(result: dict, jobs: int, elapsed: float) -> None:
    totals, timings = result["totals"], result["timings"]
    print(f"\nfuzz summary after {elapsed:.0f} s ({jobs} process(es)): "
          + ", ".join(f"{k} {v}" for k, v in totals.items()))
    cases = max(1, totals["cases"])
    print(f"CPU (fuzz processes + g++): {result['cpu']:.0f} s, {result['cpu'] / cases:.2f} s/case")
    print(f"wall seconds per phase, summed over processes (s/case over {totals['cases']} cases):")
    for phase, seconds in timings.most_common():
        print(f"  {seconds:8.1f} s  {seconds / cases:6.3f}  {phase}")
    print("ops left in TVM, by reason:")
    for reason, count in result["stayed"].most_common(10):
        print(f"  {count:6d}  {reason}")
    for title, key in (("drawn, by family (fuzzing.chains.families)", "drawn"), ("refcg kernels built", "composites")):
        print(f"{title}:\n  " + ", ".join(f"{name} {count}" for name, count in sorted(result[key].items())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-constants", action="store_true",
                        help="instead of fuzzing: time and memory for a ResNet-50-sized weight set")
    parser.add_argument("--cases", type=int, default=10000, help="random chains to check")
    parser.add_argument("--batch", type=int, default=20,
                        help="chains per build (TVM-only's build grows faster than linearly)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes, one seed each (seed, seed+1, ...): one per core")
    parser.add_argument("--failures", default=str(Path(__file__).resolve().parents[2] / "fuzz-failures.jsonl"),
                        help="mismatching and failing chains as JSON lines (default: at the repository root)")
    parser.add_argument("--summary", help="also write the counters as JSON (how --jobs collects them)")
    parser.add_argument("--numerics", nargs="+", choices=list(ALL_NUMERICS),
                        help="draw only these numerics (default: all x86 ones, evenly), e.g. float32 for an FMA target")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of fuzz_parallel's
    parser.add_argument("--replay", nargs=2, metavar=("PICKLE", "PHASE"), help=argparse.SUPPRESS)
    parser.add_argument("--arm", action="store_true",
                        help="the aarch64 numerics (+neon,+dotprod on QEMU max, +neon on cortex-a53), emulated")
    args = parser.parse_args()
    if args.large_constants:
        return large_constants()
    if args.replay:
        return replay(*args.replay)
    if args.arm:
        args.numerics = args.numerics or list(ARM_NUMERICS)
    if set(args.numerics or ()) & set(ARM_NUMERICS) and not args.worker:  # the parent sets the host up once
        import pytest

        from arm.host import ensure_host
        try:
            ensure_host()
        except pytest.skip.Exception as why:
            print(why, file=sys.stderr)
            return 3
    start = time.time()
    # the top process only supervises (a worker killed by a build is replaced)
    result = fuzz(args) if args.worker else fuzz_parallel(args)
    if args.summary:
        write_json(Path(args.summary), result)
    if not args.worker:  # a worker's counters are summed and printed by the parent
        print_summary(result, args.jobs, time.time() - start)
    totals = result["totals"]
    failed = ("mismatches", "build errors", "refcg build errors", "processes that died", "chains that kill refcg")
    return 1 if any(totals[key] for key in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
