"""Shared helpers: build a Relay module TVM-only and with refcg, run both, compare."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
# examples/ (the example models: not in the wheel) comes from this checkout. Appended, not put first
# (as pytest's `pythonpath` option and PYTHONPATH do): `make test` imports the installed refcodegen,
# which a checkout first on sys.path would shadow.
sys.path.append(str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402

import refcodegen  # noqa: E402,F401  registers relay.ext.refcg
from refcodegen import objcache, offload_report, partition_for_refcg  # noqa: E402
from refcodegen.partition import refcg_functions  # noqa: E402
from refcodegen.runner import degenerate, load, run  # noqa: E402,F401  (tests import run from here)

TARGET_LLVM = "llvm"
TARGET_F32 = "llvm -mcpu=skylake"  # sse4.1: TVM-only requantize computes in float32


def build_and_load(mod, target, tmp_path, name, params=None, **export):
    """relay.build + export_library + load. Exports reuse compiled objects (the core is the same C
    file in every refcg library); test_concurrency, test_core_dispatch and the sanitizer runs export through TVM's default compile path."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    path = str(tmp_path / f"{name}.so")
    lib.export_library(path, **{"fcompile": objcache.create_shared, **export})
    return load(path)


def compare_with_tvm(mod, inputs: dict, tmp_path, target=TARGET_LLVM, params=None,
                     expect_partitions: int | None = None, outputs: list | None = None,
                     partition_target: bool = False, **partition_options):
    """Build ``mod`` TVM-only and with refcg for ``target``; assert bit-exact outputs.
    ``partition_target``: partition for ``target`` too (``partition_for_refcg(target=)``).

    Returns the partitioned module so callers can inspect it; the refcg outputs are appended
    to ``outputs`` when given (to compare them with another runtime). A module refcg should leave
    alone goes to ``stays_in_tvm`` instead (no build needed).
    """
    assert expect_partitions != 0, "expecting no partition: stays_in_tvm(mod, op) checks it without building"
    reference = run(build_and_load(mod, target, tmp_path, "tvm_only", params), inputs)
    if partition_target:
        partition_options["target"] = target
    partitioned = partition_for_refcg(mod, params, **partition_options)
    found = len(refcg_functions(partitioned))
    if expect_partitions is not None:
        assert found == expect_partitions, partitioned
    else:
        assert found >= 1, f"nothing was offloaded:\n{partitioned}"
    actual = run(build_and_load(partitioned, target, tmp_path, "refcg"), inputs)
    assert len(actual) == len(reference)
    for want, got in zip(reference, actual):
        assert want.dtype == got.dtype and want.shape == got.shape
        wide = np.float64 if want.dtype.kind == "f" else np.int64  # int64 would truncate float outputs
        diff = np.abs(want.astype(wide) - got.astype(wide))
        assert diff.max(initial=0) == 0, f"max |refcg - TVM| = {diff.max()} at {np.argmax(diff)}"
    if outputs is not None:
        outputs.extend(actual)
    return partitioned


def stays_in_tvm(mod, op: str, **partition_options) -> str:
    """Partition ``mod``; assert refcg offloaded nothing and left the graph as it was given; return the
    offload report's line for ``op`` (type and reason), which must be there.

    Nothing is built: relay.build then gets the very graph TVM-only builds, so building and comparing
    both (compare_with_tvm) would compile the same graph twice.
    """
    partitioned = partition_for_refcg(mod, **partition_options)
    report = str(offload_report(partitioned))
    assert not refcg_functions(partitioned), f"offloaded:\n{report}"
    given = relay.transform.InferType()(mod)["main"]
    assert tvm.ir.structural_equal(partitioned["main"], given), f"refcg rewrote the graph it left to TVM:\n{partitioned}"
    lines = [line for line in report.splitlines() if f" {op} " in line]
    assert lines, report
    return lines[0]


def assert_not_degenerate(outputs: list):
    """Network outputs take many values (runner.degenerate): else bit-exactness proves little."""
    reason = degenerate(outputs)
    assert reason is None, reason


def slow_params(values, *slow) -> list:
    """``values`` as parameters, those in ``slow`` run by ``make test-slow`` (CI runs it; ``make test``
    stays short): a value added to ``values`` runs in ``make test`` unless named here."""
    assert set(slow) <= set(values), set(slow) - set(values)
    return [pytest.param(value, marks=pytest.mark.slow) if value in slow else value for value in values]


def random_int(rng, shape, dtype, low=None, high=None):
    info = np.iinfo(dtype)
    low = info.min if low is None else low
    high = info.max if high is None else high
    return rng.integers(low, high + 1, size=shape).astype(dtype)


# Modules of tests that take a minute or more each (their TVM-only builds): collected first, so the two
# xdist workers of `make test` do not end on them, one idle while the other runs a long last test.
LONG_MODULES = ("test_zoo.py", "test_tvmc.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in LONG_MODULES)  # stable: the rest in their order


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


def spy_on_codegen(monkeypatch, observe):
    """Call ``observe(stage, func)`` as relay.ext.refcg runs: "received" with the partition TVM hands
    over, "folded" with it after the scoped fold (what the plan reads). Wraps codegen's stage names."""
    from refcodegen import codegen

    fold, plan = codegen.scoped_fold, codegen.build_plan

    def scoped_fold(func):
        observe("received", func)
        return fold(func)

    def build_plan(func, symbol, target):
        observe("folded", func)
        return plan(func, symbol, target)

    monkeypatch.setattr(codegen, "scoped_fold", scoped_fold)
    monkeypatch.setattr(codegen, "build_plan", build_plan)
