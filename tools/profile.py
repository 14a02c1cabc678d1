"""Where a network's time goes: refcg's kernels one by one, and what TVM runs around them.

Builds a workload of the bench (a zoo network "<name>@<size>", or a bench network / single op) with
refcg for a target, exports it with -DREFCG_PROFILE (a CPU-time timer around each kernel, printed when
the library unloads) and runs it in a child process on one thread (TVM's pool of one, so every kernel
runs on the calling thread). Prints the kernels by family (calls, ms per run, share), the slowest
steps, and the rest of a run's CPU time: TVM's own kernels between partitions and the executor.
With ``--threads 1 2``, elapsed time instead (-DREFCG_PROFILE_WALL), one child per thread count: each
family and step with its time on every count and its speed-up, to see which kernels do not scale.

Usage, from the repository root:
    python -m tools.profile mobilenet_v2@224 [--target "llvm -mcpu=skylake"] [--isa avx2] [--runs 50] [--top 15]
                            [--threads 1 2]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
# before TVM loads; the parent sets it for each child (1: the pool computes on the calling thread)
os.environ.setdefault("TVM_NUM_THREADS", "1")

# "refcg profile <symbol> <ms> ms  <step> <family> <input shape> -> <output shape>" (templates/module.c.j2)
LINE = re.compile(r"^refcg profile (\S+)\s+([\d.]+) ms\s+(\S+) (\S+) (.*)$")


def build(name: str, target: str, path: str, wall: bool) -> None:
    """Partition ``name`` for ``target`` with refcg and export it with the kernel timers compiled in
    (``wall``: elapsed time, else the calling thread's CPU time)."""
    import tvm
    from tvm import relay

    from refcodegen import offload_report, partition_for_refcg
    from tools import bench

    mod = partition_for_refcg(bench.relay_module(name), target=target,
                              fold_batch_norm=not bench.zoo_workload(name))
    report = offload_report(mod)
    print(f"{name}: {len(report.partitions)} partition(s), {sum(report.offloaded_ops.values())} ops offloaded, "
          f"{len(report.stayed)} left in TVM; built for {target}", flush=True)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    lib.export_library(path, options=["-DREFCG_PROFILE"] + ["-DREFCG_PROFILE_WALL"] * wall)


def run_child(path: str, name: str, runs: int, wall: bool) -> None:
    """In the child: ``runs`` runs after a warm-up; prints the ms per run (elapsed if ``wall``, else
    CPU); the library prints its profile to stderr when the process exits."""
    import time

    import numpy as np

    from tools import bench

    x = bench.example_input(bench.relay_module(name), name)
    run, _ = bench.graph_runner(path, x)  # runs once: the warm-up (and the core's ISA choice)
    clock = time.perf_counter if wall else time.thread_time
    start = clock()
    for _ in range(runs):
        run()
    print(f"ms per run {(clock() - start) * 1e3 / max(1, runs):.4f}", flush=True)
    print(f"calls {runs + 1}", file=sys.stderr, flush=True)
    np.asarray(0)  # keep numpy imported until exit (the profile prints from a destructor)


def steps_of(stderr: str) -> dict:
    """{(symbol, step, family, shapes): ms summed over every call} of a profiled library's stderr (it
    prints each step's mean over its calls; ``calls`` is read from the child's own line)."""
    calls = int(re.search(r"calls (\d+)", stderr)[1])
    return {(m[1], m[3], m[4], m[5]): float(m[2]) * calls for m in map(LINE.match, stderr.splitlines()) if m}


def by_family(steps: dict) -> dict:
    """{family: [steps, ms per run]} of ``steps`` (keyed as ``steps_of``)."""
    families = defaultdict(lambda: [0, 0.0])
    for (_, _, family, _), ms in steps.items():
        families[family][0] += 1
        families[family][1] += ms
    return families


def report(steps: dict, total_ms: float, top: int) -> None:
    """Kernels by family and the slowest steps (``steps``: ms per run)."""
    kernels = sum(steps.values())
    print(f"\nCPU per run (1 thread): {total_ms:.3f} ms; refcg kernels {kernels:.3f} ms in {len(steps)} steps "
          f"of {len({key[0] for key in steps})} partition(s); the rest (TVM's kernels, executor) "
          f"{total_ms - kernels:.3f} ms")
    print(f"\n{'family':<24}{'steps':>6}{'ms/run':>10}{'share':>8}")
    for family, (count, ms) in sorted(by_family(steps).items(), key=lambda kv: -kv[1][1]):
        print(f"{family:<24}{count:>6}{ms:>10.3f}{ms / total_ms:>8.1%}")
    print(f"\nslowest {top} steps:")
    for (symbol, step, family, shapes), ms in sorted(steps.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ms:8.3f} ms  {family:<20} {shapes}  ({symbol} {step})")


def report_threads(runs: dict, top: int) -> None:
    """Elapsed ms per run on each thread count (``runs``: {threads: (steps, total ms)}), by family and
    for the slowest steps of the first count, with the speed-up of the last count over the first."""
    counts = list(runs)
    first, last = counts[0], counts[-1]
    head = "".join(f"{f'{n} thr ms':>11}" for n in counts) + f"{'speed-up':>10}"

    def row(values: list) -> str:
        return "".join(f"{v:>11.3f}" for v in values) + f"{values[0] / values[-1] if values[-1] else 0:>9.2f}x"

    totals = [runs[n][1] for n in counts]
    kernels = [sum(runs[n][0].values()) for n in counts]
    print(f"\nelapsed ms per run by thread count:\n{'':<30}{head}\n{'whole run':<30}{row(totals)}")
    print(f"{'refcg kernels':<30}{row(kernels)}\n{'the rest (TVM, executor)':<30}{row([t - k for t, k in zip(totals, kernels)])}")
    families = {n: by_family(runs[n][0]) for n in counts}
    print(f"\n{'family':<24}{'steps':>6}{head}")
    for family, (count, _) in sorted(families[first].items(), key=lambda kv: -kv[1][1]):
        print(f"{family:<24}{count:>6}{row([families[n].get(family, [0, 0.0])[1] for n in counts])}")
    print(f"\nslowest {top} steps on {first} thread(s), by their time lost to {last}:")
    slow = sorted(runs[first][0], key=lambda key: -runs[first][0][key])[:top]
    for key in sorted(slow, key=lambda key: runs[first][0][key] / max(runs[last][0].get(key, 0.0), 1e-9)):
        print(f"  {row([runs[n][0].get(key, 0.0) for n in counts])}  {key[2]:<14} {key[3]}  ({key[0]} {key[1]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help='a zoo network "<name>@<size>" or a tools.bench workload')
    parser.add_argument("--target", default="llvm", help="the target refcg and TVM build for (its numerics follow it)")
    parser.add_argument("--isa", default=None, help="force refcg's variant (REFCG_ISA), e.g. avx2")
    parser.add_argument("--runs", type=int, default=30, help="timed runs (after one warm-up run)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="TVM_NUM_THREADS of each child; more than one count (or one above 1) times elapsed time")
    parser.add_argument("--wall", action="store_true", help=argparse.SUPPRESS)  # the child's clock
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child, args.workload, args.runs, args.wall)
        return
    wall = args.threads != [1]
    work = tempfile.mkdtemp(prefix="refcg-profile-")
    os.environ["REFCG_ZOO_DIR"] = work  # bench.zoo_model's build directory, shared with the child
    path = os.path.join(work, "profiled.so")
    build(args.workload, args.target, path, wall)

    def child(runs: int, threads: int) -> tuple[dict, float]:
        env = dict(os.environ, TVM_NUM_THREADS=str(threads), **({"REFCG_ISA": args.isa} if args.isa else {}))
        done = subprocess.run([sys.executable, "-m", "tools.profile", args.workload, "--runs", str(runs),
                               "--child", path] + ["--wall"] * wall, capture_output=True, text=True, env=env,
                              cwd=bench_root())
        measured = re.search(r"ms per run ([\d.]+)", done.stdout)
        if done.returncode or not measured:
            sys.exit(f"the profiled run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        steps = steps_of(done.stderr)
        if not steps:
            sys.exit("no 'refcg profile' lines: nothing was offloaded, or the library was built without -DREFCG_PROFILE")
        return steps, float(measured[1])

    runs = {}
    for threads in args.threads:
        # the first call of a fresh library (the core choosing its variant, pages touched first) is
        # not what a run costs: a child that only warms up is subtracted from one that runs too
        warm, _ = child(0, threads)
        steps, total_ms = child(args.runs, threads)
        runs[threads] = ({key: (ms - warm.get(key, 0.0)) / args.runs for key, ms in steps.items()}, total_ms)
    from tests.core_cffi import Core

    print(f"refcg ISA: {args.isa or Core().isa_name()}")
    if wall:
        report_threads(runs, args.top)
    else:
        report(*runs[1], args.top)


def bench_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    main()
