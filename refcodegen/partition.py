"""``partition_for_refcg``: mark the quantized parts of a Relay module for the refcg codegen."""
from __future__ import annotations

import json

import tvm
from tvm import relay
from tvm.relay.build_module import bind_params_by_name

from .armfuse import tag_boundaries
from .ops import COMPILER, CheckContext, pattern_table
from .splits import split_to_slices

TARGET_ATTR = "RefcgTarget"
REJECTIONS_ATTR = "refcg_rejections"


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
    partition = tvm.transform.Sequential([
        relay.transform.MergeComposite(pattern_table(ctx)),
        relay.transform.AnnotateTarget(COMPILER),
        relay.transform.MergeCompilerRegions(),
        relay.transform.PartitionGraph(),
        relay.transform.InferType(),
    ])
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(prepare_passes(fold_batch_norm, fake_quantization_to_integer))(mod)
        mod = split_to_slices(mod)
        ctx.dequantize_uses.analyze(mod["main"])  # the dequantize check needs each result's consumers
        mod = partition(mod)
    mod = tag_boundaries(mod)
    if target is not None:
        mod = _tag_target(mod, str(target))
    return mod.with_attr(REJECTIONS_ATTR, json.dumps(ctx.rejections.as_dict()))


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
