"""Facts about a graph's consumers that decide whether a QNN op can leave TVM bit-exactly, computed once
per partitioning (``partition_for_refcg``) on the graph MergeComposite runs on, keyed by the call's attrs
object (MergeComposite keeps it when it rebuilds a call around new arguments):

- where each ``qnn.dequantize`` result goes (the dequantize check). refcg hands its float32 result back
  to TVM as a materialized tensor; TVM-only lowers it to ``float(x - zp) * scale`` and optimizes it with
  its consumers: FuseOps puts the multiply in one kernel with an elementwise add, which LLVM contracts
  into an FMA on FMA targets (AllowFPOpFusion::Fast), and SimplifyExpr folds a following constant
  multiply into the scale. So a dequantize is offloaded only when its result reaches nothing that could;
- which rank-0 scale constants TVM-only loads from memory rather than inlining (``loads_scale``: the
  quantize then divides);
- which quantizes feed a cast TVM-only applies to their float value (``cast_reason``).
"""
from __future__ import annotations

import tvm
from tvm import relay

from .numerics import DTYPE_RANGE

# Consumers that use the product as it is: quantize divides it (no contraction, no folding);
# nn.softmax measured bit-exact on llvm and skylake; reinterpret only moves bits.
SAFE_CONSUMERS = ("qnn.quantize", "nn.softmax", "reinterpret")
# Ops that only move values: the question passes on to their own consumers.
LAYOUT_OPS = ("reshape", "squeeze", "expand_dims", "transpose", "nn.batch_flatten", "layout_transform")
# QNN ops TVM-only lowers around an anchor of pattern kOutEWiseFusable (nn.conv2d, nn.dense), and the ops
# between such an op and a dequantize that FuseOps keeps in the anchor's kernel (elementwise, one user).
ANCHORS = ("qnn.conv2d", "qnn.dense")
ANCHOR_EPILOGUE = ("nn.bias_add", "add", "qnn.requantize", "clip", "cast")


def _op_name(expr) -> str | None:
    return expr.op.name if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) else None


# QNN ops whose canonical form folds their qparams into compile-time values: a scale constant they
# share is not read at run time (measured: a quantize sharing its scale with them still multiplies)
FOLDED_QPARAMS = ("qnn.conv2d", "qnn.dense", "qnn.batch_matmul", "qnn.requantize", "qnn.add", "qnn.subtract",
                  "qnn.mul", "qnn.concatenate")


def _elementwise(expr) -> bool:
    """FuseOps may put it in the middle of a fused path (TOpPattern <= kInjective)."""
    name = _op_name(expr)
    if name in ("qnn.quantize", "qnn.dequantize"):
        return True
    pattern = tvm.ir.Op.get(name).get_attr("TOpPattern") if name else None
    return pattern is not None and int(pattern) <= 2


def _loaded_scale_readers(users: dict) -> dict:
    """The attrs of the calls reading a rank-0 float constant that TVM-only loads from memory, each
    mapped to a number the readers of one constant share.

    TVM inlines a rank-0 constant as an immediate (te_compiler_cache.cc) only when FuseOps puts it in
    its readers' kernel, which needs one reader, or readers joined by a fused path: each reader but
    one reaches that one through ops that have a single user and are elementwise or injective
    (fuse_ops.cc, CheckPath). Otherwise the constant is a parameter of every kernel reading it, and
    a qnn.quantize dividing by it divides by the loaded value where an immediate divisor becomes a
    multiplication by its reciprocal (ops/quantize.py). Measured on llvm: dequantize -> mean ->
    quantize with one scale constant (ShuffleNetV2's head), a quantize and a dequantize in separate
    kernels, two quantizes, all load it; quantize -> dequantize and dequantize -> sigmoid -> quantize
    inline it."""
    def runtime_reader(node) -> bool:
        if isinstance(node, relay.Tuple):  # qnn.concatenate's qparams, or a tuple the graph returns
            return not all(_op_name(user) in FOLDED_QPARAMS for user in users.get(node, [None]))
        return _op_name(node) not in FOLDED_QPARAMS

    def reaches(node, sink) -> bool:
        while not node.same_as(sink):
            following = users.get(node, [])
            if len(following) != 1 or not _elementwise(node):
                return False
            node = following[0]
        return True

    loaded = {}
    for group, (const, readers) in enumerate(users.items()):
        if not (isinstance(const, relay.Constant) and const.data.dtype.startswith("float")
                and const.data.numpy().size == 1):
            continue
        readers = [node for node in readers if runtime_reader(node)]
        if len(readers) > 1 and not any(all(reaches(node, sink) for node in readers) for sink in readers):
            loaded.update({node.attrs: group for node in readers if isinstance(node, relay.Call) and node.attrs is not None})
    return loaded


def _float_casts_after_quantize(users: dict) -> dict:
    """attrs of a qnn.quantize, and of the casts after it -> why none can leave TVM: they end in a cast to a
    type that cannot hold its values. TVM's SimplifyClipAndConsecutiveCast (simplify_expr.cc L199-245)
    rewrites the quantize's clip -> cast(int8/uint8) -> cast -> ... -> cast, dropping every cast whose
    type holds the clip's range, so TVM-only converts the clipped float straight to the first type that
    does not (a negative value to uint8, one above 127 to int8: undefined in LLVM), where refcg's 8-bit
    result would wrap; a cast to int32 in between changes nothing. Left in TVM, they stay one kernel, as
    in TVM-only."""
    reasons = {}
    for node in users:
        if _op_name(node) != "qnn.quantize" or node.checked_type.dtype not in DTYPE_RANGE:
            continue  # the quantize check rejects other dtypes
        lo, hi = DTYPE_RANGE[node.checked_type.dtype]
        paths = [[user] for user in users.get(node, []) if _op_name(user) == "cast"]
        while paths:
            path = paths.pop()
            dst = str(path[-1].attrs.dtype)
            if dst.startswith("float") or (dst in DTYPE_RANGE and DTYPE_RANGE[dst][0] <= lo <= hi <= DTYPE_RANGE[dst][1]):
                paths += [path + [user] for user in users.get(path[-1], []) if _op_name(user) == "cast"]
                continue  # holds the range: TVM drops it and looks at the next cast
            through = f" (through {', '.join(str(c.attrs.dtype) for c in path[:-1])})" if len(path) > 1 else ""
            reason = (f"its result feeds a cast to {dst}{through}, which TVM-only applies to the clipped float "
                      "(SimplifyClipAndConsecutiveCast drops the quantize's own cast): undefined outside the "
                      f"{dst} range, where refcg's {node.checked_type.dtype} would wrap")
            reasons.update({call.attrs: reason for call in [node, *path]})
    return reasons


def _clips_before_folded_casts(users: dict) -> dict:
    """attrs of a clip -> why it cannot leave TVM: it feeds a cast that TVM-only may fold
    (base.folded_cast: int -> uint, which always stays in TVM). TVM's SimplifyClipAndConsecutiveCast
    (simplify_expr.cc L199-245) rewrites clip -> cast -> ... -> cast by the clip's bounds: with the clip
    in TVM-only's graph the cast need not wrap (measured: clip [-58, -34] -> cast uint8 -> per-channel
    qnn.requantize), while the same cast after a refcg kernel's output does. Left in TVM, the clip
    and the cast meet as in TVM-only."""
    from .ops.base import folded_cast  # the ops package imports this module

    reasons = {}
    for node in users:
        if _op_name(node) != "clip" or node.attrs is None:
            continue
        for user in users.get(node, []):
            cast = folded_cast(user)
            if cast:
                reasons[node.attrs] = (f"the clip feeds a {cast} that stays in TVM, whose SimplifyClipAndConsecutiveCast "
                                       "reads the clip's bounds: it stays with it")
    return reasons


def _pattern(expr) -> int:
    """TOpPattern of a consumer; 0 (elementwise: may fuse) when not known, QNN ops among them."""
    name = _op_name(expr)
    pattern = tvm.ir.Op.get(name).get_attr("TOpPattern") if name and not name.startswith("qnn.") else None
    return 0 if pattern is None else int(pattern)


def _ends_anchored_kernel(dequantize, users: dict) -> bool:
    """Whether TVM-only's kernel holding ``dequantize`` is a conv/dense kernel that ends with it, so its
    float result is materialized there as refcg would hand it back (no multiply left to contract or fold).

    FuseOps (fuse_ops.cc, RunFuse) fuses a kOutEWiseFusable group only in phase 0 and only into a post-
    dominator reached through elementwise/broadcast ops (kind <= kBroadcast); its group keeps that pattern,
    so phases 1 and 2 never extend it. The dequantize is in the anchor's group when every op from the
    qnn.conv2d / qnn.dense to it is elementwise with one user; the group ends there when every consumer
    is injective or beyond (TOpPattern > kBroadcast: resize2d, reshape, mean, ...)."""
    users_of = users.get(dequantize, [])
    if not users_of or any(isinstance(user, relay.Tuple) or _pattern(user) <= 1 for user in users_of):
        return False
    node = dequantize.args[0]
    while _op_name(node) in ANCHOR_EPILOGUE and len(users.get(node, [])) == 1:
        node = node.args[0]
    return _op_name(node) in ANCHORS and len(users.get(node, [])) == 1


class DequantizeUses:
    """For each qnn.dequantize of the graph being partitioned: None (safe) or why its result cannot
    leave refcg bit-exactly."""

    def __init__(self):
        self.reasons: dict = {}
        self.known = False
        self.loaded_scale_readers: dict = {}
        self.cast_reasons: dict = {}
        self.clip_reasons: dict = {}
        self.failure = "partition with partition_for_refcg"

    def analyze(self, func: relay.Function):
        """Never raises: on an unexpected graph the quantize and dequantize checks reject with the error."""
        try:
            self._analyze(func)
        except Exception as error:  # noqa: BLE001  (a failure must not abort partition_for_refcg)
            self.known, self.failure = False, f"{type(error).__name__}: {error}"

    def _analyze(self, func: relay.Function):
        users: dict = {}

        def visit(node):
            args = node.args if isinstance(node, relay.Call) else node.fields if isinstance(node, relay.Tuple) else []
            for arg in args:
                users.setdefault(arg, []).append(node)

        relay.analysis.post_order_visit(func.body, visit)
        self.loaded_scale_readers = _loaded_scale_readers(users)
        self.cast_reasons = _float_casts_after_quantize(users)
        self.clip_reasons = _clips_before_folded_casts(users)
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
                user = None if _ends_anchored_kernel(expr, users) else unsafe_use(expr)
                self.reasons[expr.attrs] = None if user is None else (
                    f"its float result feeds {user}, which TVM-only computes together with the "
                    "dequantize's multiply (FMA contraction, constant folding): not bit-exact outside TVM")
        self.known = True

    def cast_reason(self, call) -> str | None:
        """Why a qnn.quantize or the cast after it cannot leave TVM (``_float_casts_after_quantize``), or None."""
        if not self.known:
            return f"its consumers are unknown ({self.failure})"
        return self.cast_reasons.get(call.attrs) if call.attrs is not None else None

    def clip_reason(self, call) -> str | None:
        """Why a composite whose result is ``call`` cannot leave TVM when it is a clip
        (``_clips_before_folded_casts``), or None."""
        if _op_name(call) != "clip":
            return None
        if not self.known:
            return f"its consumers are unknown ({self.failure})"
        return self.clip_reasons.get(call.attrs) if call.attrs is not None else None

    def loads_scale(self, call) -> bool:
        """Whether TVM-only loads ``call``'s rank-0 scale from memory (a qnn.quantize then divides by it)."""
        return call.attrs is not None and call.attrs in self.loaded_scale_readers

    def scale_group(self, call) -> int | None:
        """The number shared by the calls reading the loaded scale ``call`` reads (None: not loaded)."""
        return self.loaded_scale_readers.get(call.attrs) if call.attrs is not None else None

    def reason(self, call) -> str | None:
        if not self.known or call.attrs not in self.reasons:
            return f"the dequantize's consumers are unknown ({self.failure})"
        return self.reasons[call.attrs]

