"""Random valid QNN chains for fuzzing refcg against TVM-only (hypothesis strategies, Relay building).

A chain is plain data (``ChainSpec``: input and a list of op dicts), so a failing case prints as
something that can be pasted into a regression test. ``build_chain`` turns a spec into Relay.
Many independent chains go into ONE module (a tuple output each): one TVM-only and one refcg
build check them all (``fuzzing.check``). The draws cover every family refcg offloads and the glue
between them (``families`` names what a chain holds); ``tests/test_fuzz.py`` proves each is drawn.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tvm import relay

from arm.host import TARGET_DOTPROD, TARGET_NEON
from models import module
from refcodegen import resize
from refcodegen.numerics import DTYPE_RANGE
from refcodegen.softmax import overflow_reason, x0_of
from test_ops_common import NUMERICS

# aarch64 numerics (make fuzz-arm): built on x86, run on the emulated host under this QEMU CPU
ARM_NUMERICS = {"aarch64-dotprod": (TARGET_DOTPROD, {}), "aarch64-neon": (TARGET_NEON, {})}
ARM_CPU = {"aarch64-dotprod": "max", "aarch64-neon": "cortex-a53"}
ALL_NUMERICS = {**NUMERICS, **ARM_NUMERICS}
QDTYPES = ("int8", "uint8")
KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}
# TVM-only's sse4.2 int8 conv/dense (vpmaddubsw) saturates int16 on full-range weights: under the
# float32 target, weights stay where that path is exact (int8 [-63, 63], uint8 shifted by 128).
SMALL_WEIGHTS = {"int8": (-63, 63), "uint8": (65, 191)}
SATURATING_NUMERICS = ("float32", "float32-nofma")


@dataclass
class ChainSpec:
    shape: tuple
    layout: str  # "NCHW", "NHWC", or "" for 2-D
    dtype: str
    scale: float
    zp: int
    ops: list = field(default_factory=list)
    seed: int = 0
    shared: bool = False  # equal rank-0 float constants are one Constant (PyTorch's importer shares qparams)


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
    return {**qparams_out(draw, dtype),
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
            "bias_form": draw(st.sampled_from(["bias_add", "add"])),
            # sometimes requantized to int16, or the int32 accumulator kept (requantized, moved... later)
            **(draw(requantize_out(QDTYPES * 3 + ("int16",))) if draw(st.integers(0, 7)) else {"out_dtype": "int32"})}


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
def batch_matmul_op(draw, state, last: bool):
    """qnn.batch_matmul of the chain's tensor viewed as (n, m, k) with a second run-time operand: a new
    input of batch n or 1 (broadcast), or the tensor itself (x . x^T)."""
    features = math.prod(state.shape[1:])
    m = draw(st.sampled_from([d for d in range(1, min(features, 24) + 1) if features % d == 0]))
    form = draw(st.sampled_from(["input", "broadcast", "self"]))
    y_dtype = state.dtype if form == "self" else draw(st.sampled_from(QDTYPES))
    op = {"op": "batch_matmul", "form": form, "m": m, "n": m if form == "self" else draw(st.integers(1, 20)),
          "y_dtype": y_dtype, "y_zp": state.zp if form == "self" else draw(zero_points(y_dtype)),
          "y_scale": state.scale if form == "self" else draw(scales()), "per_channel": draw(st.booleans())}
    if last and draw(st.booleans()):
        return {**op, "out_dtype": "int32"}  # int32 accumulator kept as the graph output
    return {**op, **draw(requantize_out())}


@st.composite
def binary_op(draw, state):
    shape = state.shape
    # broadcast: drop leading dims (all: a rank-0 operand, TFLite's constants), set some to 1
    keep = draw(st.sampled_from([0] * 2 + 4 * list(range(1, len(shape) + 1))))
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
    return {"op": "requantize", "axis": axis, "per_channel": draw(st.booleans()),
            **draw(requantize_out(QDTYPES * 3 + WIDE))}  # to and from int16 / int32


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


# The families beyond conv/dense/binary/pool/requantize/concat: the two requantizing ones share one
# option among the requantizing ops, the rest two options, so conv and dense chains stay the majority;
# data movement (15 ops) weighs more.
REQUANTIZING_GLUE = ("lut", "lut", "lut", "lut", "softmax", "softmax")  # 15 table forms, 2 softmax forms
GLUE = ("qdq", "reduce", "copy", "copy", "copy")
LUT_FORMS = ("qnn.sigmoid", "qnn.tanh", "qnn.hardswish", "qnn.leaky_relu",  # qnn ops TVM turns into tables
             "qnn.exp", "qnn.log", "qnn.abs",
             "sigmoid", "tanh", "leaky_relu", "tflite_hardswish", "pytorch_hardswish", "onnx_hardswish",
             "pytorch_hardsigmoid", "onnx_hardsigmoid")
COPY_OPS = ("cast", "reshape", "squeeze", "expand_dims", "batch_flatten", "transpose", "layout_transform",
            "strided_slice", "split", "pad", "depth_to_space", "resize", "clip", "maximum", "minimum")
WIDE = ("int16", "int32")


def wide_zero_points():
    """int16/int32 zero points: small, as real int16 activations (and no int32 wrap in TVM's add)."""
    return st.one_of(st.just(0), st.integers(-300, 300))


def qparams_out(draw, dtype: str) -> dict:
    zp = draw(wide_zero_points() if dtype in WIDE else zero_points(dtype))
    return {"out_dtype": dtype, "out_scale": draw(scales()), "out_zp": zp}


@st.composite
def lut_op(draw, state):
    form = draw(st.sampled_from(LUT_FORMS))
    # the qnn ops keep the input dtype; the dequantize -> f -> quantize forms may change it
    out_dtype = state.dtype if form.startswith("qnn.") else draw(st.sampled_from(QDTYPES))
    # sigmoid / tanh: often TFLite's fixed output scales, else random
    scale = st.one_of(scales(), st.sampled_from([1 / 256, 1 / 128]))
    return {"op": "lut", "form": form, "alpha": draw(st.sampled_from([0.01, 0.1, 0.2])),
            **qparams_out(draw, out_dtype), "out_scale": draw(scale)}


@st.composite
def softmax_op(draw, state):
    """qnn.softmax (int8: TVM's integer algorithm), or dequantize -> nn.softmax (last axis) -> quantize."""
    if state.dtype == "int8" and draw(st.booleans()):
        # qnn.softmax reads its input at its own scale: TVM's canonicalization requires <= 1
        in_scale = draw(st.integers(-12, -1).flatmap(lambda e: st.floats(2.0**e, 2.0 ** (e + 1), width=32)))
        return {"op": "softmax", "form": "qnn", "in_scale": in_scale, **qparams_out(draw, "int8")}
    return {"op": "softmax", "form": "float", **qparams_out(draw, draw(st.sampled_from(QDTYPES)))}


@st.composite
def axis_qparams(draw, state, prefix: str) -> dict:
    """Per-tensor or per-axis (scales and zero points per channel, made from the chain's seed) qparams."""
    per_axis = draw(st.booleans())
    return {f"{prefix}axis": draw(st.integers(-1, len(state.shape) - 1)) if per_axis else -1,
            f"{prefix}per_axis": per_axis}


@st.composite
def qdq_op(draw, state):
    """qnn.dequantize -> qnn.quantize: ONNX QDQ boundaries between layers, per tensor or per axis; or
    with a float op TVM computes between them (PyTorch's dequantize -> mean -> quantize)."""
    spatial = len(state.shape) == 4
    between = draw(st.sampled_from(["", "", "nn.relu"] + ["mean"] * spatial + ["resize"] * (spatial and bool(state.layout))))
    op = {"op": "qdq", **draw(axis_qparams(state, "dq_")), **draw(axis_qparams(state, "q_")),
          **qparams_out(draw, draw(st.sampled_from(QDTYPES))), "between": between}
    if between == "resize":  # PyTorch's quantized nearest F.interpolate: mostly the same qparams both sides
        _, _, h, w = dims(state)
        op["size"] = [draw(st.integers(1, 2 * d + 3)) for d in (h, w)]
        if state.dtype in QDTYPES and draw(st.integers(0, 3)):
            op.update(dq_axis=-1, dq_per_axis=False, q_axis=-1, q_per_axis=False, out_dtype=state.dtype,
                      out_scale=state.scale, out_zp=state.zp)
    return op


@st.composite
def quantize_op(draw, state):
    """qnn.quantize of the chain's float input (its first op)."""
    return {"op": "quantize", **draw(axis_qparams(state, "")), **qparams_out(draw, draw(st.sampled_from(QDTYPES)))}


@st.composite
def dequantize_op(draw, state):
    """qnn.dequantize to a float output (a chain's last op)."""
    return {"op": "dequantize", **draw(axis_qparams(state, ""))}


@st.composite
def reduce_op(draw, state):
    """cast(int32) -> mean / sum / adaptive or global avg pool -> cast back, or the int32 result kept."""
    rank = len(state.shape)
    pools = ["adaptive_avg_pool2d", "global_avg_pool2d"] if state.layout else []
    kind = draw(st.sampled_from(["mean", "sum", *pools]))
    op = {"op": "reduce", "kind": kind, "out_dtype": draw(st.sampled_from([state.dtype, state.dtype, "int8", "int32"]))}
    if kind in ("mean", "sum"):
        first = draw(st.integers(0, rank - 1))
        last = draw(st.integers(first, rank - 1))
        keep = draw(st.booleans()) or last - first + 1 == rank  # no rank-0 tensor in the middle of a chain
        op.update(axis=list(range(first, last + 1)), keepdims=keep)
    return op


@st.composite
def copy_op(draw, state):
    """One refcg.copy op: a cast, data movement, a pad or a clamp."""
    shape, rank = state.shape, len(state.shape)
    options = [k for k in COPY_OPS if not (
        (k == "squeeze" and (1 not in shape or rank == 1)) or (k == "expand_dims" and rank >= 5)
        or (k == "batch_flatten" and rank < 2) or (k == "layout_transform" and not state.layout)
        or (k == "split" and max(shape) < 2) or (k == "depth_to_space" and not _block_sizes(state))
        or (k == "resize" and not (rank == 4 and state.layout)))]
    options += ["depth_to_space"] * 2 * ("depth_to_space" in options)  # the rarest state (channels % 4 == 0)
    options += ["resize"] * ("resize" in options)  # 4-D only, and 30 mode x rounding pairs
    kind = draw(st.sampled_from(options))
    op = {"op": "copy", "kind": kind}
    lo, hi = DTYPE_RANGE[state.dtype]
    if kind == "cast":
        op["dtype"] = draw(st.sampled_from([d for d in QDTYPES + WIDE if d != state.dtype]))
    elif kind == "reshape":
        op["shape"] = draw(reshapes(shape))
    elif kind == "squeeze":
        ones = [i for i, d in enumerate(shape) if d == 1]
        op["axis"] = draw(st.sampled_from([[i] for i in ones] + ([ones] if len(ones) < rank else [])))
    elif kind == "expand_dims":
        op["axis"] = draw(st.integers(-rank - 1, rank))
    elif kind == "transpose":
        op["axes"] = draw(st.one_of(st.none(), st.permutations(range(rank))))
    elif kind == "strided_slice":
        begin = [draw(st.integers(0, d - 1)) for d in shape]
        op.update(begin=begin, end=[draw(st.integers(b + 1, d)) for b, d in zip(begin, shape)],
                  strides=[draw(st.integers(1, 2)) for _ in shape])
    elif kind == "split":
        axis = draw(st.sampled_from([i for i, d in enumerate(shape) if d >= 2]))
        d = shape[axis]
        sections = [k for k in (2, 3) if d % k == 0]
        points = sorted(draw(st.sets(st.integers(1, d - 1), min_size=1, max_size=2)))
        op.update(axis=axis, sections=draw(st.sampled_from(sections)) if sections and draw(st.booleans()) else points)
        parts = op["sections"] if isinstance(op["sections"], int) else len(points) + 1
        op["index"] = draw(st.integers(0, parts - 1))
    elif kind == "pad":
        op["widths"] = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape]
        op["value"] = draw(st.sampled_from([state.zp, lo, hi]) | st.integers(lo, hi)) \
            if state.dtype in QDTYPES else draw(st.integers(-300, 300))
    elif kind == "depth_to_space":
        op.update(block=draw(st.sampled_from(_block_sizes(state))), mode=draw(st.sampled_from(["DCR", "CRD"])))
    elif kind == "resize":  # image.resize2d nearest: up or down, integer ratios or not
        _, _, h, w = dims(state)
        mode = draw(st.sampled_from(resize.MODES))
        low = 2 if mode == "align_corners" else 1  # TVM-only fails to build align_corners to size 1
        op.update(size=[draw(st.integers(low, 2 * d + 3)) for d in (h, w)], mode=mode,
                  rounding=draw(st.sampled_from(resize.ROUNDINGS)))
    elif kind == "clip":
        op["bounds"] = tuple(sorted((draw(st.integers(lo, hi)), draw(st.integers(lo, hi)))))
    elif kind in ("maximum", "minimum"):
        op.update(value=draw(st.integers(max(lo, -(2**20)), min(hi, 2**20))), flip=draw(st.booleans()))
    return op


def _block_sizes(state) -> list[int]:
    """nn.depth_to_space block sizes whose square divides a 4-D state's channels."""
    return [b for b in (2, 3) if len(state.shape) == 4 and state.layout and dims(state)[1] % (b * b) == 0]


@st.composite
def reshapes(draw, shape):
    """A new shape of the same size: leading dim kept and the rest flattened, two dims merged, or one split."""
    how = draw(st.sampled_from(["flatten", "merge", "split"] if len(shape) >= 2 else ["split"]))
    if how == "flatten":
        return [shape[0], -1]
    if how == "merge":
        i = draw(st.integers(0, len(shape) - 2))
        return [*shape[:i], shape[i] * shape[i + 1], *shape[i + 2:]]
    i = draw(st.integers(0, len(shape) - 1))
    factor = draw(st.sampled_from([f for f in range(1, shape[i] + 1) if shape[i] % f == 0]))
    return [*shape[:i], factor, shape[i] // factor, *shape[i + 1:]][:6]


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
    spec = ChainSpec(shape, layout, dtype, draw(scales()), draw(zero_points(dtype)), seed=draw(st.integers(0, 2**31)),
                     shared=draw(st.integers(0, 2)) == 0)
    if draw(st.integers(0, 9)) == 0:  # a float input quantized first (per tensor or per axis)
        spec.dtype = "float32"
        spec.ops.append(draw(quantize_op(spec)))
    state = apply_op(None, spec, spec.ops[0], None, None)[1] if spec.ops else ChainSpec(shape, layout, dtype,
                                                                                          spec.scale, spec.zp)
    count = draw(st.integers(1, max_ops))
    for i in range(count):
        last = i == count - 1
        if state.dtype in WIDE:  # int16 / int32: requantized back, moved, or (int16) reduced
            options = ["requantize"] * (fused < limit) + ["copy"] + ["reduce"] * (state.dtype == "int16")
        else:
            requantizing = ["binary", "requantize", draw(st.sampled_from(REQUANTIZING_GLUE))]
            options = ["concat"] + ["dense"] * 2 * (len(state.shape) >= 2) + requantizing * (fused < limit)
            options += ["conv2d"] * 3 + ["pool"] if state.layout else []
            options += [draw(st.sampled_from(GLUE))] * 2
            options += ["dequantize"] * (last and draw(st.integers(0, 4)) == 0)
        kind = draw(st.sampled_from(options))
        if kind == "dense" and draw(st.integers(0, 3)) == 0:  # both read the tensor as matrices
            kind = "batch_matmul"
        anchor = kind in ("conv2d", "dense", "batch_matmul")
        fused = 1 if anchor else fused + (kind in ("binary", "requantize", "lut", "softmax"))
        op = {
            "conv2d": lambda: conv_op(state),
            "dense": lambda: dense_op(state, last),
            "batch_matmul": lambda: batch_matmul_op(state, last),
            "binary": lambda: binary_op(state),
            "pool": lambda: pool_op(state),
            "requantize": lambda: requantize_op(state),
            "concat": lambda: concat_op(state),
            "lut": lambda: lut_op(state),
            "softmax": lambda: softmax_op(state),
            "qdq": lambda: qdq_op(state),
            "reduce": lambda: reduce_op(state),
            "copy": lambda: copy_op(state),
            "dequantize": lambda: dequantize_op(state),
        }[kind]()
        spec.ops.append(draw(op))
        _, state = apply_op(None, state, spec.ops[-1], None, None)
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
    # a kept accumulator's scale is about the input's times a weight's (0.01): what a requantize after it reads
    return ChainSpec(tuple(shape), state.layout if layout is None else layout, op["out_dtype"],
                     op.get("out_scale", state.scale * 0.01), op.get("out_zp", 0))


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
        if "out_scale" not in op:  # the int32 accumulator kept
            return y, new
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
    if kind in FAMILY_BUILDERS:
        return FAMILY_BUILDERS[kind](y, state, op, ctx)
    raise ValueError(f"unknown fuzz op {kind}")


def _layout(shape, state) -> str:
    """A 4-D result keeps (or takes) a layout to read it in; the data's meaning does not matter."""
    return (state.layout or "NCHW") if len(shape) == 4 else ""


def _axis_qparams(ctx, shape, axis, per_axis, scale, zp, dtype):
    """(scale, zero point) constants: scalars, or one per element of ``axis`` made from the chain's seed."""
    if not per_axis:
        return _c(scale), _c(zp, "int32")
    n = shape[axis]
    lo, hi = DTYPE_RANGE[dtype]
    scales = (scale * ctx["rng"].uniform(0.5, 2.0, n)).astype("float32")
    zps = np.clip(zp + ctx["rng"].integers(-20, 21, n), lo, hi).astype("int32")
    return relay.const(scales), relay.const(zps)


def _lut(y, state, op, ctx):
    new = _out_state(state, state.shape, op)
    if y is None:
        return None, new
    qi, qo = (_c(state.scale), _c(state.zp, "int32")), (_c(op["out_scale"]), _c(op["out_zp"], "int32"))
    form = op["form"]
    if form.startswith("qnn."):
        fn = getattr(relay.qnn.op, form[4:])
        return (fn(y, op["alpha"], *qi, *qo) if form == "qnn.leaky_relu" else fn(y, *qi, *qo)), new
    x = relay.qnn.op.dequantize(y, *qi)
    three, six = _c(3.0), _c(6.0)
    f = {"sigmoid": relay.sigmoid, "tanh": relay.tanh, "leaky_relu": lambda v: relay.nn.leaky_relu(v, op["alpha"]),
         "tflite_hardswish": lambda v: v * relay.clip(v + three, 0.0, 6.0) / six,
         "pytorch_hardswish": lambda v: v * (relay.clip(v + three, 0.0, 6.0) / six),
         "onnx_hardswish": lambda v: v * relay.clip(v * _c(1 / 6) + _c(0.5), 0.0, 1.0),
         "pytorch_hardsigmoid": lambda v: relay.clip(v + three, 0.0, 6.0) / six,
         "onnx_hardsigmoid": lambda v: relay.clip(v * _c(0.2) + _c(0.5), 0.0, 1.0)}[form](x)
    return relay.qnn.op.quantize(f, *qo, out_dtype=op["out_dtype"]), new


def _softmax(y, state, op, ctx):
    new = _out_state(state, state.shape, op)
    if y is None:
        return None, new
    qo = (_c(op["out_scale"]), _c(op["out_zp"], "int32"))
    if op["form"] == "qnn":
        return relay.qnn.op.softmax(y, _c(op["in_scale"]), _c(state.zp, "int32"), *qo), new
    x = relay.nn.softmax(relay.qnn.op.dequantize(y, _c(state.scale), _c(state.zp, "int32")))
    return relay.qnn.op.quantize(x, *qo, out_dtype=op["out_dtype"]), new


def _quantize(y, state, op, ctx):
    new = _out_state(state, state.shape, op)
    if y is None:
        return None, new
    qo = _axis_qparams(ctx, state.shape, op["axis"], op["per_axis"], op["out_scale"], op["out_zp"], op["out_dtype"])
    return relay.qnn.op.quantize(y, *qo, axis=op["axis"], out_dtype=op["out_dtype"]), new


def _dequantize(y, state, op, ctx, prefix=""):
    new = ChainSpec(state.shape, state.layout, "float32", state.scale, 0)
    if y is None:
        return None, new
    axis, per_axis = op[f"{prefix}axis"], op[f"{prefix}per_axis"]
    qi = _axis_qparams(ctx, state.shape, axis, per_axis, state.scale, state.zp, state.dtype)
    return relay.qnn.op.dequantize(y, *qi, axis=axis), new


def _qdq(y, state, op, ctx):
    x, _ = _dequantize(y, state, op, ctx, "dq_")
    between = op.get("between", "")
    if between == "mean":  # over the spatial axes, kept: the channel axis (and a per-axis quantize) stays
        spatial = (2, 3) if state.layout == "NCHW" else (1, 2)
        x = None if x is None else relay.mean(x, axis=list(spatial), keepdims=True)
        state = replace(state, shape=tuple(1 if i in spatial else d for i, d in enumerate(state.shape)))
    elif between == "resize":  # as TVM's PyTorch importer writes it: NCHW, asymmetric
        size = op["size"]
        x = None if x is None else relay.image.resize2d(x, size, None, state.layout, "nearest_neighbor", "asymmetric")
        n, c, _, _ = dims(state)
        state = replace(state, shape=(n, c, *size) if state.layout == "NCHW" else (n, *size, c))
    elif between and x is not None:
        x = relay.nn.relu(x)
    return _quantize(x, state, {**op, "axis": op["q_axis"], "per_axis": op["q_per_axis"]}, ctx)


def _reduce(y, state, op, ctx):
    kind, rank = op["kind"], len(state.shape)
    if kind in ("mean", "sum"):
        shape = [1 if i in op["axis"] else d for i, d in enumerate(state.shape)
                 if op["keepdims"] or i not in op["axis"]]
    else:
        n, c, _, _ = dims(state)
        shape = (n, c, 1, 1) if state.layout == "NCHW" else (n, 1, 1, c)
    new = ChainSpec(tuple(shape), _layout(shape, state) if rank == len(shape) else "", op["out_dtype"],
                    state.scale, _zero_point_in(state.zp, op["out_dtype"]))
    if y is None:
        return None, new
    wide = relay.cast(y, "int32")
    if kind == "mean":
        r = relay.mean(wide, axis=op["axis"], keepdims=op["keepdims"])
    elif kind == "sum":
        r = relay.sum(wide, axis=op["axis"], keepdims=op["keepdims"])
    elif kind == "adaptive_avg_pool2d":
        r = relay.nn.adaptive_avg_pool2d(wide, output_size=(1, 1), layout=state.layout)
    else:
        r = relay.nn.global_avg_pool2d(wide, layout=state.layout)
    return (r if op["out_dtype"] == "int32" else relay.cast(r, op["out_dtype"])), new


def _copy(y, state, op, ctx):
    kind, shape, dtype = op["kind"], list(state.shape), state.dtype
    if kind == "cast":
        dtype = op["dtype"]
    elif kind == "reshape":
        shape = list(np.empty(shape, dtype="int8").reshape(op["shape"]).shape)
    elif kind == "squeeze":
        shape = [d for i, d in enumerate(shape) if i not in op["axis"]]
    elif kind == "expand_dims":
        axis = op["axis"] % (len(shape) + 1)
        shape = shape[:axis] + [1] + shape[axis:]
    elif kind == "batch_flatten":
        shape = [shape[0], math.prod(shape[1:])]
    elif kind == "transpose":
        shape = [shape[a] for a in (op["axes"] or range(len(shape) - 1, -1, -1))]
    elif kind == "layout_transform":
        shape = [shape[state.layout.index(a)] for a in _other_layout(state.layout)]
    elif kind == "strided_slice":
        shape = [len(range(b, e, s)) for b, e, s in zip(op["begin"], op["end"], op["strides"])]
    elif kind == "split":
        d = shape[op["axis"]]
        points = [d * i // op["sections"] for i in range(1, op["sections"])] if isinstance(op["sections"], int) \
            else op["sections"]
        bounds = [0, *points, d]
        shape[op["axis"]] = bounds[op["index"] + 1] - bounds[op["index"]]
    elif kind == "pad":
        shape = [d + a + b for d, (a, b) in zip(shape, op["widths"])]
    elif kind == "depth_to_space":
        n, c, h, w, b = *dims(state), op["block"]
        shape = [n, c // (b * b), h * b, w * b] if state.layout == "NCHW" else [n, h * b, w * b, c // (b * b)]
    elif kind == "resize":
        n, c, _, _ = dims(state)
        shape = [n, c, *op["size"]] if state.layout == "NCHW" else [n, *op["size"], c]
    layout = _other_layout(state.layout) if kind == "layout_transform" else _layout(shape, state)
    new = ChainSpec(tuple(shape), layout, dtype, state.scale, _zero_point_in(state.zp, dtype))
    if y is None:
        return None, new
    if kind == "cast":
        return relay.cast(y, dtype), new
    if kind == "reshape":
        return relay.reshape(y, op["shape"]), new
    if kind == "squeeze":
        return relay.squeeze(y, axis=op["axis"]), new
    if kind == "expand_dims":
        return relay.expand_dims(y, op["axis"]), new
    if kind == "batch_flatten":
        return relay.nn.batch_flatten(y), new
    if kind == "transpose":
        return relay.transpose(y, op["axes"]), new
    if kind == "layout_transform":
        return relay.layout_transform(y, state.layout, layout), new
    if kind == "strided_slice":
        return relay.strided_slice(y, op["begin"], op["end"], op["strides"]), new
    if kind == "split":
        return relay.split(y, op["sections"], axis=op["axis"])[op["index"]], new
    if kind == "pad":
        return relay.nn.pad(y, op["widths"], pad_value=_c(op["value"], dtype)), new
    if kind == "depth_to_space":
        return relay.nn.depth_to_space(y, op["block"], layout=state.layout, mode=op["mode"]), new
    if kind == "resize":
        return relay.image.resize2d(y, op["size"], None, state.layout, "nearest_neighbor", op["mode"],
                                    op["rounding"]), new
    if kind == "clip":
        return relay.clip(y, *op["bounds"]), new
    bound = _c(op["value"], dtype)
    fn = relay.maximum if kind == "maximum" else relay.minimum
    return (fn(bound, y) if op["flip"] else fn(y, bound)), new


def _zero_point_in(zp: int, dtype: str) -> int:
    """The zero point the next op reads a recast tensor with: valid for its dtype."""
    lo, hi = DTYPE_RANGE[dtype]
    return min(max(zp, lo), hi)


def _other_layout(layout: str) -> str:
    return "NHWC" if layout == "NCHW" else "NCHW"


def _batch_matmul(y, state, op, ctx):
    n, k = state.shape[0], math.prod(state.shape[1:]) // op["m"]
    new = _out_state(state, (n, op["m"], op["n"]), op, layout="")
    if y is None:
        return None, new
    x = relay.reshape(y, (n, op["m"], k))
    if op["form"] == "self":
        other = x
    else:
        shape = (1 if op["form"] == "broadcast" else n, op["n"], k)
        other = relay.var(f"bmm_y{len(ctx['inputs'])}", shape=shape, dtype=op["y_dtype"])
        ctx["params"].append(other)
        ctx["inputs"][other.name_hint] = full_range(ctx["rng"], shape, op["y_dtype"])
    y = relay.qnn.op.batch_matmul(x, other, _c(state.zp, "int32"), _c(op["y_zp"], "int32"), _c(state.scale),
                                  _c(op["y_scale"]))
    if op["out_dtype"] == "int32":
        return y, new
    scale = np.float32(state.scale) * np.float32(op["y_scale"])
    in_scale = (ctx["rng"].uniform(0.5, 2.0, op["n"]) * scale).astype("float32") if op["per_channel"] else scale
    return _requantize(y, in_scale, 0, op, 2), new


FAMILY_BUILDERS = {"lut": _lut, "softmax": _softmax, "qdq": _qdq, "quantize": _quantize, "dequantize": _dequantize,
                 "reduce": _reduce, "copy": _copy, "batch_matmul": _batch_matmul}


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
    if spec.dtype == "float32":  # quantized first: values around its range, beyond it, and halfway points
        scale, rng = spec.ops[0]["out_scale"], ctx["rng"]
        steps = np.where(rng.random(spec.shape) < 0.3, rng.integers(-300, 300, spec.shape) + 0.5,
                         rng.uniform(-300, 300, spec.shape))
        ctx["inputs"][x.name_hint] = (steps * scale).astype("float32")
    else:
        ctx["inputs"][x.name_hint] = full_range(ctx["rng"], spec.shape, spec.dtype)
    y, state = x, spec
    for op in spec.ops:
        y, state = apply_op(y, state, op, ctx, name)
    return _share_scalars(y) if spec.shared else y


class _ScalarSharer(relay.ExprMutator):
    """One Constant per distinct rank-0 float value."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def visit_constant(self, const):
        value = const.data.numpy()
        if value.ndim or value.dtype.kind != "f":
            return const
        return self.seen.setdefault((value.dtype.str, value.tobytes()), const)


def _share_scalars(expr):
    return _ScalarSharer().visit(expr)


def build_batch(specs: list[ChainSpec], numerics: str):
    """One module with every chain as one output of a tuple; returns (module, inputs)."""
    ctx = {"params": [], "inputs": {}, "small": numerics in SATURATING_NUMERICS}
    outputs = [build_chain(spec, ctx, f"c{i}") for i, spec in enumerate(specs)]
    return module(ctx["params"], relay.Tuple(outputs)), ctx["inputs"]



def tvm_only_undefined(spec: ChainSpec, numerics: str | None = None) -> str | None:
    """Why TVM-only's output for ``spec`` (built for ``numerics``) is undefined or wrong, or None: such
    a chain is counted, not compared (both fuzz-found, tests/test_fuzz_regressions.py).

    avg_pool2d with ceil_mode and count_include_pad divides by the window's extent clipped to the
    padded input, which is <= 0 for a last window entirely outside it (refcg keeps that pool in TVM,
    so the garbage flows into whatever refcg computes next). On aarch64, TVM 0.19's int8 NHWC conv
    (topi/arm_cpu/conv2d_gemm.py:111-113) makes the im2col of a 1x1 kernel a reshape of the input,
    ignoring the strides: a strided 1x1 conv reads the wrong pixels (refcg computes it right). On x86,
    TVM's batch_matmul_int8 (uint8 x int8, N % 16 == K % 4 == 0) indexes a broadcast batch-1 operand's
    packed copy by the other operand's batch, reading past it (refcg keeps it in TVM: ops/batch_matmul.py).
    """
    state = spec
    for op in spec.ops:
        _, new = apply_op(None, state, op, None, None)
        if numerics in ARM_NUMERICS and op["op"] == "conv2d" and state.layout == "NHWC" and op["groups"] == 1 \
                and op["kernel"] == (1, 1) and op["strides"] != (1, 1):
            return "TVM-only aarch64 NHWC 1x1 conv ignores its strides (conv2d_gemm.py im2col is a reshape)"
        if numerics not in ARM_NUMERICS and op["op"] == "batch_matmul" and op["form"] == "broadcast" \
                and state.shape[0] > 1 and (state.dtype, op["y_dtype"]) == ("uint8", "int8") and op["n"] % 16 == 0 \
                and (math.prod(state.shape[1:]) // op["m"]) % 4 == 0:
            return "TVM-only x86 batch_matmul_int8 reads past a broadcast batch-1 operand (uint8 x int8, N % 16 == K % 4 == 0)"
        if op["op"] == "pool" and op["kind"] == "avg" and op["ceil_mode"] and op["count_include_pad"]:
            (_, _, h, w), (_, _, oh, ow) = dims(state), dims(new)
            (sh, sw), (pt, pl, pb, pr) = op["strides"], op["padding"]
            if (oh - 1) * sh - pt > h + pb - 1 or (ow - 1) * sw - pl > w + pr - 1:
                return "avg_pool2d ceil_mode window entirely outside the padded input: TVM divides by <= 0"
        if op["op"] == "softmax" and op["form"] == "qnn":  # the strategy draws none: a pasted spec might
            reason = overflow_reason(x0_of(op["in_scale"]), state.shape[-1])
            if reason:
                return f"qnn.softmax: {reason}"
        state = new
    return None



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


def families(spec: ChainSpec) -> list[str]:
    """What a chain exercises, one name per drawn op and property (``make fuzz`` counts them,
    test_fuzz requires each to be drawn): the op and its form, and the forms issue 14 asked for."""
    names, state = ["shared scalar constants"] * spec.shared, spec
    for op in spec.ops:
        kind = op["op"]
        form = op.get("form") or (op.get("kind") if kind in ("copy", "reduce", "pool", "binary") else None)
        names.append(f"{kind} {form}" if form else kind)
        _, new = apply_op(None, state, op, None, None)
        if kind == "binary" and tuple(op["other"]) == ():
            names.append("binary rank-0 operand")
        if kind == "conv2d" and op.get("pad"):
            names.append("conv2d behind an nn.pad")
        if op.get("between"):
            names.append(f"qdq through {op['between']}")
        if any(op.get(key) for key in ("per_axis", "dq_per_axis", "q_per_axis")):
            names.append(f"{kind} per axis")
        if kind in ("conv2d", "dense", "batch_matmul") and "out_scale" not in op:
            names.append(f"{kind} int32 accumulator kept")
        elif kind == "requantize":
            names += [f"requantize from {state.dtype}"] * (state.dtype in WIDE) + [f"requantize to {new.dtype}"] * (
                new.dtype in WIDE)
        elif new.dtype == "int16" and state.dtype != "int16":
            names.append(f"{kind} to int16")
        state = new
    return names
