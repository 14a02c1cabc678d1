"""The offload report: which ops refcg runs, which stay in TVM, and why."""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relay

from .partition import REJECTIONS_ATTR, refcg_functions


# Why a supported op matched no pattern at all (checks only see matches).
UNMATCHED = {
    "qnn.conv2d": "no refcg pattern matches: needs constant weights and qparams",
    "qnn.dense": "no refcg pattern matches: needs constant weights and qparams",
}


@dataclass
class OffloadReport:
    partitions: dict = field(default_factory=dict)  # symbol -> [(composite, [ops])]
    stayed: list = field(default_factory=list)  # (op, type, reason)

    @property
    def offloaded_ops(self) -> Counter:
        return Counter(op for kernels in self.partitions.values() for _, ops in kernels for op in ops)

    @property
    def stayed_ops(self) -> Counter:
        return Counter(op for op, _, _ in self.stayed)

    def qnn_fraction(self) -> float:
        done = sum(n for op, n in self.offloaded_ops.items() if op.startswith("qnn."))
        left = sum(n for op, n in self.stayed_ops.items() if op.startswith("qnn."))
        return done / (done + left) if done + left else 0.0

    def __str__(self) -> str:
        off, left = self.offloaded_ops, self.stayed_ops
        qnn_off = sum(n for op, n in off.items() if op.startswith("qnn."))
        qnn_left = sum(n for op, n in left.items() if op.startswith("qnn."))
        lines = [
            f"refcg offload report: {len(self.partitions)} partition(s), "
            f"{qnn_off} of {qnn_off + qnn_left} QNN ops offloaded, {sum(left.values())} op(s) stay in TVM"
        ]
        for symbol, kernels in self.partitions.items():
            lines.append(f"  refcg  {symbol}")
            for composite, ops in kernels:
                lines.append(f"           {composite:<16} {' -> '.join(ops)}")
        for op, ttype, reason in self.stayed:
            lines.append(f"  TVM    {op:<20} {ttype:<40} {reason}")
        return "\n".join(lines)


def _ops_in(expr) -> list[str]:
    ops = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ops.append(node.op.name)

    relay.analysis.post_order_visit(expr, visit)
    return ops


def _composites(func) -> list:
    kernels = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function) and node.op.attrs:
            kernels.append((str(node.op.attrs["Composite"]), _ops_in(node.op.body)))

    relay.analysis.post_order_visit(func.body, visit)
    return kernels


def _natural(name: str):
    """Sort key putting main_2 before main_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def offload_report(mod) -> OffloadReport:
    """Report for a module returned by ``partition_for_refcg``."""
    reasons = json.loads(str(mod.attrs[REJECTIONS_ATTR])) if mod.attrs and REJECTIONS_ATTR in mod.attrs.keys() else {}
    report = OffloadReport()
    for gv, func in sorted(refcg_functions(mod), key=lambda item: _natural(item[0].name_hint)):
        report.partitions[gv.name_hint] = _composites(func)

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ttype = str(node.checked_type)
            why = reasons.get(f"{node.op.name}|{ttype}")
            reason = "; ".join(why) if why else UNMATCHED.get(node.op.name, "no refcg pattern covers this op here")
            report.stayed.append((node.op.name, ttype.replace("Tensor", ""), reason))

    relay.analysis.post_order_visit(mod["main"].body, visit)
    return report
