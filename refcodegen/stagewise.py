"""TVM-only's conv kernels that round every stage apart: which convs, and what must stay in TVM with them.

TVM 0.19 schedules some conv2d variants with ``topi.generic.default_schedule(outs, auto_inline=False)``
(python/tvm/topi/generic/default.py:23-34 at v0.19.0): each op FuseOps put into the conv's kernel (bias
add, the requantize's cast, multiply, add and floor, a clip, a residual add ...) is its own loop nest over
a materialized tensor. The other schedules inline those ops into the output loop, where LowerIntrin turns
a float ``a * b + c`` into one fma (src/tir/transforms/lower_intrin.cc:87-93, llvm.fmuladd:
src/target/llvm/intrin_rule_llvm.cc:50-51) that an FMA target rounds once. So in such a kernel a float
requantize's multiply and add round twice, even on FMA targets.

The generic-scheduled variants (relay/op/strategy/x86.py and arm_cpu.py; depthwise: in channels ==
out channels == groups, strategy/generic.py:92-95):

- x86 strategy (targets without the ``arm_cpu`` key): depthwise NHWC (x86.py:228-237 ->
  topi/generic/nn.py:433-446), grouped NHWC (x86.py:248-257 -> nn.py:516-530), depthwise NCHW with a
  dilation (x86.py:209-224 -> nn.py:416-430; without one, x86's own schedule in NCHWc inlines);
- arm_cpu strategy: grouped NHWC (arm_cpu.py:414-421); its depthwise NHWC schedules inline
  (topi/generic/conv2d.py:395-420, topi/arm_cpu/depthwise_conv2d.py:288).

Read from TVM-only's LLVM IR (an fmul stored to a buffer vs. llvm.fmuladd) for every branch:
tests/test_ops_fma.py. refcg's conv kernel rounds its own requantize the same way (``conv_stagewise``).
Table ops the kernel certainly ends after (``kernel_tables``) are offloaded with their tables computed
in such a kernel (lut.py); whatever else FuseOps may put into it, refcg cannot round like it from another
kernel, so ``tangled_composites`` finds it and the conv stays in TVM with it.
"""
from __future__ import annotations

import tvm
from tvm import relay

from .errors import RefcgError
from .numerics import float_lowering

# kernels TVM fuses only as anchors or reductions (TOpPattern >= kCommReduce): a conv's kernel stops there
_STOPS = ("refcg.conv2d", "refcg.dense", "refcg.pool2d", "refcg.batch_matmul", "refcg.reduce",
          "refcg.softmax", "refcg.float_softmax")
# integer data movement: rounds nothing itself
_EXACT = ("refcg.copy",)


# STAGEWISE_INPUTS_ATTR: per partition parameter, the strategies (bits) for which TVM may compute it in a
# stagewise conv's kernel: what the codegen checks when the partition was made without target=
STAGEWISE_INPUTS_ATTR = "RefcgStagewiseInputs"
X86, ARM_CPU = 1, 2
# on a refcg.lut composite TVM-only computes in a stagewise conv's kernel (``stagewise_tables``): lut.py
# computes its table in such a kernel
STAGEWISE_TABLE_ATTR = "RefcgStagewiseTable"


def conv_stagewise(target, conv) -> str | None:
    """The generic-scheduled variant TVM-only builds ``conv`` (a qnn.conv2d call) with for ``target``,
    e.g. "depthwise NHWC", or None when its schedule inlines the ops after it."""
    if target is None or str(target.kind) != "llvm":
        return None
    return _variant(conv, "arm_cpu" in target.keys)


def _variant(conv, arm_cpu: bool) -> str | None:
    """``conv_stagewise`` for an llvm target of the arm_cpu strategy or of the x86 one."""
    attrs = conv.attrs
    layout = str(attrs.data_layout)
    groups = int(attrs.groups)
    if groups == 1 or layout not in ("NCHW", "NHWC"):
        return None
    in_c = int(conv.args[0].checked_type.shape[layout.index("C")])
    out_c = int(conv.checked_type.shape[layout.index("C")])
    depthwise = in_c == out_c == groups
    kind = "depthwise" if depthwise else "grouped"
    if arm_cpu:
        return f"{kind} {layout}" if layout == "NHWC" and not depthwise else None
    if layout == "NHWC":
        return f"{kind} {layout}"
    dilated = any(int(d) != 1 for d in attrs.dilation)
    return "depthwise NCHW dilated" if depthwise and dilated else None


def _composite(expr) -> str | None:
    if isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function) and expr.op.attrs:
        return str(expr.op.attrs.get("Composite", "")) or None
    return None


def _op_name(expr) -> str | None:
    return expr.op.name if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) else None


def fusable_op(name: str) -> bool:
    """Elementwise, broadcast or injective (TOpPattern <= kInjective), or a qnn unary op (no pattern:
    canonicalized to elementwise ops). Injective ops included: over-approximates FuseOps' growth."""
    pattern = tvm.ir.Op.get(name).get_attr("TOpPattern")
    if pattern is None:
        return name.startswith("qnn.") and name != "qnn.softmax"
    return int(pattern) <= 2


def _grows_into(expr) -> bool:
    """Whether a conv's kernel may grow into ``expr`` (its reader)."""
    if isinstance(expr, (relay.Tuple, relay.TupleGetItem)):
        return True
    kind = _composite(expr)
    if kind is not None:
        return kind not in _STOPS
    name = _op_name(expr)
    return name is not None and fusable_op(name)


def _rounds(expr) -> bool:
    """Whether ``expr`` computes with floats where fusion changes the rounding: any qnn op, any float
    result, any composite but integer data movement."""
    kind = _composite(expr)
    if kind is not None:
        return kind not in _EXACT
    if isinstance(expr, relay.Call):
        name = _op_name(expr) or ""
        return name.startswith("qnn.") or str(expr.checked_type.dtype).startswith("float")
    return False


def children(node) -> list:
    """The expressions ``node`` reads: a call's arguments, a tuple's fields, a tuple item's tuple."""
    if isinstance(node, relay.Call):
        return list(node.args)
    if isinstance(node, relay.Tuple):
        return list(node.fields)
    return [node.tuple_value] if isinstance(node, relay.TupleGetItem) else []


def readers_of(body, skip=frozenset()) -> dict:
    """{expression: the calls, tuples and tuple items that read it} in ``body``, the nodes in ``skip``
    (e.g. the insides of composite functions) neither read nor counted as readers."""
    readers: dict = {}

    def visit(node):
        if node not in skip:
            for child in children(node):
                readers.setdefault(child, []).append(node)

    relay.analysis.post_order_visit(body, visit)
    return readers


def _region(readers: dict, start) -> list:
    """What a conv kernel computing ``start`` may grow into (``_grows_into``, transitively)."""
    region, seen, todo = [], set(), [start]
    while todo:
        for reader in readers.get(todo.pop(), []):
            if _grows_into(reader) and reader not in seen:
                seen.add(reader)
                region.append(reader)
                todo.append(reader)
    return region


def kernel_tables(readers: dict, conv, ends) -> list | None:
    """The table composites (refcg.lut) TVM-only computes in the kernel of the stagewise conv composite
    ``conv``, when the graph settles where that kernel ends; None when it does not. FuseOps grows a conv's
    group only into the post-dominator of its result, through elementwise edges (graph_partitioner.cc:
    421-432): through a table op that is the result's single reader, not past a result that a conv, pool
    or reduce also reads (the path to the post-dominator crosses it), nor into a table TVM legalizes to a
    lookup (take: injective). ``ends(expr)``: for a result of the function, whether the kernel ends there
    (False: readers outside are not known); None for any other expression."""
    chain, node = [], conv
    while True:
        end = ends(node)
        if end is not None:
            return chain if end else None
        after = readers.get(node, [])
        if any(not _grows_into(r) for r in after) or (len(after) == 1 and _table(after[0]) == "host"):
            return chain
        if len(after) != 1 or _table(after[0]) != "kernel":
            return None
        node = after[0]
        chain.append(node)


def _table(expr) -> str | None:
    """"host" for a table op TVM legalizes to a lookup computed on the build host, "kernel" for one
    computed by the kernel it is fused into (elementwise ops: a float chain, or a binary op of a tensor
    and such a chain of it, swish), None for anything else (a binary op of a tensor and its lookup: the
    paths meet through an injective take, not followed)."""
    if _composite(expr) != "refcg.lut":
        return None
    from .lut import HOST_TABLE_OPS
    from .ops.lut import Lut

    table = Lut.parse(expr.op.body)
    host = _op_name((table.inner or table).op) in HOST_TABLE_OPS
    if host and table.inner is not None:
        return None
    return "host" if host else "kernel"


def _results_end(func: relay.Function):
    """``kernel_tables``' ``ends`` for ``main``: nothing outside reads its results."""
    results = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    return lambda expr: True if any(expr.same_as(r) for r in results) else None


def _stagewise_kernels(func: relay.Function, target, ends):
    """(conv node, variant, what its kernel may grow into, the tables it certainly ends after or None) for
    each conv of ``func`` that TVM-only computes stage by stage on an FMA ``target``. The tables are known
    for a conv composite of the x86 strategy only (lut.py rebuilds such a kernel to compute them)."""
    if target is None or not float_lowering(target).fma:
        return  # without FMA, stage by stage and inlined round alike
    readers = readers_of(func.body)
    from .ops.conv2d import Conv2D  # the ops package imports numerics, as this module does

    for node in list(readers) + [func.body]:
        kind = _composite(node)
        conv = Conv2D.parse(node.op.body).conv if kind == "refcg.conv2d" else \
            node if _op_name(node) == "qnn.conv2d" else None
        variant = conv_stagewise(target, conv) if conv is not None else None
        if variant is None:
            continue
        tables = kernel_tables(readers, node, ends) if kind is not None and "arm_cpu" not in target.keys else None
        yield node, variant, _region(readers, node), tables


def stagewise_tables(func: relay.Function, target, ends=None) -> list:
    """The table composite calls of ``func`` TVM-only computes in a stagewise conv's kernel, as that
    kernel rounds (every stage apart): lut.py computes their tables in such a kernel
    (STAGEWISE_TABLE_ATTR). ``ends``: see ``kernel_tables`` (default: ``func`` is main)."""
    kernels = _stagewise_kernels(func, target, ends or _results_end(func))
    return [table for _, _, _, tables in kernels for table in tables or []]


def tangled_composites(main: relay.Function, target, ends=None) -> dict:
    """``{composite Function: reason}`` for the composite calls of ``main`` (after MergeComposite) that must
    stay in TVM: for each conv TVM-only computes stage by stage (``conv_stagewise``) on an FMA target whose
    kernel is not known to end after table ops (``kernel_tables``), everything that kernel may grow into,
    when any of that rounds; and the conv's own composite then. Left in TVM together, they are fused as
    TVM-only fuses them. ``ends``: see ``kernel_tables`` (default: main's results end kernels)."""
    tangled = {}
    for node, variant, region, tables in _stagewise_kernels(main, target, ends or _results_end(main)):
        rounding = [r for r in region if _rounds(r)]
        if not rounding or tables is not None:
            continue
        first = _composite(rounding[0]) or _op_name(rounding[0]) or type(rounding[0]).__name__
        why = (f"TVM-only computes it in one kernel with a {variant} qnn.conv2d, whose generic schedule rounds "
               "every stage apart (no FMA contraction): it stays in TVM with the conv")
        for reader in region:
            if _composite(reader) is not None:
                tangled[reader.op] = why
        if _composite(node) is not None:
            tangled[node.op] = (f"TVM-only's kernel of this {variant} conv (generic schedule, every stage rounded "
                                f"apart) also computes the {first} after it: they stay in TVM together")
    return tangled


def _partition_ends(func: relay.Function):
    """``kernel_tables``' ``ends`` for a partition: a result ends a kernel when main only returns it
    (armfuse's OUTPUTS_ATTR); what else reads it is not known here."""
    from .armfuse import OUTPUTS_ATTR  # armfuse imports the ops package

    fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    flags = func.attrs.get(OUTPUTS_ATTR) if func.attrs else None
    only_returned = [int(flag) == 1 for flag in flags] if flags is not None else [False] * len(fields)
    return lambda expr: next((end for field, end in zip(fields, only_returned) if expr.same_as(field)), None)


def partition_tables(func: relay.Function, target) -> list:
    """``stagewise_tables`` as far as a partition shows them (the codegen marks them: a partition made
    without ``target=`` has none marked, one made with it may hold more, settled by the whole graph)."""
    return stagewise_tables(func, target, _partition_ends(func))


def refuse_tangles(func: relay.Function, target, symbol: str):
    """For a partition made without ``target=``: raise where ``tangled_composites`` would have left
    composites in TVM, as far as the partition shows it (its own composites; a stagewise conv's result
    that TVM reads; an input TVM may compute in a stagewise conv's kernel, ``tag_stagewise_inputs``)."""
    from .armfuse import OUTPUTS_ATTR  # armfuse imports the ops package

    fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    flags = func.attrs.get(OUTPUTS_ATTR) if func.attrs else None
    if tangled_composites(func, target, _partition_ends(func)):
        raise RefcgError(symbol, "target", "it holds ops that TVM-only computes stage by stage in a depthwise or "
                                           "grouped conv's kernel (no FMA contraction); pass target= to "
                                           "partition_for_refcg to keep them in TVM")
    if target is None or not float_lowering(target).fma:
        return
    from .ops.conv2d import Conv2D

    for i, field in enumerate(fields):
        if _composite(field) != "refcg.conv2d" or (flags is not None and int(flags[i])):
            continue
        variant = conv_stagewise(target, Conv2D.parse(field.op.body).conv)
        if variant is not None:
            raise RefcgError(symbol, "target", f"TVM reads the result of a {variant} qnn.conv2d, whose TVM-only kernel "
                                               "may compute its readers stage by stage; pass target= to "
                                               "partition_for_refcg to keep them in TVM")
    strategy = ARM_CPU if "arm_cpu" in target.keys else X86
    flags = func.attrs.get(STAGEWISE_INPUTS_ATTR) if func.attrs else None
    readers = readers_of(func.body)
    for param, flag in zip(func.params, flags or ()):
        if int(flag) & strategy and any(_rounds(r) for r in _region(readers, param)):
            raise RefcgError(symbol, "target", f"TVM computes its input {param.name_hint} in the kernel of a depthwise "
                                               "or grouped qnn.conv2d left in TVM, which TVM-only also computes the "
                                               "ops reading it in, stage by stage (no FMA contraction); pass target= "
                                               "to partition_for_refcg to keep them in TVM")


def tag_stagewise_inputs(mod):
    """Record on each refcg partition (STAGEWISE_INPUTS_ATTR) which of its inputs TVM may compute in the
    kernel of a qnn.conv2d left in TVM that is stagewise for the x86 or the arm_cpu strategy: reached back
    through the ops such a kernel grows into. Decided without the target, for ``refuse_tangles``."""
    main = mod["main"]
    readers = readers_of(main.body)

    def strategies(expr) -> int:
        found, seen, todo = 0, set(), [expr]
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if _op_name(node) == "qnn.conv2d":
                found |= (X86 if _variant(node, False) else 0) | (ARM_CPU if _variant(node, True) else 0)
            elif isinstance(node, relay.TupleGetItem):
                todo.append(node.tuple_value)
            elif isinstance(node, relay.Tuple):
                todo += list(node.fields)
            elif _op_name(node) is not None and fusable_op(_op_name(node)):
                todo += list(node.args)
        return found

    for call in list(readers) + [main.body]:
        if isinstance(call, relay.Call) and isinstance(call.op, relay.GlobalVar):
            func = mod[call.op]
            if func.attrs and func.attrs.get("Compiler") == "refcg":
                mod[call.op] = func.with_attr(STAGEWISE_INPUTS_ATTR, [strategies(arg) for arg in call.args])
    return mod
