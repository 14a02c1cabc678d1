"""``split`` of an integer tensor rewritten as one ``strided_slice`` per used field, before partitioning.

MergeComposite cannot put a ``split`` into one composite when several ``TupleGetItem`` read it (the
split would have users outside the match); slices are independent single-output ops that refcg.copy
computes. Both move the same integers, so the TVM-only build of the original graph stays the reference.
"""
from __future__ import annotations

from tvm import relay
from tvm.relay.expr_functor import ExprMutator


class _SplitToSlices(ExprMutator):
    def visit_tuple_getitem(self, op):
        split = op.tuple_value
        if not (isinstance(split, relay.Call) and getattr(split.op, "name", None) == "split"):
            return super().visit_tuple_getitem(op)
        fields = split.checked_type.fields
        if not str(fields[0].dtype).startswith(("int", "uint")):
            return super().visit_tuple_getitem(op)
        axis = int(split.attrs.axis) % len(fields[0].shape)
        begin = sum(int(f.shape[axis]) for f in fields[: op.index])
        end = begin + int(fields[op.index].shape[axis])
        return relay.strided_slice(self.visit(split.args[0]), begin=[begin], end=[end], axes=[axis])


def split_to_slices(mod):
    """``mod`` (type-inferred) with every integer split read through TupleGetItem replaced by slices."""
    mod["main"] = _SplitToSlices().visit(mod["main"])
    return relay.transform.InferType()(mod)
