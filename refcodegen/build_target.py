"""Which target is this partition built for?

TVM 0.19 calls ``relay.ext.refcg`` under the ``ext_dev`` target, not the build
target, yet TVM-only requantize numerics depend on the build target (float32
compute with sse4.1, int64 otherwise; arm_cpu rounding). Resolution order:
1. the ``RefcgTarget`` attribute set by ``partition_for_refcg(target=...)``;
2. the target list of the ``relay.build`` / ``vm.compile`` call on the Python stack.
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
    tagged = func.attrs.get(TARGET_ATTR) if func.attrs else None
    if tagged:
        return tvm.target.Target(str(tagged))
    target = _host_target(targets_on_stack())
    if target is None:
        raise RefcgError(
            str(func.attrs.get("global_symbol", "partition")),
            "target",
            "cannot find the relay.build target on the Python stack; "
            "pass target= to partition_for_refcg",
        )
    return target
