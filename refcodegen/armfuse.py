"""Which loop of TVM-only's aarch64 build computes each per-tensor requantize of a partition.

TVM 0.19 lowers ``tir.q_multiply_shift`` to NEON sqrdmulh + srshl (rounding twice) only when
its operand is an int32x4 vector (topi/arm_cpu/tensor_intrin.py:1113-1158), so an UPWARD int64
per-tensor requantize rounds like NEON exactly when the fused kernel holding it vectorizes its
output loop by 4 lanes (``numerics.tvm_aarch64_lanes``). Which fused kernel that is follows
FuseOps (GraphPartitioner::RunFuse, src/relay/analysis/graph_partitioner.cc:350-465 at v0.19.0)
on the canonical graph, where every requantize is a chain of elementwise ops (qnn.add/subtract
requantize both operands to int32, src/relay/qnn/op/add.cc:76-80; an add of same-shape tensors
is an elementwise edge, src/relay/transforms/fuse_ops.cc:207-213):

* an anchor (conv2d, dense, pool: kOutEWiseFusable) grows forward through elementwise edges
  into its immediate post-dominator (graph_partitioner.cc:421-432); the group keeps its pattern,
  so it stops at the first injective op or shared result: a requantize chain on the single-use
  output of an anchor is computed in the anchor's loop;
* an elementwise chain that hangs off no anchor fuses forward into its post-dominator, whatever
  that group is (an anchored one included, :433-452), and injective ops (strided_slice, reshape,
  concatenate, pad) fuse forward only into injective groups (:453-461): the chain stops in front
  of a conv/dense/pool, and the group's last injective op picks its schedule
  (src/relay/backend/te_compiler_cache.cc:728).

Decided from the partition's graph; what lies outside it comes from the attributes
``partition_for_refcg`` records (``INPUTS_ATTR``/``OUTPUTS_ATTR``). A case the graph cannot
settle is recorded when ``partition_for_refcg`` asks (``undecided``: it leaves those composites in
TVM and partitions again), else raises RefcgError: the build stops with the reason instead of
rounding wrongly (a partition made without the aarch64 target).
"""
from __future__ import annotations

import tvm
from tvm import relay

from .ops.base import dtype_of, op_name
from .ops.conv2d import Conv2D
from .ops.epilogue import Epilogue
from .ops.pool2d import Pool2D
from .errors import RefcgError
from .numerics import conv2d_output_sliced, injective_lanes, is_arm_cpu_aarch64, resolve_mode, tvm_aarch64_lanes
from .stagewise import STAGEWISE_INPUTS_ATTR, children, fusable_op, readers_of

INPUTS_ATTR = "RefcgInputsFromGraph"  # per partition parameter: FREE, CONCATENATED or 0 (maybe an anchor's)
FREE = 1  # no TVM kernel this input's readers may join computes it: they start their own group
CONCATENATED = 2  # a TVM concatenate's group may take its elementwise readers: scalar (schedule_concatenate)
OUTPUTS_ATTR = "RefcgOutputsToGraph"  # per partition result: 1 = only returned by main
ELEMWISE = ("refcg.binary", "refcg.requantize")
# refcg.copy kernels of one elementwise/broadcast op (kElemWise/kBroadcast in TVM): like bias_add
# after a conv, FuseOps puts them into the group of the conv/dense/pool they follow
ELEMWISE_COPY_OPS = ("cast", "clip", "maximum", "minimum")
# elementwise in TVM-only without a requantize of their own (float ops on each value): an anchor's
# group grows through them into the requantizes that follow
ELEMWISE_PASS = ("refcg.quantize", "refcg.lut")
ANCHORS = ("refcg.conv2d", "refcg.dense", "refcg.pool2d")


def _composite(expr) -> str | None:
    if isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function):
        return str(expr.op.attrs["Composite"])
    return None


def _same(a, b) -> bool:
    return a is not None and a.same_as(b)


def _shape(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.checked_type.shape)


def _flags(func, attr: str, count: int) -> list[int | None]:
    value = func.attrs.get(attr) if func.attrs else None
    return [int(v) for v in value] if value is not None else [None] * count


class Unknown(Exception):
    """The graph does not settle which TVM kernel computes a requantize."""


class FusionContext:
    """The partition's composite calls with their readers, for ``q31x4``."""

    def __init__(self, func: relay.Function, target, undecided: list | None = None):
        self.target = target
        self.undecided = undecided  # None: an undecidable question raises, else (call, reason) goes here
        fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
        self.graph_input = dict(zip(func.params, _flags(func, INPUTS_ATTR, len(func.params))))
        self.graph_output = {}
        for field, flag in zip(fields, _flags(func, OUTPUTS_ATTR, len(fields))):
            self.graph_output[field] = flag
        self.readers: dict = {}

        def visit(node):
            if _composite(node):
                for arg in node.args:  # one reader per composite, however many of its operands
                    readers = self.readers.setdefault(arg, [])
                    if not any(r.same_as(node) for r in readers):
                        readers.append(node)

        for field in fields:
            relay.analysis.post_order_visit(field, visit)

    # -- the TVM group an expression's value is computed in -------------------------------
    def _anchor_lanes(self, call) -> int | None:
        """Lanes of the loop of the anchored group ``call`` belongs to, None when unanchored."""
        kind = _composite(call)
        body = call.op.body
        if kind == "refcg.conv2d":
            conv = Conv2D.parse(body).conv
            if conv2d_output_sliced(self.target, conv):
                return None  # its requantize follows a strided_slice: no anchor
            return tvm_aarch64_lanes(self.target, "conv2d", conv=conv)
        if kind == "refcg.dense":
            return tvm_aarch64_lanes(self.target, "dense", channels=_shape(call)[-1])
        if kind == "refcg.pool2d":
            return tvm_aarch64_lanes(self.target, "pool")
        if kind in ELEMWISE or kind in ELEMWISE_PASS or (kind == "refcg.copy" and op_name(body) in ELEMWISE_COPY_OPS):
            absorbed = self._absorbed_by(call)
            return self._anchor_lanes(absorbed) if absorbed is not None else None
        return None

    def _single_reader(self, expr):
        """The composite reading ``expr`` when it is its only reader (and not also returned)."""
        readers = self.readers.get(expr, [])
        if len(readers) == 1 and expr not in self.graph_output:
            return readers[0]
        return None

    def _absorbed_by(self, call):
        """The anchored producer whose group takes this elementwise composite, if any:
        an operand of the same shape whose producer is anchored and read only here. An operand
        TVM computes outside the partition may be an anchor's (nn.softmax is one): not known here."""
        for arg in call.args:
            if isinstance(arg, relay.Var) and not self.graph_input.get(arg):
                raise Unknown("its operand is computed by TVM outside the partition")
            if (_composite(arg) and _same(self._single_reader(arg), call) and _shape(arg) == _shape(call)
                    and self._anchor_lanes(arg) is not None):
                return arg
        return None

    def _operand_lanes(self, operand, reader) -> int:
        """Lanes of the loop computing ``reader``'s requantize of ``operand``."""
        others = [r for r in self.readers.get(operand, []) if not r.same_as(reader)]
        if any(_composite(r) not in ANCHORS for r in others):
            # EliminateCommonSubexpr merges equal requantize chains of one tensor: the shared
            # int32 result then ends its own kernel, which the readers' graph does not show
            raise Unknown("its operand is also requantized by another kernel")
        if _composite(operand) and _same(self._single_reader(operand), reader):
            lanes = self._anchor_lanes(operand)
            if lanes is not None:
                return lanes  # on the anchor's single-use path (graph_partitioner.cc:421-432)
        elif isinstance(operand, relay.Var) and not self.graph_input.get(operand):
            raise Unknown("its operand is computed by TVM outside the partition")
        if _composite(reader) == "refcg.concatenate":
            return self._concat_lanes(reader)
        return self._group_lanes(reader)

    def _group_lanes(self, call) -> int:
        """Lanes of the group an elementwise composite (or a sliced conv's requantize) is in."""
        lanes = self._anchor_lanes(call) if _composite(call) in ELEMWISE else None
        return lanes if lanes is not None else self._tail_lanes(call)

    def _tail_lanes(self, call) -> int:
        """Unanchored chain ending at ``call``: it fuses forward (graph_partitioner.cc:433-461)
        until a conv/dense/pool reads it; the injective schedule vectorizes its last output."""
        shape, dtype = _shape(call), dtype_of(call)
        readers = self.readers.get(call, [])
        if call in self.graph_output:
            if not self.graph_output[call]:
                raise Unknown("its result is also read by TVM operators outside the partition")
            return injective_lanes(shape[-1], dtype)  # returned by main: no post-dominator
        if len(readers) > 1:
            # several readers: the chain ends here when a path to their post-dominator
            # crosses a conv/dense/pool (CheckPath's condition, graph_partitioner.cc:439-448)
            if any(_composite(r) in ANCHORS for r in readers):
                return injective_lanes(shape[-1], dtype)
            raise Unknown("its result has several elementwise readers")
        if not readers:
            raise Unknown("its result is not returned")
        reader = readers[0]
        kind = _composite(reader)
        if kind in ELEMWISE:
            return self._group_lanes(reader)
        if kind == "refcg.concatenate":
            return self._concat_lanes(reader)
        if kind == "refcg.conv2d":
            pad = Conv2D.parse(reader.op.body).pad
            # the conv's legalization casts its input to int8/int16 (never int32): the chain
            # ends on that cast, or on the fused nn.pad (injective, shape of its output)
            return injective_lanes((_shape(pad) if pad is not None else shape)[-1], "int8")
        if kind == "refcg.dense":
            data = Epilogue.parse(reader.op.body).anchor.args[0]  # reshape or the input
            return injective_lanes(_shape(data)[-1], "int8")
        if kind == "refcg.pool2d":
            # avg pools read the chain through a cast to int32 (fused here); max pools directly
            return injective_lanes(shape[-1], "int32" if Pool2D.parse(reader.op.body).inner_cast is not None else dtype)
        raise Unknown(f"it feeds a {kind} kernel")

    def _concat_lanes(self, concat) -> int:
        """concatenate masters its group; its schedule does not vectorize
        (topi/arm_cpu/injective.py:81-107) unless a later injective op (pad, reshape) joins."""
        readers = self.readers.get(concat, [])
        if concat in self.graph_output:
            if self.graph_output[concat]:
                return 1
        elif readers and all(_composite(r) in ANCHORS and self._keeps_shape(r) for r in readers):
            return 1
        raise Unknown("it is concatenated into a tensor that is padded, reshaped or read elsewhere")

    def _after_concatenate(self, call) -> bool:
        """Whether an elementwise composite reads a concatenate, directly or through elementwise
        composites: FuseOps may put it into the concatenate's group (graph_partitioner.cc:453-461),
        whose schedule is schedule_concatenate's unless a later injective op joins; not followed here."""
        for arg in call.args:
            if isinstance(arg, relay.Var) and self.graph_input.get(arg) == CONCATENATED:
                return True
            kind = _composite(arg)
            if kind == "refcg.concatenate" or (kind in ELEMWISE and self._after_concatenate(arg)):
                return True
        return False

    @staticmethod
    def _keeps_shape(reader) -> bool:
        """No injective op (fused pad, flattening reshape) in front of this conv/dense/pool."""
        kind = _composite(reader)
        if kind == "refcg.conv2d":
            return Conv2D.parse(reader.op.body).pad is None
        if kind == "refcg.dense":
            data = Epilogue.parse(reader.op.body).anchor.args[0]
            return op_name(data) not in ("reshape", "nn.batch_flatten")
        return True

    def kernel_mates(self, call) -> list:
        """The composites TVM-only may compute in one kernel with ``call``: its producers and readers,
        on through every composite but conv/dense/pool (an anchor producer's group may grow into
        ``call``; an anchor reader's pad or input cast joins ``call``'s group). Left in TVM along with
        ``call``, they let TVM fuse that part of the graph as TVM-only does."""
        found, todo = [], [call]
        while todo:
            node = todo.pop()
            for other in list(node.args) + self.readers.get(node, []):
                if _composite(other) is None or other.same_as(call) or any(other.same_as(f) for f in found):
                    continue
                found.append(other)
                if _composite(other) not in ANCHORS:
                    todo.append(other)
        return found

    # -- the question the planners ask ------------------------------------------------------
    def q31x4(self, call, operand: int | None = None) -> bool:
        """Does TVM-only compute ``call``'s requantize (of its argument ``operand`` for binary and
        concatenate inputs) on int32x4 vectors, i.e. with the NEON double rounding?"""
        if operand is not None and isinstance(call.args[operand], relay.Constant):
            return False  # TVM-only's FoldConstant computes a constant's requantize on the build host: once rounded
        try:
            kind = _composite(call)
            if kind in ELEMWISE and self._after_concatenate(call):
                raise Unknown("it reads a concatenate's result, whose kernel may compute it")
            if operand is not None:
                lanes = self._operand_lanes(call.args[operand], call)
            elif kind in ("refcg.conv2d", "refcg.dense"):
                lanes = self._anchor_lanes(call)
                if lanes is None:
                    lanes = self._tail_lanes(call)  # a sliced conv's requantize
            elif kind == "refcg.requantize":
                lanes = self._operand_lanes(call.args[0], call)
            else:
                lanes = self._group_lanes(call)
        except Unknown as why:
            reason = f"cannot tell whether TVM-only rounds this requantize with NEON: {why}"
            if self.undecided is None:
                raise RefcgError(str(_composite(call)), "aarch64 rounding", reason) from None
            self.undecided.append((call, reason))
            return False
        return lanes == 4


TVM_ROUNDING_MATE_ATTR = "RefcgTvmRoundingMate"  # a ``neon_rounding_seed`` mate (a partition without target=)

# The QNN ops whose canonical form requantizes (tir.q_multiply_shift): src/relay/qnn/op/{requantize,
# concatenate,leaky_relu,mul,softmax}.cc and op_common.h (add, subtract) at v0.19.0. Left in TVM on
# aarch64, each rounds with NEON or not by the lanes of the TVM kernel FuseOps puts it in.
TVM_ROUNDING_OPS = ("qnn.requantize", "qnn.add", "qnn.subtract", "qnn.mul", "qnn.leaky_relu", "qnn.concatenate",
                    "qnn.softmax")


def tvm_kernel_mates(main: relay.Function, seed) -> list:
    """(composite call, reason) for the composite calls of ``main`` (after MergeComposite) that TVM-only
    may compute in one kernel with a plain TVM op whose value depends on that kernel's code: ``seed(call)``
    describes such an op, or is None. Reached through TVM's elementwise/injective ops and non-anchor
    composites, as ``FusionContext.kernel_mates``. Offloading one would change the kernel the op is
    computed in: a requantize's NEON rounding (``neon_rounding_seed``; the TVM-only kernel of
    qnn.leaky_relu -> qnn.hardswish -> reshape vectorizes the reshape's last axis, the leaky_relu alone
    its own), an undefined float-to-int conversion's result."""
    inside, nodes = set(), []

    def visit_composites(node):
        if isinstance(node, relay.Function) and node.attrs and node.attrs.get("Composite"):
            relay.analysis.post_order_visit(node.body, inside.add)

    relay.analysis.post_order_visit(main.body, visit_composites)
    relay.analysis.post_order_visit(main.body, lambda node: node in inside or nodes.append(node))
    readers = readers_of(main.body, inside)
    found: dict = {}
    for node in nodes:
        what = seed(node) if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) else None
        if what is None:
            continue
        why = f"TVM-only may compute it in one kernel with {what}: they stay in TVM together"
        seen, todo = {node, main.body}, [node]  # main's result tuple joins no kernels
        while todo:
            node = todo.pop()
            for other in children(node) + readers.get(node, []):
                if other in seen:
                    continue
                seen.add(other)
                kind = _composite(other)
                if kind is not None:
                    found.setdefault(other, why)
                    if kind not in ANCHORS:
                        todo.append(other)
                elif isinstance(other, (relay.Tuple, relay.TupleGetItem)) or (
                        isinstance(other, relay.Call) and isinstance(other.op, tvm.ir.Op) and fusable_op(other.op.name)):
                    todo.append(other)
    return list(found.items())


def neon_rounding_seed(call) -> str | None:
    """``tvm_kernel_mates``' seed on aarch64: a requantizing QNN op (``TVM_ROUNDING_OPS``)."""
    name = op_name(call)
    if name in TVM_ROUNDING_OPS and _may_round_with_neon(call):
        return f"a {name} left in TVM, whose rounding (NEON or not) follows that kernel's loop (aarch64 rounding)"
    return None


def _may_round_with_neon(call) -> bool:
    """Whether the requantize in ``call``'s canonical form can take the NEON path: UPWARD in int64
    (``resolve_mode``; a requantize_config of float32 computes in floats) and per tensor
    (q_multiply_shift_per_axis has no aarch64 lowering). qnn.softmax multiplies in fixed point itself."""
    name = op_name(call)
    if name == "qnn.softmax":
        return True
    attrs = call.attrs if name == "qnn.requantize" else None
    try:
        mode = resolve_mode(str(attrs.rounding) if attrs else "None", str(attrs.compute_dtype) if attrs else "None", None)
    except RefcgError:  # a mode refcg does not compute: not known to stay off NEON
        return True
    if mode != ("UPWARD", "int64"):
        return False
    scale = call.args[1]
    return name != "qnn.requantize" or not (isinstance(scale, relay.Constant) and scale.data.numpy().size > 1)


def refuse_tvm_rounding_mates(func: relay.Function, target, symbol: str):
    """For a partition made without ``target=`` and built for aarch64: raise where ``tvm_kernel_mates``
    would have left composites in TVM for ``neon_rounding_seed`` (they carry TVM_ROUNDING_MATE_ATTR)."""
    if not is_arm_cpu_aarch64(target):
        return
    tagged = []
    relay.analysis.post_order_visit(func.body, lambda node: tagged.append(node) if isinstance(node, relay.Function)
                                    and node.attrs and node.attrs.get(TVM_ROUNDING_MATE_ATTR) else None)
    if tagged:
        raise RefcgError(symbol, "aarch64 rounding", f"TVM-only computes its {tagged[0].attrs['Composite']} in one kernel "
                                                     "with a requantizing op left in TVM, whose NEON rounding follows "
                                                     "that kernel; pass target= to partition_for_refcg to keep them "
                                                     "in TVM together")


def tag_boundaries(mod):
    """Record on each refcg partition which of its inputs no TVM anchor computes (graph inputs,
    constants, elementwise/injective TVM ops: a requantize chain on them fuses forward, like on a
    graph input) and which of its results main only returns (no TVM operator reads them): what
    ``FusionContext`` needs to know about the graph around the partition."""
    main = mod["main"]
    results = list(main.body.fields) if isinstance(main.body, relay.Tuple) else [main.body]
    parents: dict = {}

    def visit(node):
        children = []
        if isinstance(node, relay.Call):
            children = list(node.args)
        elif isinstance(node, relay.Tuple):
            children = list(node.fields)
        elif isinstance(node, relay.TupleGetItem):
            children = [node.tuple_value]
        for child in children:
            parents.setdefault(child, []).append(node)

    relay.analysis.post_order_visit(main.body, visit)

    def only_returned(expr) -> bool:
        users = parents.get(expr, [])
        returned = any(expr.same_as(r) for r in results)
        return returned and all(isinstance(u, relay.Tuple) and u.same_as(main.body) for u in users)

    for call in list(parents) + [main.body]:
        if not (isinstance(call, relay.Call) and isinstance(call.op, relay.GlobalVar)):
            continue
        func = mod[call.op]
        if not (func.attrs and func.attrs.get("Compiler") == "refcg"):
            continue
        if isinstance(func.ret_type, relay.TupleType):
            items = [u for u in parents.get(call, []) if isinstance(u, relay.TupleGetItem)]
            outputs = [all(only_returned(u) for u in items if u.index == i) for i in range(len(func.ret_type.fields))]
        else:
            outputs = [only_returned(call)]
        inputs = [0 if _maybe_anchored(arg, parents) else CONCATENATED if _concatenated(arg) else FREE
                  for arg in call.args]
        func = func.with_attr(INPUTS_ATTR, inputs)
        mod[call.op] = func.with_attr(OUTPUTS_ATTR, [int(v) for v in outputs])
    return mod


def _maybe_anchored(expr, parents) -> bool:
    """Whether TVM-only may compute ``expr`` in a conv/dense/pool kernel's group: an anchor
    (kOutEWiseFusable) reached back through single-use elementwise/broadcast ops, or another
    partition (its operators are TVM's in TVM-only)."""
    if isinstance(expr, relay.Call) and isinstance(expr.op, relay.GlobalVar):
        return True
    if not (isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op)):
        return False  # graph input, constant, tuple item
    pattern = expr.op.get_attr("TOpPattern")
    if pattern is None:
        return True
    if int(pattern) == relay.op.OpPattern.OUT_ELEMWISE_FUSABLE:
        return True
    if int(pattern) > relay.op.OpPattern.BROADCAST:
        return False  # injective, reduce, opaque: no anchor group grows through them
    return any(len(parents.get(arg, [])) == 1 and _maybe_anchored(arg, parents) for arg in expr.args)


def _concatenated(expr) -> bool:
    """Whether ``expr`` is a TVM concatenate or an elementwise/broadcast op after one: FuseOps puts
    such ops (and an elementwise reader) into the concatenate's group (graph_partitioner.cc:453-461),
    which a later injective op alone takes from schedule_concatenate (te_compiler_cache.cc:728)."""
    seen, todo = set(), [expr]
    while todo:
        node = todo.pop()
        if not (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)) or node in seen:
            continue
        seen.add(node)
        if node.op.name in ("concatenate", "qnn.concatenate"):
            return True
        pattern = node.op.get_attr("TOpPattern")
        if pattern is not None and int(pattern) <= relay.op.OpPattern.BROADCAST:
            todo += list(node.args)
    return False


def keep_boundaries(original: relay.Function, folded: relay.Function) -> relay.Function:
    """``folded`` with ``original``'s boundary attributes (the scoped fold drops attributes)."""
    for attr in (INPUTS_ATTR, OUTPUTS_ATTR, STAGEWISE_INPUTS_ATTR):
        value = original.attrs.get(attr) if original.attrs else None
        if value is not None:
            folded = folded.with_attr(attr, value)
    return folded
