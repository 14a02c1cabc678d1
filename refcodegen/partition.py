"""``partition_for_refcg``: mark the quantized parts of a Relay module for the refcg codegen."""
from __future__ import annotations

import json

import tvm
from tvm import relay
from tvm.relay.build_module import bind_params_by_name

from .armfuse import (TVM_ROUNDING_MATE_ATTR, FusionContext, keep_boundaries, neon_rounding_seed, tag_boundaries,
                      tvm_kernel_mates)
from .numerics import is_arm_cpu_aarch64
from .stagewise import STAGEWISE_TABLE_ATTR, stagewise_tables, tag_stagewise_inputs, tangled_composites
from .ops import COMPILER, CheckContext, family_of, pattern_table
from .ops.base import op_name
from .ops.quantize import SCALE_LOADED_ATTR
from .plan import build_plan
from .scoped_fold import scoped_fold
from .splits import split_to_slices

TARGET_ATTR = "RefcgTarget"
REJECTIONS_ATTR = "refcg_rejections"
MATCH_ATTR = "RefcgMatch"  # a composite's number in MergeComposite's output (aarch64 targets only)
QUANTIZE = relay.op.get("qnn.quantize")
MAX_ROUNDS = 8  # partitionings of one module for the aarch64 rounding; each round leaves >= 1 composite in TVM


def prepare_passes(fold_batch_norm: bool, fake_quantization_to_integer: bool) -> list:
    """Graph clean-ups that must happen before partitioning: relay.build skips partitions."""
    passes = [relay.transform.InferType()]
    if fake_quantization_to_integer:
        passes += [relay.transform.FakeQuantizationToInteger(), relay.transform.InferType()]
    if fold_batch_norm:
        passes += [
            relay.transform.SimplifyInference(),
            relay.transform.FoldConstant(),
            relay.transform.FoldScaleAxis(),
            relay.transform.FoldConstant(),
        ]
    return passes


def partition_for_refcg(mod, params=None, *, target=None, fold_batch_norm: bool = True,
                        fake_quantization_to_integer: bool = False):
    """Partition ``mod`` so that the QNN parts refcg computes exactly run through ``relay.ext.refcg``.

    Parameters
    ----------
    mod : tvm.IRModule
    params : dict of str to NDArray, optional
        Bound as constants first, so weights can be folded and embedded.
    target : str or tvm.target.Target, optional
        The build target. Only needed when ``relay.build`` is not called from Python in
        this process; refcg otherwise finds the target ``relay.build`` was given.
    fold_batch_norm : bool
        Run SimplifyInference/FoldConstant/FoldScaleAxis first, so batch_norm folds into weights.
        These passes leave QNN ops alone (FoldConstant does not fold QNN by default).
    fake_quantization_to_integer : bool
        Run FakeQuantizationToInteger first: needed for QDQ graphs (ONNX QDQ, TFLite fake-quant).

    Returns
    -------
    A new tvm.IRModule with ``Compiler="refcg"`` functions; ``offload_report(mod)`` explains it.
    ``mod`` itself is left as it was (callers build it TVM-only as the reference).
    """
    mod = mod.clone()  # binding params and tagging targets below replace functions in place
    if params:
        mod["main"] = bind_params_by_name(mod["main"], params)
    target = tvm.target.Target(target) if target is not None else None
    ctx = CheckContext(target)  # this call's checks: their target, dequantize consumers and rejections
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(prepare_passes(fold_batch_norm, fake_quantization_to_integer))(mod)
        mod = split_to_slices(mod)
        ctx.dequantize_uses.analyze(mod["main"])  # the dequantize check needs each result's consumers
        mod = relay.transform.MergeComposite(pattern_table(ctx))(mod)
        mod = _map_composites(mod, lambda call, _: _mark_loaded_scale(call, ctx))
        mod = _keep_loaded_scales_shared(mod, ctx)
        mod = _keep_stagewise_kernels_together(mod, ctx)
        if is_arm_cpu_aarch64(target):
            mod = _partition_aarch64(mod, ctx)
        else:
            mod = _keep_tvm_kernels_whole(mod, ctx, _undefined_cast_seed(ctx))
            if target is None:  # an aarch64 build would need them in TVM: the codegen refuses them there
                mates = {call.op for call, _ in tvm_kernel_mates(mod["main"], neon_rounding_seed)}
                mod = _map_composites(mod, lambda call, _: _with_attr(call, TVM_ROUNDING_MATE_ATTR, 1)
                                      if call.op in mates else call)
            mod = _partition(mod)
    if target is not None:
        mod = _tag_target(mod, str(target))
    return mod.with_attr(REJECTIONS_ATTR, json.dumps(ctx.rejections.as_dict()))


def _partition(mod):
    """The refcg functions of MergeComposite's output, with what armfuse needs to know around them."""
    mod = tvm.transform.Sequential([
        relay.transform.AnnotateTarget(COMPILER),
        relay.transform.MergeCompilerRegions(),
        relay.transform.PartitionGraph(),
        relay.transform.InferType(),
    ])(mod)
    return tag_stagewise_inputs(tag_boundaries(mod))


def _partition_aarch64(mod, ctx: CheckContext):
    """``_partition``, leaving in TVM each composite whose rounding armfuse cannot tell (whether
    TVM-only's fused kernel takes the NEON int32x4 path). That depends on what the composite's
    operands and result feed once partitioned, so: partition, let the planner ask armfuse each
    question, put the undecided composites back into the graph as plain ops, partition again."""
    mod = _map_composites(mod, lambda call, number: _with_attr(call, MATCH_ATTR, number))
    cast_seed = _undefined_cast_seed(ctx)
    for rounds in range(MAX_ROUNDS + 1):
        mod = _keep_tvm_kernels_whole(mod, ctx, lambda call: neon_rounding_seed(call) or cast_seed(call))
        partitioned = _partition(mod)
        undecided = {}
        for _, func in refcg_functions(partitioned):
            for call, reason, mates in _undecided(func, ctx.target):
                undecided.setdefault(_number(call), (call, reason))
                for mate in mates:
                    why = f"TVM-only may compute it in one kernel with a {call.op.attrs['Composite']} left in TVM"
                    undecided.setdefault(_number(mate), (mate, why))
        if not undecided or rounds == MAX_ROUNDS:
            return partitioned  # what is still undecided after MAX_ROUNDS raises RefcgError in the codegen
        for call, reason in undecided.values():
            ctx.rejections.record(_members(call), f"aarch64 rounding: {reason}")
        mod = _map_composites(mod, lambda call, number: _inlined(call) if number in undecided else call)


def _keep_tvm_kernels_whole(mod, ctx: CheckContext, seed):
    """The composites TVM-only computes in one kernel with a TVM op whose value depends on that kernel
    (armfuse.tvm_kernel_mates with ``seed``) stay in TVM with it, until there are none (a composite put
    back may be such an op)."""
    while True:
        mates = {call.op: reason for call, reason in tvm_kernel_mates(mod["main"], seed)}
        if not mates:
            return mod

        def keep(call, _):
            if call.op not in mates:
                return call
            ctx.rejections.record(_members(call), mates[call.op])
            return _inlined(call)

        mod = _map_composites(mod, keep)


def _undefined_cast_seed(ctx: CheckContext):
    """``tvm_kernel_mates``' seed on every target: a cast after a qnn.quantize left in TVM because the
    quantize's values do not fit its type (consumers._float_casts_after_quantize): TVM-only converts the
    clipped float straight to it, undefined in LLVM, so the code of the kernel decides the result."""
    def seed(call) -> str | None:
        if op_name(call) == "cast" and ctx.dequantize_uses.cast_reason(call):
            return f"a cast to {call.attrs.dtype} left in TVM whose out-of-range values the kernel's code decides"
        return None

    return seed


def _undecided(func, target) -> list:
    """(composite call, reason, its kernel mates) of the aarch64 rounding questions armfuse cannot
    settle in ``func``, asked as the codegen's planner asks them. Any other failure is left to the
    codegen to report."""
    undecided = []
    try:
        folded = keep_boundaries(func, scoped_fold(func))
        build_plan(folded, str(func.attrs["global_symbol"]), target, undecided)
    except Exception:  # noqa: BLE001  the build raises it again with its reason; partitioning goes on
        pass
    if not undecided:
        return []
    fusion = FusionContext(folded, target)
    return [(call, reason, [mate for mate in fusion.kernel_mates(call) if _number(mate) is not None])
            for call, reason in undecided if _number(call) is not None]


def _number(call) -> int | None:
    number = call.op.attrs.get(MATCH_ATTR)
    return None if number is None else int(number)


def _members(call) -> list:
    """The calls of a composite the offload report names: its family's, else its body's root."""
    try:
        return family_of(str(call.op.attrs["Composite"])).parse(call.op.body).members()
    except Exception:  # noqa: BLE001  a body of an unexpected form: the root is enough for the report
        return [call.op.body]


def _mark_loaded_scale(call, ctx: CheckContext):
    """Tell the codegen that the composite's root qnn.quantize divides by its scale in TVM-only."""
    root = call.op.body
    if isinstance(root, relay.Call) and root.op == QUANTIZE \
            and ctx.dequantize_uses.loads_scale(root):
        return _with_attr(call, SCALE_LOADED_ATTR, 1)
    return call


def _keep_loaded_scales_shared(mod, ctx: CheckContext):
    """A qnn.quantize left in TVM divides by its loaded scale only while another kernel still reads
    that constant: the composites reading it stay in TVM with it (else TVM would inline the scale
    and multiply, where TVM-only divides)."""
    inside, groups = set(), set()

    def visit_composites(node):
        if isinstance(node, relay.Function) and node.attrs and node.attrs.get("Composite"):
            relay.analysis.post_order_visit(node.body, inside.add)

    def visit_quantizes(node):
        if node not in inside and isinstance(node, relay.Call) and node.op == QUANTIZE:
            groups.add(ctx.dequantize_uses.scale_group(node))

    relay.analysis.post_order_visit(mod["main"].body, visit_composites)
    relay.analysis.post_order_visit(mod["main"].body, visit_quantizes)
    groups.discard(None)
    if not groups:
        return mod

    def keep(call, _):
        read = set()
        relay.analysis.post_order_visit(call.op.body, lambda e: read.add(
            ctx.dequantize_uses.scale_group(e) if isinstance(e, relay.Call) else None))
        if not read & groups:
            return call
        ctx.rejections.record(_members(call), "reads the rank-0 scale constant of a qnn.quantize left in TVM: "
                              "TVM-only divides by it only while several kernels read it")
        return _inlined(call)

    return _map_composites(mod, keep)


def _keep_stagewise_kernels_together(mod, ctx: CheckContext):
    """Composites TVM-only computes inside a conv kernel that rounds every stage apart stay in TVM,
    with that conv (stagewise.tangled_composites), but for table ops the kernel is known to end after:
    they are marked to have their tables computed as that kernel computes them (stagewise_tables)."""
    tangled = tangled_composites(mod["main"], ctx.target)
    tables = {call.op for call in stagewise_tables(mod["main"], ctx.target)}
    if not tangled and not tables:
        return mod

    def keep(call, _):
        if call.op in tables:
            return _with_attr(call, STAGEWISE_TABLE_ATTR, 1)
        reason = tangled.get(call.op)
        if reason is None:
            return call
        ctx.rejections.record(_members(call), reason)
        return _inlined(call)

    return _map_composites(mod, keep)


def mark_stagewise_tables(func: relay.Function, tables: list) -> relay.Function:
    """``func`` with the table composite calls ``tables`` marked STAGEWISE_TABLE_ATTR (the codegen: those
    its partition shows, stagewise.partition_tables)."""
    if not tables:
        return func
    ops = {call.op for call in tables}
    mod = _map_composites(tvm.IRModule.from_expr(func),
                          lambda call, _: _with_attr(call, STAGEWISE_TABLE_ATTR, 1) if call.op in ops else call)
    return mod["main"]


def _with_attr(call, key: str, value):
    return relay.Call(call.op.with_attr(key, value), call.args, call.attrs, call.type_args, call.span)


def _inlined(call):
    """A composite call as the plain ops of its body, on its arguments."""
    return relay.bind(call.op.body, dict(zip(call.op.params, call.args)))


def _map_composites(mod, rewrite):
    """``mod`` with each composite call ``c`` of main replaced by ``rewrite(c, number)`` (numbers:
    MATCH_ATTR once set, else dataflow order). Iterative: deep networks exceed Python's recursion."""
    main, new = mod["main"], {}

    def visit(node):
        if isinstance(node, relay.Call):
            call = relay.Call(node.op, [new.get(a, a) for a in node.args], node.attrs, node.type_args, node.span)
            if isinstance(node.op, relay.Function) and node.op.attrs and node.op.attrs.get("Composite"):
                call = rewrite(call, int(node.op.attrs.get(MATCH_ATTR, len(new))))
            new[node] = call
        elif isinstance(node, relay.Tuple):
            new[node] = relay.Tuple([new.get(f, f) for f in node.fields], node.span)
        elif isinstance(node, relay.TupleGetItem):
            new[node] = relay.TupleGetItem(new.get(node.tuple_value, node.tuple_value), node.index)

    relay.analysis.post_order_visit(main.body, visit)
    mod["main"] = relay.Function(main.params, new.get(main.body, main.body), None, main.type_params, main.attrs)
    return relay.transform.InferType()(mod)


def refcg_functions(mod):
    """(GlobalVar, Function) pairs of the partitions handed to refcg."""
    return [
        (gv, func)
        for gv, func in mod.functions.items()
        if isinstance(func, relay.Function) and func.attrs and func.attrs.get("Compiler") == COMPILER
    ]


def _tag_target(mod, target: str):
    for gv, func in refcg_functions(mod):
        mod[gv] = func.with_attr(TARGET_ATTR, target)
    return mod
