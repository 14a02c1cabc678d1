"""The refcg pattern table: one ``(name, pattern, check)`` triple per kernel family.

Patterns describe what MergeComposite groups into a composite function; checks
(``checks.py``) decide whether refcg computes that match exactly. Rejections are
remembered so the offload report can say why an op stayed in TVM.
"""
from __future__ import annotations

import functools

from tvm.relay.dataflow_pattern import is_constant, is_op, is_tuple, wildcard
from tvm.relay.op.contrib.register import register_pattern_table

from . import checks, lut, softmax
from .consumers import DEQUANTIZE_USES

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


def conv2d_patterns(padded: bool = False):
    """With a clip and a cast (PyTorch), a clip, then without, then the accumulator kept (no
    requantize): MergeComposite does not retry a smaller match at the same ops. ``padded``: an ``nn.pad`` in front, fused."""
    data = is_op("nn.pad")(wildcard(), is_constant()) if padded else wildcard()
    conv = is_op("qnn.conv2d")(data, constant_subgraph(), *constants(4))
    biased = conv.optional(bias_of)
    requantized = requantize_of(biased)
    clipped = is_op("clip")(requantized)
    return [is_op("cast")(clipped), clipped, requantized, biased]


def constants(n: int) -> list:
    """``n`` distinct constant patterns: one pattern object used twice must match one expr."""
    return [is_constant() for _ in range(n)]


def bias_of(x):
    return is_op("nn.bias_add")(x, constant_subgraph()) | is_op("add")(x, constant_subgraph())


def requantize_of(x):
    return is_op("qnn.requantize")(x, *constants(4))


def dense_pattern():
    data = wildcard()
    # a flatten in front of dense does not move data: the kernel reads the compact input as 2-D
    flat = is_op("reshape")(data) | is_op("nn.batch_flatten")(data)
    dense = is_op("qnn.dense")(flat | data, constant_subgraph(), *constants(4))
    biased = dense.optional(bias_of)
    clipped = is_op("clip")(requantize_of(biased))
    # a list: a rejected cast leaves the clipped match to the next pattern
    return [is_op("cast")(clipped), clipped | requantize_of(biased) | biased]


def binary_pattern():
    ops = [is_op(name)(wildcard(), wildcard(), *constants(6)) for name in checks.BINARY_OPS]
    call = ops[0] | ops[1] | ops[2]
    return call.optional(lambda x: is_op("clip")(x))


def pool_pattern():
    to_int32 = is_op("cast")(wildcard())
    average = is_op("nn.avg_pool2d")(to_int32) | is_op("nn.global_avg_pool2d")(to_int32)
    return is_op("nn.max_pool2d")(wildcard()) | is_op("cast")(average)


def any_of(patterns):
    """The alternation of ``patterns``, tried in order."""
    return functools.reduce(lambda a, b: a | b, patterns)


def reduce_patterns():
    """A sum or mean in int32 of a cast 8-bit tensor, with the cast back, then without."""
    to_int32 = is_op("cast")(wildcard())
    reduced = any_of([is_op(name)(to_int32) for name in checks.REDUCE_OPS])
    return [is_op("cast")(reduced), reduced]


def copy_pattern():
    """One data-movement or clamp op (maximum/minimum with a constant on either side)."""
    binary = ("nn.pad", "maximum", "minimum")
    return any_of([is_op("nn.pad")(wildcard(), is_constant())]
                  + [is_op(name)(*args) for name in binary[1:]
                     for args in ((wildcard(), is_constant()), (is_constant(), wildcard()))]
                  + [is_op(name)(wildcard()) for name in checks.COPY_OPS if name not in binary])


def concatenate_pattern(inputs: int):
    return is_op("qnn.concatenate")(
        is_tuple([wildcard() for _ in range(inputs)]), is_tuple(constants(inputs)), is_tuple(constants(inputs)),
        *constants(2),
    )


def requantize_pattern():
    return requantize_of(wildcard()).optional(lambda x: is_op("clip")(x))


def dequantized():
    return is_op("qnn.dequantize")(wildcard(), *constants(2))


def hardswish_of(x):
    """x * relu6(x + 3) / 6 in the forms the TFLite, PyTorch and ONNX frontends emit."""
    def scaled(e):
        return e | is_op("multiply")(e, is_constant()) | is_op("divide")(e, is_constant())

    gate = scaled(is_op("clip")(is_op("add")(scaled(x), is_constant())))
    return scaled(is_op("multiply")(x, gate) | is_op("multiply")(gate, x))


def lut_patterns():
    """Unary ops computed through a 256-entry table (refcodegen/lut.py)."""
    qnn_ops = [is_op(name)(wildcard(), *constants(4)) for name in checks.LUT_QNN_OPS]
    x = dequantized()
    float_op = is_op("sigmoid")(x) | is_op("tanh")(x) | is_op("nn.leaky_relu")(x) | hardswish_of(x)
    return [*qnn_ops, is_op("qnn.quantize")(float_op, *constants(2))]


def _check_lut(expr):
    """check_lut, told whether the table can be computed for the target given to partition_for_refcg."""
    anchor = checks.op_name(checks.lut_parts(expr)["op"])
    return checks.check_lut(expr, lut.cannot_compute(anchor, lut.partition_target()))


def float_softmax_pattern():
    return is_op("qnn.quantize")(is_op("nn.softmax")(dequantized()), *constants(2))


class Rejections:
    """Reasons the checks gave during the last partitioning, keyed by anchor op and output type."""

    def __init__(self):
        self.reasons: dict[tuple[str, str], set[str]] = {}

    def clear(self):
        self.reasons.clear()

    def record(self, calls, reason: str):
        for call in calls if isinstance(calls, list) else [calls]:
            key = (checks.op_name(call), str(call.checked_type))
            self.reasons.setdefault(key, set()).add(reason)

    def lookup(self, call) -> set[str]:
        return self.reasons.get((checks.op_name(call), str(call.checked_type)), set())


REJECTIONS = Rejections()


def _checked(check, anchor_of):
    """The predicate MergeComposite calls: records why a match is rejected. The one place a check's
    exception is caught: it rejects the match (the op stays in TVM) instead of aborting partitioning."""
    def predicate(expr) -> bool:
        try:
            reason = check(expr)
        except Exception as err:  # noqa: BLE001  any bug in a check must leave the op in TVM
            text = str(err).strip().splitlines()
            last = text[-1][:200] if text else ""
            reason = f"refcg check of {checks.op_name(expr)} raised {type(err).__name__}: {last}"
        if reason is not None:
            try:
                anchors = anchor_of(expr)
            except Exception:  # noqa: BLE001  the match does not have the expected form: name the root
                anchors = expr
            REJECTIONS.record(anchors, reason)
        return reason is None

    return predicate


def _conv2d_members(expr, padded: bool = False):
    parts = checks.conv2d_parts(expr)
    if not padded:
        parts.pop("pad")
    return [call for call in parts.values() if call is not None]


# name, pattern builder (one pattern or a list, most specific first), check returning a reason,
# function returning the op(s) a rejected match covers (the report shows the reason on them)
KERNEL_FAMILIES = [
    # a pad in front first: when its check rejects it, the plain conv still matches and the pad stays
    ("conv2d", lambda: conv2d_patterns(padded=True), checks.check_padded_conv2d,
     lambda e: _conv2d_members(e, padded=True)),
    ("conv2d", conv2d_patterns, checks.check_conv2d, _conv2d_members),
    ("dense", dense_pattern, checks.check_dense, lambda e: checks.epilogue_parts(e)["anchor"]),
    ("binary", binary_pattern, checks.check_binary, lambda e: checks.binary_parts(e)["op"]),
    ("pool2d", pool_pattern, checks.check_pool, lambda e: checks.pool_parts(e)["pool"]),
    *[
        ("concatenate", lambda n=n: concatenate_pattern(n), checks.check_concatenate, lambda e: e)
        for n in range(2, 9)
    ],
    # before quantize: these end in a qnn.quantize that would otherwise run alone
    ("lut", lut_patterns, _check_lut, lambda e: checks.lut_parts(e)["op"]),
    ("softmax", lambda: is_op("qnn.softmax")(wildcard(), *constants(4)),
     lambda e: checks.check_softmax(e) or softmax.x86_target_reason(lut.partition_target()), lambda e: e),
    ("float_softmax", float_softmax_pattern,
     lambda e: checks.check_float_softmax(e) or softmax.x86_target_reason(lut.partition_target()),
     lambda e: e.args[0]),
    ("quantize", lambda: is_op("qnn.quantize")(wildcard(), *constants(2)), checks.check_quantize, lambda e: e),
    ("quantize", lambda: is_op("qnn.dequantize")(wildcard(), *constants(2)),
     lambda e: checks.check_quantize(e) or DEQUANTIZE_USES.reason(e), lambda e: e),
    # last: a requantize after a conv or dense belongs to that kernel's epilogue
    ("requantize", requantize_pattern, checks.check_requantize_alone, lambda e: checks.epilogue_parts(e)["requantize"]),
    # after pool2d (its cast-avg-cast form) and the families whose patterns start or end in these ops
    ("reduce", reduce_patterns, checks.check_reduce, lambda e: checks.reduce_parts(e)["reduce"]),
    ("copy", copy_pattern, checks.check_copy, lambda e: e),
]


def _as_list(patterns) -> list:
    return patterns if isinstance(patterns, list) else [patterns]


@register_pattern_table(COMPILER)
def pattern_table():
    # A list gives MergeComposite smaller fallbacks: it does not retry a shorter match at the same ops
    # when a check rejects the longer one (e.g. conv without an out-of-range clip).
    return [
        (f"{COMPILER}.{name}", pattern, _checked(check, anchor))
        for name, build, check, anchor in KERNEL_FAMILIES
        for pattern in _as_list(build())
    ]
