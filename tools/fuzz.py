"""``make fuzz``: many random QNN chains, refcg against TVM-only, bit-exact.

Uses the hypothesis strategies of ``tests/test_fuzz.py``. Each build holds ``--batch`` independent
chains (one output each), so one TVM-only and one refcg build check them all; the refcg partitions
of a batch are merged into one (see ``merge_partitions``) because each partition's C bundles the
whole core. Numerics (target / requantize_config) rotate per batch. Mismatches are printed as
specs and appended to ``--failures`` (JSON lines) for regression tests.

    python tools/fuzz.py --cases 10000 --batch 50 --seed 1
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_fuzz import NUMERICS_NAMES, TvmOnlyBuildError, check_batch, chains  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-constants", action="store_true",
                        help="instead of fuzzing: time and memory for a ResNet-50-sized weight set")
    parser.add_argument("--cases", type=int, default=10000, help="random chains to check")
    parser.add_argument("--batch", type=int, default=50, help="chains per build")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--failures", default="fuzz-failures.jsonl")
    args = parser.parse_args()
    if args.large_constants:
        return large_constants()
    totals = Counter()
    stayed = Counter()
    start = time.time()

    @seed(args.seed)
    @settings(max_examples=max(1, -(-args.cases // args.batch)), database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(specs=st.lists(chains(), min_size=args.batch, max_size=args.batch), numerics=NUMERICS_NAMES)
    def batch(specs, numerics):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = check_batch(specs, numerics, Path(tmp), merge=True)
            except TvmOnlyBuildError as error:  # TVM's bug, not refcg's: counted apart, batch skipped
                totals["batches TVM-only could not build"] += 1
                print(f"TVM-ONLY BUILD ERROR ({numerics}): {str(error).splitlines()[-1:]}", flush=True)
                return
            except Exception as error:  # a build failure is a finding too: count it, keep going
                totals["build errors"] += 1
                print(f"BUILD ERROR ({numerics}): {type(error).__name__}: {str(error).splitlines()[-1:]}", flush=True)
                with open(args.failures, "a") as out:
                    out.write(json.dumps({"numerics": numerics, "error": str(error)[-2000:],
                                          "specs": [dataclasses.asdict(s) for s in specs]}) + "\n")
                return
        totals["batches"] += 1
        totals["cases"] += result["cases"]
        totals["mismatches"] += len(result["mismatches"])
        totals["offloaded ops"] += result["offloaded"]
        totals["ops left in TVM"] += len(result["stayed"])
        stayed.update(reason for op, _, reason in result["stayed"] if op != "tuple")
        for spec, diff in result["mismatches"]:
            print(f"MISMATCH ({numerics}, max diff {diff}): {spec!r}", flush=True)
            with open(args.failures, "a") as out:
                out.write(json.dumps({"numerics": numerics, "max_diff": None if diff is None else int(diff),
                                      "spec": dataclasses.asdict(spec)}) + "\n")
        print(f"[{time.time() - start:7.0f} s] batch {totals['batches']:4d} {numerics:<9} "
              f"cases {totals['cases']:6d}  mismatches {totals['mismatches']}  "
              f"offloaded ops {totals['offloaded ops']}  left in TVM {totals['ops left in TVM']}", flush=True)

    batch()
    print(f"\nfuzz summary after {time.time() - start:.0f} s: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    print("ops left in TVM, by reason:")
    for reason, count in stayed.most_common(10):
        print(f"  {count:6d}  {reason}")
    return 1 if totals["mismatches"] or totals["build errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
