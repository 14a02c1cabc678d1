"""The fuzz (tests/fuzzing: random QNN chains against TVM-only) in CI: a bounded derandomized run,
what the strategies draw, and ``python -m fuzzing`` (``make fuzz``) end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import strategies as st
from tvm import relay

from arm.host import ensure_host
from fuzzing.chains import ARM_CPU, ARM_NUMERICS, COPY_OPS, LUT_FORMS, apply_op, build_batch, families, fuzz_batches
from fuzzing.check import check_batch
from test_ops_common import NUMERICS

pytestmark = pytest.mark.slow  # make test-slow (CI): minutes of builds

TESTS = Path(__file__).resolve().parent
CI_CHAINS = 6  # per numerics: one build each


def test_random_chains_match_tvm(tmp_path):
    """30 distinct random chains, one merged build of 6 per numerics (the fixed cost of a build,
    g++ of the core above all, is what bounds this). Derandomized by a fixed seed; no shrinking
    (each step is two builds): a failure prints the spec to paste into test_fuzz_regressions.py."""
    for name in NUMERICS:
        [(specs, numerics)] = fuzz_batches(CI_CHAINS, CI_CHAINS, seed=0, numerics=st.just(name), chunk=CI_CHAINS)
        (tmp_path / name).mkdir()
        result = check_batch(specs, numerics, tmp_path / name, merge=True)
        assert len(specs) == CI_CHAINS
        assert result["cases"] + len(result["undefined"]) + len(result["unbuildable"]) == CI_CHAINS
        assert result["cases"] >= CI_CHAINS - 2, result  # TVM-only's failures must not hollow the test out
        assert not result["mismatches"], "\n".join(f"{numerics}: {spec!r} max diff {d}"
                                                    for spec, d in result["mismatches"])


ARM_CHAINS = 3  # per aarch64 target: the emulated run is slow, the campaign is make fuzz-arm


def test_random_chains_match_tvm_on_aarch64(tmp_path):
    """make fuzz-arm in small: a few random chains per aarch64 target, cross-built, run on the emulated
    host (+neon,+dotprod on QEMU max, +neon on cortex-a53) against TVM-only for the same target."""
    ensure_host()  # skips, with the reason, where the emulator cannot be installed
    from fuzzing.arm import EmulatedHost

    host = EmulatedHost()
    try:
        for name in ARM_NUMERICS:
            [(specs, numerics)] = fuzz_batches(ARM_CHAINS, ARM_CHAINS, seed=0, numerics=st.just(name),
                                               chunk=ARM_CHAINS)
            (tmp_path / name).mkdir()
            result = check_batch(specs, numerics, tmp_path / name, merge=True, runner=host.runner(numerics))
            assert result["cases"] >= ARM_CHAINS - 1 and result["partitions"], result
            assert not result["refcg build errors"], result["refcg build errors"]
            assert not result["mismatches"], "\n".join(f"{numerics}: {spec!r} max diff {d}"
                                                        for spec, d in result["mismatches"])
        # a server that dies (or whose session ends) is started again and the run repeated once
        server = host.servers[ARM_CPU[name]]
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        outputs = server.run(tmp_path / name / "refcg.so", {})
        assert server.restarts == 1 and len(outputs) == len(specs)
    finally:
        host.close()


def fused_pad_convs(specs) -> dict:
    """Counts of the conv forms issue 19 was about among ``specs``' ops."""
    convs = [op for spec in specs for op in spec.ops if op["op"] == "conv2d"]
    front = [op for op in convs if op.get("pad")]
    return {"convs": len(convs), "nn.pad in front": len(front),
            "1xN/Nx1 behind an nn.pad": sum(1 in op["kernel"] and max(op["kernel"]) > 1 for op in front),
            "asymmetric nn.pad": sum(op["pad"][0] != op["pad"][1] or op["pad"][2] != op["pad"][3] for op in front)}


def test_chains_draw_convs_behind_an_nn_pad():
    """The strategies draw what PyTorch's importer emits (issue 19): an nn.pad in front of 1xN / Nx1
    convs, symmetric and not. Drawing only, no build."""
    specs = [spec for batch, _ in fuzz_batches(200, 50, seed=0) for spec in batch]
    counts = fused_pad_convs(specs)
    assert len(specs) == 200
    assert counts["1xN/Nx1 behind an nn.pad"] >= 5 and counts["asymmetric nn.pad"] >= 5, counts


# Every family refcg offloads and the glue between them (issue 14): each must be drawn
DRAWN = (
    [f"lut {form}" for form in LUT_FORMS] + [f"copy {kind}" for kind in COPY_OPS]
    + [f"reduce {kind}" for kind in ("mean", "sum", "adaptive_avg_pool2d", "global_avg_pool2d")]
    + [f"pool {kind}" for kind in ("max", "avg", "global")] + [f"binary {k}" for k in ("add", "subtract", "mul")]
    + ["softmax qnn", "softmax float", "qdq", "qdq per axis", "qdq through nn.relu", "qdq through mean", "qdq through resize",
       "shared scalar constants", "quantize", "quantize per axis", "dequantize",
       "dequantize per axis", "binary rank-0 operand", "conv2d", "conv2d behind an nn.pad", "dense", "concat",
       "requantize", "requantize to int16", "requantize from int16", "requantize to int32", "requantize from int32",
       "conv2d to int16", "conv2d int32 accumulator kept", "dense int32 accumulator kept"]
    + [f"batch_matmul {form}" for form in ("input", "broadcast", "self")] + ["batch_matmul int32 accumulator kept"])


def test_chains_draw_every_family_and_build_as_drawn():
    """Over 800 chains (all numerics), every family and form of DRAWN appears at least twice, conv,
    dense or batch_matmul chains stay the majority, and each chain's Relay (type-inferred, not built) has
    the shape and dtype the strategies computed for it."""
    drawn = [(spec, numerics) for batch, numerics in fuzz_batches(800, 50, seed=0) for spec in batch]
    counts = Counter(name for spec, _ in drawn for name in families(spec))
    rare = {name: counts[name] for name in DRAWN if counts[name] < 2}
    assert not rare, f"drawn fewer than twice in 800 chains: {rare}"
    anchored = sum(any(op["op"] in ("conv2d", "dense", "batch_matmul") for op in spec.ops) for spec, _ in drawn)
    assert anchored > len(drawn) / 2, anchored
    for numerics in {n for _, n in drawn}:
        specs = [spec for spec, n in drawn if n == numerics][:60]
        mod, _ = build_batch(specs, numerics)
        outputs = relay.transform.InferType()(mod)["main"].ret_type.fields
        for spec, out in zip(specs, outputs, strict=True):
            state = spec
            for op in spec.ops:
                state = apply_op(None, state, op, None, None)[1]
            assert (tuple(int(d) for d in out.shape), out.dtype) == (state.shape, state.dtype), spec


def test_make_fuzz_adds_up_its_processes(tmp_path):
    """``python -m fuzzing --jobs 2`` (what ``make fuzz`` runs on two cores): both seeds run, and the
    summary counts every chain of both."""
    done = subprocess.run([sys.executable, "-m", "fuzzing", "--cases", "5", "--batch", "2", "--seed", "3",
                           "--jobs", "2", "--failures", str(tmp_path / "failures.jsonl"),
                           "--summary", str(tmp_path / "summary.json")],
                          capture_output=True, text=True, timeout=900, cwd=TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[seed 3," in done.stdout and "[seed 4," in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    totals = summary["totals"]
    assert totals["mismatches"] == 0 and "processes that died" not in totals
    assert totals["cases"] + totals["chains TVM-only leaves undefined or gets wrong (not compared)"] \
        + totals["chains TVM-only cannot build (not compared)"] + totals["refcg build errors"] == 5
    assert sum(summary["drawn"].values()) >= 5


def test_make_fuzz_survives_a_worker_that_dies(tmp_path):
    """A worker killed in a batch (here: aborted by the test hook at its 2nd batch; in a campaign: an
    LLVM assertion or a crashing kernel) loses only that batch: the counters of the batches before it
    are kept, its chains are replayed one by one in processes of their own, and a new worker checks
    the chains still to do. The death is reported (exit 1) with the batch in the failures file."""
    failures = tmp_path / "failures.jsonl"
    done = subprocess.run([sys.executable, "-m", "fuzzing", "--cases", "6", "--batch", "2", "--seed", "5",
                           "--jobs", "1", "--numerics", "llvm", "--failures", str(failures)],
                          capture_output=True, text=True, timeout=900, cwd=TESTS,
                          env=dict(os.environ, REFCG_FUZZ_ABORT="5:2"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "seed 5: the fuzz process died" in out and "[seed 1005," in out, out[-3000:]
    summary = out[out.index("fuzz summary"):]
    assert "processes that died 1" in summary and "mismatches 0" in summary, summary
    records = [json.loads(line) for line in failures.read_text().splitlines()]
    assert [r["killed"] for r in records] == ["the batch, no chain alone"] and len(records[0]["specs"]) == 2
    # the two chains of the lost batch were replayed alone and count like the others: all 6 accounted for
    totals = dict(part.rsplit(" ", 1) for part in summary.splitlines()[0].split(": ", 1)[1].split(", "))
    assert int(totals["cases"]) + int(totals.get("chains TVM-only leaves undefined or gets wrong (not compared)", 0)) \
        + int(totals.get("chains TVM-only cannot build (not compared)", 0)) == 6, summary
