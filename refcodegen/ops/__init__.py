"""The op families refcg computes, one module each, and the registry that wires them.

A family module defines ``NAME``, ``NEON_REQUANTIZE`` (whether its plan takes the aarch64 rounding
question ``ask``) and ``patterns()``: ``(pattern, parse)`` pairs, most specific first. ``parse``
turns a matched expression into the family's parameter object, which has ``members()`` (the calls
a rejection is reported on), ``reason(ctx)`` (the check: None = refcg computes it exactly, else why
not) and ``plan(name, func, srcs, dst, target, ask=None)`` (the kernel ``Step``); the module's
``parse(body)`` reads a composite's body at plan time, after the scoped fold. The composite
name is ``refcg.<NAME>``; the step's template is ``templates/<family>.c.j2``.

Adding a family: a module here, its entry in ``FAMILIES``, a template and its C kernel in runtime/.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tvm.relay.op.contrib.register import register_pattern_table

from ..consumers import DequantizeUses
from . import (batch_matmul, binary, concatenate, conv2d, copy, dense, float_softmax, lut, pool2d, qdq_resize, quantize,
               reduce, requantize, softmax)
from .base import folded_cast_input_reason, op_name

COMPILER = "refcg"

# Pattern-table order: MergeComposite tries families in this order.
FAMILIES = (
    conv2d, dense, batch_matmul,
    lut,  # before binary: a binary op of a tensor and its table op is one table
    binary, pool2d, concatenate,
    softmax, float_softmax, qdq_resize,  # lut too: they end in a qnn.quantize that would otherwise run alone
    quantize,
    requantize,  # last of those ending in a requantize: after a conv or dense it is that kernel's epilogue
    reduce, copy,  # after pool2d (its cast-avg-cast form) and the families whose patterns start or end in these ops
)


def composite_name(family) -> str:
    return f"{COMPILER}.{family.NAME}"


BY_COMPOSITE = {composite_name(f): f for f in FAMILIES}


def family_of(composite: str):
    """The family module of a composite name, or None."""
    return BY_COMPOSITE.get(composite)


class Rejections:
    """Reasons the checks gave during one partitioning, keyed by anchor op and output type."""

    def __init__(self):
        self.reasons: dict[tuple[str, str], set[str]] = {}

    def record(self, calls, reason: str):
        for call in calls if isinstance(calls, list) else [calls]:
            key = (op_name(call), str(call.checked_type))
            self.reasons.setdefault(key, set()).add(reason)

    def as_dict(self) -> dict[str, list[str]]:
        """``"op|type" -> sorted reasons``, as stored on the partitioned module."""
        return {f"{op}|{ty}": sorted(r) for (op, ty), r in self.reasons.items()}


@dataclass
class CheckContext:
    """What checks may depend on besides the match: the build target (None: not known at partitioning),
    the consumers of each dequantize, and where rejections are recorded."""

    target: object = None
    dequantize_uses: DequantizeUses = field(default_factory=DequantizeUses)
    rejections: Rejections = field(default_factory=Rejections)


def _predicate(pattern, parse, ctx: CheckContext):
    """The check MergeComposite calls: records why a match is rejected. The one place a check's
    exception is caught: it rejects the match (the op stays in TVM) instead of aborting partitioning.
    Common to every family: no composite reads a cast TVM-only folds away (base.folded_cast), nor ends
    in a clip that such a cast reads (consumers._clips_before_folded_casts)."""
    def check(expr) -> bool:
        params = None
        try:
            params = parse(expr)
            reason = folded_cast_input_reason(pattern, expr) or ctx.dequantize_uses.clip_reason(expr) or \
                params.reason(ctx)
        except Exception as err:  # noqa: BLE001  any bug in a check must leave the op in TVM
            text = str(err).strip().splitlines()
            last = text[-1][:200] if text else ""
            reason = f"refcg check of {op_name(expr)} raised {type(err).__name__}: {last}"
        if reason is not None:
            try:
                members = params.members() if params is not None else expr
            except Exception:  # noqa: BLE001  the match does not have the expected form: name the root
                members = expr
            ctx.rejections.record(members, reason)
        return reason is None

    return check


def pattern_table(ctx: CheckContext | None = None) -> list:
    """``(composite name, pattern, check)`` for MergeComposite, checks bound to ``ctx``. A family
    lists several patterns because MergeComposite does not retry a shorter match at the same ops
    when a check rejects the longer one (e.g. conv without an out-of-range clip)."""
    ctx = ctx or CheckContext()
    return [(composite_name(family), pattern, _predicate(pattern, parse, ctx))
            for family in FAMILIES for pattern, parse in family.patterns()]


@register_pattern_table(COMPILER)
def _tvm_pattern_table():
    """For TVM's own users of registered tables; partition_for_refcg builds one per call."""
    return pattern_table()
