"""Scoped legalize-and-fold: run inside ``relay.ext.refcg`` on a module holding one partition.

The main pipeline never touches ``Compiler`` functions (FuseOps, FoldConstant, QNN
Legalize all skip them), so the partition arrives with its QNN ops and qparams
intact, and with weights possibly still as ``qnn.quantize(const_fp32)``. Here we:

1. rebuild the function without attributes: FoldConstant refuses to fold inside a
   ``Primitive=1`` function (fold_constant.cc), and the received function has it;
2. InferType;
3. FoldConstant(fold_qnn=True): evaluates every all-constant subgraph, QNN ops
   included (``qnn.quantize(const)``, int32 bias as ``qnn.quantize``, layout ops on
   weights), and leaves every QNN op that has a variable input untouched, so the
   kernel planner still reads their qparams.

No global QNN Legalize/CanonicalizeOps runs: those would lower *every* QNN op.
"""
from __future__ import annotations

import tvm
from tvm import relay


def scope(func: relay.Function) -> tvm.IRModule:
    """An IRModule whose ``main`` is ``func`` without its Primitive/Compiler attributes."""
    bare = relay.Function(func.params, func.body, func.ret_type, func.type_params)
    return relay.transform.InferType()(tvm.IRModule.from_expr(bare))


def legalize_and_fold(mod: tvm.IRModule) -> tvm.IRModule:
    seq = tvm.transform.Sequential(
        [relay.transform.FoldConstant(fold_qnn=True), relay.transform.InferType()]
    )
    with tvm.transform.PassContext(opt_level=3):
        return seq(mod)


def scoped_fold(func: relay.Function) -> relay.Function:
    """The partition's function with every constant subgraph folded to a constant."""
    return legalize_and_fold(scope(func))["main"]
