"""Fuzzing refcg against TVM-only: hypothesis draws random valid QNN chains, bit-exact or it fails.

A chain is plain data (``ChainSpec``: input and a list of op dicts), so a failing case prints as
something that can be pasted into a regression test. ``build_chain`` turns a spec into Relay.
Many independent chains go into ONE module (a tuple output each): one TVM-only and one refcg
build check them all. CI runs a bounded, derandomized number here; ``make fuzz``
(``tools/fuzz.py``) runs thousands with the same strategies.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np
import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
import tvm
from tvm import relay

from conftest import load, run
from models import module
from refcodegen import objcache, offload_report, partition_for_refcg
from refcodegen.numerics import DTYPE_RANGE
from refcodegen.partition import refcg_functions
from test_ops_common import NUMERICS, requantize_config

QDTYPES = ("int8", "uint8")
KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}
# TVM-only's sse4.2 int8 conv/dense (vpmaddubsw) saturates int16 on full-range weights: under the
# float32 target, weights stay where that path is exact (int8 [-63, 63], uint8 shifted by 128).
SMALL_WEIGHTS = {"int8": (-63, 63), "uint8": (65, 191)}


@dataclass
class ChainSpec:
    shape: tuple
    layout: str  # "NCHW", "NHWC", or "" for 2-D
    dtype: str
    scale: float
    zp: int
    ops: list = field(default_factory=list)
    seed: int = 0


# ---- strategies -------------------------------------------------------------------------------

def scales():
    return st.integers(-12, 1).flatmap(lambda e: st.floats(2.0**e, 2.0 ** (e + 1), width=32))


def zero_points(dtype: str):
    lo, hi = DTYPE_RANGE[dtype]
    return st.one_of(st.sampled_from([lo, hi, 0 if dtype == "int8" else 128]), st.integers(lo, hi))


def clips(dtype: str):
    lo, hi = DTYPE_RANGE[dtype]
    return st.one_of(st.none(), st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(sorted).map(tuple))


@st.composite
def requantize_out(draw, dtypes=QDTYPES):
    dtype = draw(st.sampled_from(dtypes))
    return {"out_dtype": dtype, "out_scale": draw(scales()), "out_zp": draw(zero_points(dtype)),
            "rounding": draw(st.sampled_from(["None", "UPWARD", "TONEAREST"])), "clip": draw(clips(dtype))}


# (kh, kw) of the network-geometry convs: 1x1, 3x3, and Inception's factorized 1xN / Nx1
NETWORK_KERNELS = [(1, 1), (1, 1), (3, 3), (3, 3), (1, 3), (3, 1), (1, 7), (7, 1)]


@st.composite
def conv_op(draw, state):
    _, c, h, w = dims(state)
    groups = draw(st.sampled_from(sorted({1, c} | ({c // 2} if c % 2 == 0 and c > 2 else set()))))
    out_c = groups * draw(st.integers(1, max(1, 12 // groups)))
    if draw(st.booleans()):  # random geometry
        kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        dil = (draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2])))
        pads = [draw(st.integers(0, 2)) for _ in range(4)]  # top, left, bottom, right
        strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    else:  # what networks use (and kernels special-case: 1x1 stride 1 unpadded runs pixels in the lanes;
        # Inception's 1xN / Nx1 factorized convs with per-axis "same" padding)
        (kh, kw), strides = draw(st.sampled_from(NETWORK_KERNELS)), draw(st.sampled_from([(1, 1), (2, 2)]))
        dil, pads = (1, 1), [kh // 2, kw // 2, kh // 2, kw // 2]
    # PyTorch's importer pads in an nn.pad in front of the conv (value: the input zero point), which
    # refcg fuses: move some or all of the padding there
    front = None
    if draw(st.integers(0, 2)) == 0:
        front = (draw(st.integers(0, pads[0])), draw(st.integers(0, pads[2])),
                 draw(st.integers(0, pads[1])), draw(st.integers(0, pads[3])))  # (top, bottom, left, right)
        pads = [pads[0] - front[0], pads[1] - front[2], pads[2] - front[1], pads[3] - front[3]]
    # grow padding until the dilated kernel fits the padded input
    fh, fw = (0, 0) if front is None else (front[0] + front[1], front[2] + front[3])
    while h + fh + pads[0] + pads[2] < (kh - 1) * dil[0] + 1:
        pads[2] += 1
    while w + fw + pads[1] + pads[3] < (kw - 1) * dil[1] + 1:
        pads[3] += 1
    w_dtype = draw(st.sampled_from(QDTYPES))
    return {"op": "conv2d", "out_c": out_c, "kernel": (kh, kw), "strides": strides, "pad": front,
            "dilation": dil, "padding": tuple(pads), "groups": groups, "w_dtype": w_dtype,
            "kernel_zp": draw(st.one_of(st.just(0 if w_dtype == "int8" else 128), zero_points(w_dtype))),
            "per_channel": draw(st.booleans()), "bias": draw(st.sampled_from([None, 1 << 10, 1 << 16, 1 << 24])),
            "bias_form": draw(st.sampled_from(["bias_add", "add"])), **draw(requantize_out())}


@st.composite
def dense_op(draw, state, last: bool):
    w_dtype = draw(st.sampled_from(QDTYPES))
    op = {"op": "dense", "units": draw(st.integers(1, 24)), "w_dtype": w_dtype,
          "kernel_zp": draw(st.one_of(st.just(0 if w_dtype == "int8" else 128), zero_points(w_dtype))),
          "per_channel": draw(st.booleans()), "bias": draw(st.sampled_from([None, 1 << 10, 1 << 20]))}
    if last and draw(st.booleans()):
        return {**op, "out_dtype": "int32"}  # int32 accumulator kept as the graph output
    return {**op, **draw(requantize_out())}


@st.composite
def binary_op(draw, state):
    shape = state.shape
    keep = draw(st.sampled_from([0] + 4 * list(range(1, len(shape) + 1))))  # broadcast: drop leading dims, 1s
    other = tuple(d if draw(st.booleans()) else 1 for d in shape[len(shape) - keep:])
    flip = draw(st.booleans())  # the chain's tensor as rhs
    return {"op": "binary", "kind": draw(st.sampled_from(["add", "subtract", "mul"])), "other": other,
            "flip": flip, "const": draw(st.booleans()), "o_scale": draw(scales()),
            "o_zp": draw(zero_points(state.dtype)), "out_scale": draw(scales()),
            "out_zp": draw(zero_points(state.dtype)), "clip": draw(clips(state.dtype))}


@st.composite
def pool_op(draw, state):
    kind = draw(st.sampled_from(["max", "avg", "global"]))
    _, _, h, w = dims(state)
    if kind == "global":
        return {"op": "pool", "kind": kind}
    size = (draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w))))
    pads = tuple(draw(st.integers(0, k - 1)) for k in size for _ in range(2))  # (kh-1 max) per side
    return {"op": "pool", "kind": kind, "size": size, "strides": (draw(st.integers(1, 2)), draw(st.integers(1, 2))),
            "padding": (pads[0], pads[2], pads[1], pads[3]), "ceil_mode": draw(st.booleans()),
            "count_include_pad": draw(st.booleans())}


@st.composite
def requantize_op(draw, state):
    axis = draw(st.integers(0, len(state.shape) - 1))
    return {"op": "requantize", "axis": axis, "per_channel": draw(st.booleans()), **draw(requantize_out())}


@st.composite
def concat_op(draw, state):
    axis = draw(st.integers(0, len(state.shape) - 1))
    return {"op": "concat", "axis": axis, "extra": draw(st.integers(1, 4)), "o_scale": draw(scales()),
            "o_zp": draw(zero_points(state.dtype)), "out_scale": draw(scales()), "out_zp": draw(zero_points(state.dtype))}


def dims(state) -> tuple[int, int, int, int]:
    """(n, c, h, w) of a 4-D state."""
    n, a, b, c = state.shape
    return (n, a, b, c) if state.layout == "NCHW" else (n, c, a, b)


# TVM-only inlines a fused chain of requantizing ops (qnn binary ops, requantize) into one expression,
# and under TONEAREST / float64 each step repeats its input: the build grows exponentially with the
# chain (measured: one such op ~2 s, req->add ~11 s, req->req->req > 250 s). Under those numerics a
# fused group holds at most this many of them; a conv/dense starts a new group with its own requantize.
REQUANTIZING_OPS_PER_GROUP = {"tonearest": 1, "float64": 1}


@st.composite
def chains(draw, max_ops: int = 3, numerics: str | None = None):
    limit = REQUANTIZING_OPS_PER_GROUP.get(numerics, max_ops)
    fused = 0  # requantizing ops in the current fused group
    dtype = draw(st.sampled_from(QDTYPES))
    if draw(st.integers(0, 3)) == 0:
        shape, layout = (draw(st.integers(1, 3)), draw(st.integers(1, 40))), ""
    else:
        layout = draw(st.sampled_from(["NCHW", "NHWC"]))
        sizes = st.integers(1, 10) | st.sampled_from([13, 17])  # odd network sizes, past the 1x7 kernels
        n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 12)), draw(sizes), draw(sizes)
        shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    spec = ChainSpec(shape, layout, dtype, draw(scales()), draw(zero_points(dtype)), seed=draw(st.integers(0, 2**31)))
    state = ChainSpec(shape, layout, dtype, spec.scale, spec.zp)
    count = draw(st.integers(1, max_ops))
    for i in range(count):
        last = i == count - 1
        options = ["concat", "dense"] + ["binary", "requantize"] * (fused < limit)
        options += ["conv2d", "conv2d", "pool"] if state.layout else []
        kind = draw(st.sampled_from(options))
        fused = 1 if kind in ("conv2d", "dense") else fused + (kind in ("binary", "requantize"))
        op = {
            "conv2d": lambda: conv_op(state),
            "dense": lambda: dense_op(state, last),
            "binary": lambda: binary_op(state),
            "pool": lambda: pool_op(state),
            "requantize": lambda: requantize_op(state),
            "concat": lambda: concat_op(state),
        }[kind]()
        spec.ops.append(draw(op))
        _, state = apply_op(None, state, spec.ops[-1], None, None)
        if state.dtype == "int32":
            break
    return spec


# ---- building -----------------------------------------------------------------------------------

def _c(value, dtype="float32"):
    return relay.const(np.array(value, dtype=dtype))


def _weight(rng, shape, dtype, small: bool):
    lo, hi = SMALL_WEIGHTS[dtype] if small else DTYPE_RANGE[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _bias(rng, n, magnitude):
    return rng.integers(-magnitude, magnitude + 1, n).astype("int32")


def _requantize(y, in_scale, in_zp, op, axis):
    y = relay.qnn.op.requantize(y, relay.const(np.asarray(in_scale, "float32")), _c(in_zp, "int32"),
                                _c(op["out_scale"]), _c(op["out_zp"], "int32"), axis=axis,
                                rounding=op["rounding"], out_dtype=op["out_dtype"])
    return relay.clip(y, *op["clip"]) if op["clip"] else y


def _out_state(state, shape, op, layout=None):
    return ChainSpec(tuple(shape), state.layout if layout is None else layout, op["out_dtype"],
                     op.get("out_scale", 1.0), op.get("out_zp", 0))


def _pool_out(size, k, s, pad_a, pad_b, ceil):
    span = size + pad_a + pad_b - k
    return (span + (s - 1 if ceil else 0)) // s + 1


def apply_op(y, state, op, ctx, name):
    """(expr, new state) for ``op`` applied to ``y``; with ``y=None`` only the state is computed."""
    kind, build = op["op"], y is not None
    rng, small = (ctx["rng"], ctx["small"]) if build else (None, False)
    if kind == "conv2d":
        n, c, h, w = dims(state)
        front = op.get("pad")  # (top, bottom, left, right) of an nn.pad in front, or None
        if front is not None:
            h, w = h + front[0] + front[1], w + front[2] + front[3]
            if build:
                hw = [tuple(front[:2]), tuple(front[2:])]
                widths = [(0, 0), (0, 0), *hw] if state.layout == "NCHW" else [(0, 0), *hw, (0, 0)]
                y = relay.nn.pad(y, widths, pad_value=float(state.zp))
        (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = op["kernel"], op["strides"], op["dilation"], op["padding"]
        oh, ow = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1, (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
        out_shape = (n, op["out_c"], oh, ow) if state.layout == "NCHW" else (n, oh, ow, op["out_c"])
        new = _out_state(state, out_shape, op)
        if not build:
            return None, new
        kl = KERNEL_LAYOUT[state.layout]
        cg = c // op["groups"]
        wshape = (op["out_c"], cg, kh, kw) if kl == "OIHW" else (kh, kw, cg, op["out_c"])
        w_scale = rng.uniform(0.001, 0.03, op["out_c"]) if op["per_channel"] else np.array(0.01)
        w_scale = w_scale.astype("float32")
        y = relay.qnn.op.conv2d(y, relay.const(_weight(rng, wshape, op["w_dtype"], small)), _c(state.zp, "int32"),
                                _c(op["kernel_zp"], "int32"), _c(state.scale), relay.const(w_scale),
                                kernel_size=(kh, kw), channels=op["out_c"], strides=(sh, sw), padding=(pt, pl, pb, pr),
                                dilation=(dh, dw), groups=op["groups"], data_layout=state.layout, kernel_layout=kl)
        axis = state.layout.index("C")
        if op["bias"]:
            bias = _bias(rng, op["out_c"], op["bias"])
            if op["bias_form"] == "bias_add":
                y = relay.nn.bias_add(y, relay.const(bias), axis=axis)
            else:
                y = relay.add(y, relay.const(bias.reshape((-1, 1, 1) if state.layout == "NCHW" else (-1,))))
        return _requantize(y, np.float32(state.scale) * w_scale, 0, op, axis), new
    if kind == "dense":
        features = int(np.prod(state.shape[1:]))
        new = _out_state(state, (state.shape[0], op["units"]), op, layout="")
        if not build:
            return None, new
        if len(state.shape) != 2:
            y = relay.nn.batch_flatten(y)
        w_scale = (rng.uniform(0.001, 0.03, op["units"]) if op["per_channel"] else np.array(0.01)).astype("float32")
        y = relay.qnn.op.dense(y, relay.const(_weight(rng, (op["units"], features), op["w_dtype"], small)),
                               _c(state.zp, "int32"), _c(op["kernel_zp"], "int32"), _c(state.scale),
                               relay.const(w_scale), units=op["units"])
        if op["bias"]:
            y = relay.nn.bias_add(y, relay.const(_bias(rng, op["units"], op["bias"])), axis=1)
        if op["out_dtype"] == "int32":
            return y, new
        return _requantize(y, np.float32(state.scale) * w_scale, 0, op, 1), new
    if kind == "binary":
        other = tuple(op["other"])
        shape = np.broadcast_shapes(state.shape, other)
        new = ChainSpec(tuple(shape), state.layout if len(shape) == len(state.shape) else "", state.dtype,
                        op["out_scale"], op["out_zp"])
        if not build:
            return None, new
        value = rng.integers(*DTYPE_RANGE[state.dtype], size=other, endpoint=True).astype(state.dtype)
        if op["const"]:
            b = relay.const(value)
        else:
            b = relay.var(f"{name}_b{len(ctx['inputs'])}", shape=other, dtype=state.dtype)
            ctx["params"].append(b)
            ctx["inputs"][b.name_hint] = value
        lhs, rhs = ((b, op["o_scale"], op["o_zp"]), (y, state.scale, state.zp))[:: -1 if not op["flip"] else 1]
        fn = {"add": relay.qnn.op.add, "subtract": relay.qnn.op.subtract, "mul": relay.qnn.op.mul}[op["kind"]]
        y = fn(lhs[0], rhs[0], _c(lhs[1]), _c(lhs[2], "int32"), _c(rhs[1]), _c(rhs[2], "int32"),
               _c(op["out_scale"]), _c(op["out_zp"], "int32"))
        return (relay.clip(y, *op["clip"]) if op["clip"] else y), new
    if kind == "pool":
        n, c, h, w = dims(state)
        if op["kind"] == "global":
            oh = ow = 1
        else:
            (kh, kw), (sh, sw), (pt, pl, pb, pr) = op["size"], op["strides"], op["padding"]
            oh = _pool_out(h, kh, sh, pt, pb, op["ceil_mode"])
            ow = _pool_out(w, kw, sw, pl, pr, op["ceil_mode"])
        out_shape = (n, c, oh, ow) if state.layout == "NCHW" else (n, oh, ow, c)
        new = ChainSpec(out_shape, state.layout, state.dtype, state.scale, state.zp)
        if not build:
            return None, new
        if op["kind"] == "max":
            return relay.nn.max_pool2d(y, op["size"], op["strides"], padding=op["padding"], layout=state.layout,
                                       ceil_mode=op["ceil_mode"]), new
        wide = relay.cast(y, "int32")
        if op["kind"] == "global":
            pooled = relay.nn.global_avg_pool2d(wide, layout=state.layout)
        else:
            pooled = relay.nn.avg_pool2d(wide, op["size"], op["strides"], padding=op["padding"], layout=state.layout,
                                         ceil_mode=op["ceil_mode"], count_include_pad=op["count_include_pad"])
        return relay.cast(pooled, state.dtype), new
    if kind == "requantize":
        new = _out_state(state, state.shape, op)
        if not build:
            return None, new
        channels = state.shape[op["axis"]]
        in_scale = (rng.uniform(0.5, 2.0, channels) * state.scale if op["per_channel"] else np.array(state.scale))
        return _requantize(y, in_scale.astype("float32"), state.zp, op, op["axis"]), new
    if kind == "concat":
        other = list(state.shape)
        other[op["axis"]] = op["extra"]
        shape = list(state.shape)
        shape[op["axis"]] += op["extra"]
        new = ChainSpec(tuple(shape), state.layout, state.dtype, op["out_scale"], op["out_zp"])
        if not build:
            return None, new
        b = relay.var(f"{name}_b{len(ctx['inputs'])}", shape=other, dtype=state.dtype)
        ctx["params"].append(b)
        ctx["inputs"][b.name_hint] = rng.integers(*DTYPE_RANGE[state.dtype], size=other, endpoint=True).astype(state.dtype)
        y = relay.qnn.op.concatenate(relay.Tuple([y, b]), relay.Tuple([_c(state.scale), _c(op["o_scale"])]),
                                     relay.Tuple([_c(state.zp, "int32"), _c(op["o_zp"], "int32")]),
                                     _c(op["out_scale"]), _c(op["out_zp"], "int32"), axis=op["axis"])
        return y, new
    raise ValueError(f"unknown fuzz op {kind}")


def full_range(rng, shape, dtype):
    """Random data with the dtype's extremes planted: the values that expose saturation and wrap."""
    lo, hi = DTYPE_RANGE[dtype]
    data = rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    flat = data.reshape(-1)
    flat[rng.random(flat.size) < 0.15] = lo
    flat[rng.random(flat.size) < 0.15] = hi
    return data


def build_chain(spec: ChainSpec, ctx: dict, name: str):
    """Relay expression of ``spec``; adds its input vars and data to ``ctx``."""
    ctx["rng"] = np.random.default_rng(spec.seed)
    x = relay.var(f"{name}_x", shape=spec.shape, dtype=spec.dtype)
    ctx["params"].append(x)
    ctx["inputs"][x.name_hint] = full_range(ctx["rng"], spec.shape, spec.dtype)
    y, state = x, spec
    for op in spec.ops:
        y, state = apply_op(y, state, op, ctx, name)
    return y


def build_batch(specs: list[ChainSpec], numerics: str):
    """One module with every chain as one output of a tuple; returns (module, inputs)."""
    ctx = {"params": [], "inputs": {}, "small": NUMERICS[numerics][0] != "llvm"}  # x86 int8 schedules saturate
    outputs = [build_chain(spec, ctx, f"c{i}") for i, spec in enumerate(specs)]
    return module(ctx["params"], relay.Tuple(outputs)), ctx["inputs"]


def merge_partitions(mod):
    """One refcg function per dependency level of the partitions ``main`` calls (fuzz speed).

    Merged, 50 chains in 40 partitions run through the same plan and kernels as one multi-output
    partition: one codegen call and one C file instead of 40 (this was 100 s of export when each
    partition's C still held the whole core; now it saves TVM's per-partition overhead). A partition's level is the longest chain of partitions its inputs come from (through
    ops left in TVM), so partitions of one level never feed each other and merge safely.
    Multi-output partitions stay as they are.
    """
    main = mod["main"]
    ours = dict(refcg_functions(mod))
    level = {}

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.GlobalVar) and node.op in ours:
            below = []
            relay.analysis.post_order_visit(relay.Tuple(list(node.args)), lambda n: below.append(level.get(n, -1)))
            level[node] = 1 + max(below, default=-1)

    relay.analysis.post_order_visit(main.body, visit)
    groups = {}
    for call, depth in level.items():
        if not isinstance(mod[call.op].body, relay.Tuple):
            groups.setdefault(depth, []).append(call)
    groups = {depth: calls for depth, calls in groups.items() if len(calls) > 1}
    if not groups:
        return mod
    dropped = {call.op for calls in groups.values() for call in calls} | {mod.get_global_var("main")}
    merged_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in dropped}, attrs=mod.attrs)
    names = {depth: f"tvmgen_default_refcg_fuzz_merged_{depth}" for depth in groups}
    for depth, calls in groups.items():
        funcs = [mod[call.op] for call in calls]
        merged = relay.Function([p for f in funcs for p in f.params], relay.Tuple([f.body for f in funcs]))
        for key in ("Primitive", "Inline", "Compiler"):
            merged = merged.with_attr(key, funcs[0].attrs[key])
        merged_mod[relay.GlobalVar(names[depth])] = merged.with_attr("global_symbol", names[depth])
    merged_mod = relay.transform.InferType()(merged_mod)  # a call's GlobalVar must carry its type
    slot = {call: (depth, i) for depth, calls in groups.items() for i, call in enumerate(calls)}

    class Swap(relay.ExprMutator):
        def __init__(self):
            super().__init__()
            self.whole = {}

        def visit_call(self, call):
            if call not in slot:
                return super().visit_call(call)
            depth, index = slot[call]
            if depth not in self.whole:
                args = [self.visit(a) for c in groups[depth] for a in c.args]
                self.whole[depth] = relay.Call(merged_mod.get_global_var(names[depth]), args)
            return relay.TupleGetItem(self.whole[depth], index)

    merged_mod["main"] = relay.Function(main.params, Swap().visit(main.body), main.ret_type)
    return relay.transform.InferType()(merged_mod)


def tvm_only_undefined(spec: ChainSpec) -> str | None:
    """Why TVM-only's output for ``spec`` is undefined, or None: such a chain is counted, not compared.

    avg_pool2d with ceil_mode and count_include_pad divides by the window's extent clipped to the
    padded input, which is <= 0 for a last window entirely outside it (refcg keeps that pool in TVM,
    so the garbage flows into whatever refcg computes next: fuzz-found, tests/test_fuzz_regressions.py).
    """
    state = spec
    for op in spec.ops:
        _, new = apply_op(None, state, op, None, None)
        if op["op"] == "pool" and op["kind"] == "avg" and op["ceil_mode"] and op["count_include_pad"]:
            (_, _, h, w), (_, _, oh, ow) = dims(state), dims(new)
            (sh, sw), (pt, pl, pb, pr) = op["strides"], op["padding"]
            if (oh - 1) * sh - pt > h + pb - 1 or (ow - 1) * sw - pl > w + pr - 1:
                return "avg_pool2d ceil_mode window entirely outside the padded input: TVM divides by <= 0"
        state = new
    return None


class TvmOnlyBuildError(Exception):
    """The reference itself cannot be built: no verdict on refcg for that chain."""


def tvm_only_build(specs: list[ChainSpec], numerics: str):
    """(TVM-only library, module, inputs) of ``specs``; call it inside the numerics' requantize_config."""
    mod, inputs = build_batch(specs, numerics)
    try:
        with tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=NUMERICS[numerics][0]), mod, inputs
    except tvm.TVMError as error:
        lines = str(error).strip().splitlines()
        at = next((i for i, line in enumerate(lines) if "Error:" in line), len(lines) - 1)
        raise TvmOnlyBuildError(" ".join(lines[at: at + 2])) from error  # the message and its first detail
    except IndexError as error:  # TVM 0.19's x86 int8 conv schedule on some shapes (autotvm define_split)
        raise TvmOnlyBuildError(repr(error)) from error


def isolate_unbuildable(specs: list[ChainSpec], numerics: str, error: str) -> tuple[list, list]:
    """Bisects ``specs`` (which TVM-only cannot build). Returns ([(spec, error)] of the chains it cannot
    build, [(specs, lib, module, inputs)] of the parts it built, in order): the built parts are kept so the
    batch is not built a second time."""
    if len(specs) == 1:
        return [(specs[0], error)], []
    bad, built = [], []
    for half in (specs[: len(specs) // 2], specs[len(specs) // 2:]):
        try:
            built.append((half, *tvm_only_build(half, numerics)))
        except TvmOnlyBuildError as half_error:
            half_bad, half_built = isolate_unbuildable(half, numerics, str(half_error))
            bad, built = bad + half_bad, built + half_built
    return bad, built


class _Phases:
    """Seconds per phase, added into ``totals`` (a Counter) when given: ``make fuzz`` prints them."""

    def __init__(self, totals):
        self.totals, self.last = totals, time.perf_counter()

    def __call__(self, phase: str):
        now = time.perf_counter()
        if self.totals is not None:
            self.totals[phase] += now - self.last
        self.last = now


def _export_and_run(lib, path, inputs, phase, who: str):
    """export_library + load + run, timed as two phases."""
    lib.export_library(str(path), fcompile=objcache.create_shared)  # the core compiles once per process
    phase(f"{who} export_library")
    outputs = run(load(str(path)), inputs)
    phase("load + run")
    return outputs


def _nothing(undefined: list, unbuildable: list) -> dict:
    return {"cases": 0, "mismatches": [], "undefined": undefined, "unbuildable": unbuildable, "outputs": [],
            "partitions": 0, "offloaded": 0, "stayed": []}


def check_batch(specs: list[ChainSpec], numerics: str, tmp_path, merge: bool = False, timings=None) -> dict:
    """Build TVM-only and refcg, compare every chain; returns counts and the mismatching specs."""
    phase = _Phases(timings)
    target, config = NUMERICS[numerics]
    # not even built: running TVM-only's division by zero can trap (SIGFPE) and kill the process
    undefined = [(spec, tvm_only_undefined(spec)) for spec in specs if tvm_only_undefined(spec)]
    specs = [spec for spec in specs if not tvm_only_undefined(spec)]
    if not specs:
        return _nothing(undefined, [])
    with requantize_config(target, config):
        unbuildable = []  # TVM's bugs, not refcg's: those chains are counted apart and left out
        try:
            built = [(specs, *tvm_only_build(specs, numerics))]
        except TvmOnlyBuildError as error:
            phase("TVM-only relay.build")
            unbuildable, built = isolate_unbuildable(specs, numerics, str(error))
            phase("isolating chains TVM-only cannot build")
            if not built:
                return _nothing(undefined, unbuildable)
        phase("TVM-only relay.build")
        reference = [out for i, (_, lib, _, inputs) in enumerate(built)
                     for out in _export_and_run(lib, tmp_path / f"tvm_only{i}.so", inputs, phase, "TVM-only")]
        specs = [spec for part, *_ in built for spec in part]
        # a chain's inputs and weights come from its own seed, so the parts' reference outputs line up
        # with one module of all the chains TVM-only could build
        mod, inputs = built[0][2:] if len(built) == 1 else build_batch(specs, numerics)
        partitioned = partition_for_refcg(mod)
        if merge:
            partitioned = merge_partitions(partitioned)
        phase("partition_for_refcg (+merge)")
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(partitioned, target=target)
        phase("refcg relay.build")
        actual = _export_and_run(lib, tmp_path / "refcg.so", inputs, phase, "refcg")
    assert len(reference) == len(actual) == len(specs)
    report = offload_report(partitioned)
    mismatches = []
    for spec, want, got in zip(specs, reference, actual):
        if want.dtype != got.dtype or want.shape != got.shape or not np.array_equal(want, got):
            diff = np.abs(want.astype(np.int64) - got.astype(np.int64)).max() if want.shape == got.shape else None
            mismatches.append((spec, diff))
    return {"cases": len(specs), "mismatches": mismatches, "undefined": undefined,
            "unbuildable": unbuildable,
            "outputs": list(zip(reference, actual)),
            "partitions": len(refcg_functions(partitioned)),
            "offloaded": sum(report.offloaded_ops.values()), "stayed": report.stayed}


NUMERICS_NAMES = st.sampled_from(list(NUMERICS))


def batches(size: int, numerics=NUMERICS_NAMES):
    """(specs, numerics): ``size`` chains shaped for the numerics they are built under."""
    return numerics.flatmap(lambda name: st.tuples(
        st.lists(chains(numerics=name), min_size=size, max_size=size), st.just(name)))


# A hypothesis run of >= 20 examples spends its first max_examples/10 (up to 50) on near-minimal data
# (its small_example_cap: here, builds of one-op chains), and every run starts with its all-minimal
# example. So: many runs of RUN_EXAMPLES (below 10 the small phase is empty), duplicates dropped.
RUN_EXAMPLES = 9


def fuzz_batches(cases: int, batch: int, seed: int, numerics=NUMERICS_NAMES, chunk: int = 25):
    """Yields (specs, numerics): ``cases`` distinct random chains, ~``batch`` per build.

    Hypothesis draws ``chunk`` chains at a time (it overruns its choice buffer on ~100 and then
    yields only the minimal example); chunks drawn for the same numerics are pooled into one build.
    """
    pending, seen = {}, set()
    for run_index in range(10**6):
        if len(seen) >= cases:
            break
        drawn = []

        @settings(max_examples=RUN_EXAMPLES, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @hypothesis.seed(seed * 10**6 + run_index)
        @given(example=batches(min(chunk, batch), numerics))
        def collect(example):
            drawn.append(example)

        collect()
        for specs, name in drawn:
            fresh = {(name, repr(spec)): spec for spec in specs if (name, repr(spec)) not in seen}
            fresh = dict(list(fresh.items())[: cases - len(seen)])
            seen.update(fresh)
            pending.setdefault(name, []).extend(fresh.values())
            if len(pending[name]) >= batch:
                yield pending.pop(name), name
    for name, specs in pending.items():  # the last, partial builds
        if specs:
            yield specs, name


# ---- the bounded CI run -------------------------------------------------------------------------

CI_CHAINS = 6  # per numerics: one build each


def test_random_chains_match_tvm(tmp_path):
    """24 distinct random chains, one merged build of 6 per numerics (the fixed cost of a build,
    g++ of the core above all, is what bounds this). Derandomized by a fixed seed; no shrinking
    (each step is two builds): a failure prints the spec to paste into test_fuzz_regressions.py."""
    for name in NUMERICS:
        [(specs, numerics)] = fuzz_batches(CI_CHAINS, CI_CHAINS, seed=0, numerics=st.just(name), chunk=CI_CHAINS)
        (tmp_path / name).mkdir()
        result = check_batch(specs, numerics, tmp_path / name, merge=True)
        assert len(specs) == CI_CHAINS
        assert result["cases"] + len(result["undefined"]) + len(result["unbuildable"]) == CI_CHAINS
        assert result["cases"] >= CI_CHAINS - 2, result  # TVM-only's failures must not hollow the test out
        assert not result["mismatches"], "\n".join(f"{numerics}: {spec!r} max diff {d}"
                                                    for spec, d in result["mismatches"])


def fused_pad_convs(specs) -> dict:
    """Counts of the conv forms issue 19 was about among ``specs``' ops."""
    convs = [op for spec in specs for op in spec.ops if op["op"] == "conv2d"]
    front = [op for op in convs if op.get("pad")]
    return {"convs": len(convs), "nn.pad in front": len(front),
            "1xN/Nx1 behind an nn.pad": sum(1 in op["kernel"] and max(op["kernel"]) > 1 for op in front),
            "asymmetric nn.pad": sum(op["pad"][0] != op["pad"][1] or op["pad"][2] != op["pad"][3] for op in front)}


def test_chains_draw_convs_behind_an_nn_pad():
    """The strategies draw what PyTorch's importer emits (issue 19): an nn.pad in front of 1xN / Nx1
    convs, symmetric and not. Drawing only, no build."""
    specs = [spec for batch, _ in fuzz_batches(200, 50, seed=0) for spec in batch]
    counts = fused_pad_convs(specs)
    assert len(specs) == 200
    assert counts["1xN/Nx1 behind an nn.pad"] >= 5 and counts["asymmetric nn.pad"] >= 5, counts


def test_make_fuzz_adds_up_its_processes(tmp_path):
    """``tools/fuzz.py --jobs 2`` (what ``make fuzz`` runs on two cores): both seeds run, and the
    summary counts every chain of both."""
    tool = Path(__file__).resolve().parent.parent / "tools" / "fuzz.py"
    done = subprocess.run([sys.executable, str(tool), "--cases", "5", "--batch", "2", "--seed", "3", "--jobs", "2",
                           "--failures", str(tmp_path / "failures.jsonl"), "--summary", str(tmp_path / "summary.json")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[seed 3," in done.stdout and "[seed 4," in done.stdout
    totals = json.loads((tmp_path / "summary.json").read_text())["totals"]
    assert totals["mismatches"] == 0 and "processes that died" not in totals
    assert totals["cases"] + totals["chains TVM-only leaves undefined (not compared)"] \
        + totals["chains TVM-only cannot build (not compared)"] == 5
