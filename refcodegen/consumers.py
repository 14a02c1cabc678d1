"""Where each ``qnn.dequantize`` result goes, for the dequantize check (ops/quantize.py).

refcg hands a dequantize's float32 result back to TVM as a materialized tensor. TVM-only instead
lowers it to ``float(x - zp) * scale`` and optimizes it together with its consumers: FuseOps puts
the multiply in one kernel with an elementwise add, which LLVM contracts into an FMA on FMA
targets (AllowFPOpFusion::Fast), and SimplifyExpr folds a following constant multiply into the
scale. So a dequantize is offloaded only when its result reaches nothing that could do that.
Computed once per partitioning (``partition_for_refcg``) on the graph MergeComposite runs on; keyed by the call's attrs
object, which MergeComposite keeps when it rebuilds a call around new arguments.
"""
from __future__ import annotations

import tvm
from tvm import relay

# Consumers that use the product as it is: quantize divides it (no contraction, no folding);
# nn.softmax measured bit-exact on llvm and skylake; reinterpret only moves bits.
SAFE_CONSUMERS = ("qnn.quantize", "nn.softmax", "reinterpret")
# Ops that only move values: the question passes on to their own consumers.
LAYOUT_OPS = ("reshape", "squeeze", "expand_dims", "transpose", "nn.batch_flatten", "layout_transform")


def _op_name(expr) -> str | None:
    return expr.op.name if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) else None


class DequantizeUses:
    """For each qnn.dequantize of the graph being partitioned: None (safe) or why its result cannot
    leave refcg bit-exactly."""

    def __init__(self):
        self.reasons: dict = {}
        self.known = False

    def analyze(self, func: relay.Function):
        users: dict = {}

        def visit(node):
            args = node.args if isinstance(node, relay.Call) else node.fields if isinstance(node, relay.Tuple) else []
            for arg in args:
                users.setdefault(arg, []).append(node)

        relay.analysis.post_order_visit(func.body, visit)
        outputs = set(func.body.fields) if isinstance(func.body, relay.Tuple) else {func.body}

        def unsafe_use(expr) -> str | None:
            for user in users.get(expr, []):
                if isinstance(user, relay.Tuple) and user.same_as(func.body):
                    continue
                name = _op_name(user)
                if name in LAYOUT_OPS:
                    reason = unsafe_use(user)
                    if reason:
                        return reason
                elif name not in SAFE_CONSUMERS:
                    return name or type(user).__name__
            return None

        self.reasons = {}
        for expr in users.keys() | outputs:
            if _op_name(expr) == "qnn.dequantize":
                user = unsafe_use(expr)
                self.reasons[expr.attrs] = None if user is None else (
                    f"its float result feeds {user}, which TVM-only computes together with the "
                    "dequantize's multiply (FMA contraction, constant folding): not bit-exact outside TVM")
        self.known = True

    def reason(self, call) -> str | None:
        if not self.known or call.attrs not in self.reasons:
            return "the dequantize's consumers are unknown (partition with partition_for_refcg)"
        return self.reasons[call.attrs]

