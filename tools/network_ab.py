"""A zoo network built by this checkout and by another revision, both libraries run in one process,
interleaved: thread CPU time on one thread, best of the rounds, outputs compared byte for byte. The
check a runtime or template change needs before it stays: generated libraries compile the core with
g++ under `#pragma GCC optimize("O3")` alone, not as tools.kernel_ab's cffi core (gcc -O3), and a
change that is faster there can be slower here (register allocation).

    REFCG_ZOO_DIR=/tmp/zoo PYTHONPATH=. .venv/bin/python -m tools.network_ab mobilenet_v2@224 \\
        --against HEAD [--isa avx2 avx512vnni] [--target "llvm -mcpu=cascadelake"] [--rounds 15] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads: the calling thread computes

import numpy as np  # noqa: E402

from tools import bench  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def build(name: str, tree: Path, path: str, target: str) -> None:
    """``name`` partitioned and built with refcg for ``target`` by the sources in ``tree`` (a child process
    importing that tree's refcodegen and tools)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "tools.bench", "--build-child", name, target, path, "1"]
    result = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"building {name} in {tree} failed:\n{(result.stderr or result.stdout)[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("network", help='a zoo workload, "<network>@<size>"')
    parser.add_argument("--against", default="HEAD", help="git revision whose sources build the baseline (old)")
    parser.add_argument("--isa", nargs="*", default=[None], help="REFCG_ISA values (default: the host's best)")
    parser.add_argument("--target", default="llvm", help="the target both build for (refcg's numerics follow it)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--keep", default=None, help="directory to leave the two libraries in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out = Path(args.keep or work)
        out.mkdir(parents=True, exist_ok=True)
        old_tree = Path(work) / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.against], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        libs = {"old": str(out / "old.so"), "new": str(out / "new.so")}
        build(args.network, old_tree, libs["old"], args.target)
        build(args.network, REPO, libs["new"], args.target)
        x = bench.example_input(bench.relay_module(args.network), args.network)
        print(f"{args.network} built for {args.target}: ms per run, 1 thread, CPU time, best of {args.rounds} "
              f"interleaved rounds; old = {args.against}")
        for isa in args.isa:
            runners, outputs = {}, {}
            for label, path in libs.items():
                runners[label], outputs[label] = (bench.isa_runner(path, x, isa) if isa
                                                  else bench.graph_runner(path, x))
            same = np.array_equal(outputs["old"](), outputs["new"]())
            best = bench.interleaved(runners, args.rounds, time.thread_time)
            print(f"  {isa or 'host best':<11} old {best['old'] * 1e3:8.3f}  new {best['new'] * 1e3:8.3f}  "
                  f"new/old speed {best['old'] / best['new']:.3f}x  outputs {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
