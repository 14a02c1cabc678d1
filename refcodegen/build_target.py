"""Which target is this partition built for?

TVM 0.19 calls ``relay.ext.refcg`` under the ``ext_dev`` target (``LowerExternalFunctions``,
src/relay/backend/te_compiler.cc), not the build target, yet TVM-only requantize numerics depend on
the build target (float32 compute with sse4.1, int64 otherwise; arm_cpu rounding). So:

1. ``partition_for_refcg(target=...)`` records the target on each partition (``RefcgTarget``); the
   checks saw it too, so the partition holds only what refcg computes exactly for that target.
2. Otherwise the build target is read from the Python stack, the one mechanism this module has:
   ``relay.build`` (``python/tvm/relay/build_module.py``) and ``relay.vm.compile``
   (``VMCompiler.lower``, ``python/tvm/relay/backend/vm.py``) both hold the canonical targets in a
   local named ``raw_targets`` while the codegen runs below them; the innermost such frame is the
   build in progress. A build started from C++ (no such frame) cannot be read: the error asks for
   ``target=``.

When both exist and differ (partitioned for one target, built for another), the codegen stops with
an error naming both instead of reproducing the wrong target's numerics.
"""
from __future__ import annotations

import os
import sys

import tvm

from .errors import RefcgError
from .partition import TARGET_ATTR

_RELAY_DIR = os.path.join("tvm", "relay") + os.sep


def _host_target(targets):
    for target in targets:
        if str(target.kind) == "llvm":
            return target
        if target.host is not None and str(target.host.kind) == "llvm":
            return target.host
    return None


def targets_on_stack():
    """``raw_targets`` of the innermost relay build entry point on the Python stack, if any."""
    frame = sys._getframe(1)
    while frame is not None:
        if _RELAY_DIR in frame.f_code.co_filename and "raw_targets" in frame.f_locals:
            raw = frame.f_locals["raw_targets"]
            return list(raw.values()) if isinstance(raw, dict) else list(raw)
        frame = frame.f_back
    return []


def resolve_build_target(func) -> tvm.target.Target:
    """The llvm target whose numerics the partition must reproduce."""
    symbol = str(func.attrs.get("global_symbol", "partition")) if func.attrs else "partition"
    tagged = func.attrs.get(TARGET_ATTR) if func.attrs else None
    building = _host_target(targets_on_stack())
    if tagged:
        target = tvm.target.Target(str(tagged))
        if building is not None and str(building) != str(target):
            raise RefcgError(symbol, "target", f"partitioned for '{target}' (partition_for_refcg target=) but built "
                                               f"for '{building}': partition with the build's target")
        return target
    if building is None:
        raise RefcgError(symbol, "target", "cannot find the relay.build target on the Python stack; "
                                           "pass target= to partition_for_refcg")
    return building
