"""The refcg pattern table: one ``(name, pattern, check)`` triple per kernel family.

Patterns describe what MergeComposite groups into a composite function; checks
(``checks.py``) decide whether refcg computes that match exactly. Rejections are
remembered so the offload report can say why an op stayed in TVM.
"""
from __future__ import annotations

from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard
from tvm.relay.op.contrib.register import register_pattern_table

from . import checks

COMPILER = "refcg"


def constant_subgraph(depth: int = 3):
    """A constant, or a short chain of ops on constants that the scoped fold evaluates.

    Frontends hand weights over as ``qnn.quantize(const_fp32)`` or behind layout ops; matching
    them here keeps them inside the composite so they reach the codegen, which folds them.
    """
    pattern = is_constant()
    for _ in range(depth):
        pattern = (
            pattern
            | is_op("qnn.quantize")(pattern, is_constant(), is_constant())
            | is_op("qnn.dequantize")(pattern, is_constant(), is_constant())
            | is_op("qnn.requantize")(pattern, is_constant(), is_constant(), is_constant(), is_constant())
            | is_op("transpose")(pattern)
            | is_op("reshape")(pattern)
            | is_op("expand_dims")(pattern)
            | is_op("layout_transform")(pattern)
            | is_op("cast")(pattern)
        )
    return pattern


def conv2d_pattern():
    conv = is_op("qnn.conv2d")(
        wildcard(), constant_subgraph(), is_constant(), is_constant(), is_constant(), is_constant()
    )
    biased = conv.optional(
        lambda x: is_op("nn.bias_add")(x, constant_subgraph()) | is_op("add")(x, constant_subgraph())
    )
    requantized = is_op("qnn.requantize")(biased, is_constant(), is_constant(), is_constant(), is_constant())
    return requantized.optional(lambda x: is_op("clip")(x))


class Rejections:
    """Reasons the checks gave during the last partitioning, keyed by anchor op and output type."""

    def __init__(self):
        self.reasons: dict[tuple[str, str], set[str]] = {}

    def clear(self):
        self.reasons.clear()

    def record(self, anchor, reason: str):
        key = (checks.op_name(anchor), str(anchor.checked_type))
        self.reasons.setdefault(key, set()).add(reason)

    def lookup(self, call) -> set[str]:
        return self.reasons.get((checks.op_name(call), str(call.checked_type)), set())


REJECTIONS = Rejections()


def _checked(check, anchor_of):
    def predicate(expr) -> bool:
        reason = check(expr)
        if reason is not None:
            REJECTIONS.record(anchor_of(expr), reason)
        return reason is None

    return predicate


# name, pattern builder, check returning a reason, function returning the anchor op of a match
KERNEL_FAMILIES = [
    ("conv2d", conv2d_pattern, checks.check_conv2d, lambda e: checks.conv2d_parts(e)["conv"]),
]


@register_pattern_table(COMPILER)
def pattern_table():
    return [
        (f"{COMPILER}.{name}", build(), _checked(check, anchor))
        for name, build, check, anchor in KERNEL_FAMILIES
    ]
