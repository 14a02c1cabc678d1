"""What every op family shares: reading a matched Relay expression, the common checks, and the
kernel step a family's ``plan`` returns.

Checks return ``None`` when refcg computes a value exactly, else a short reason (the offload
report shows it). Pattern helpers build the dataflow patterns families match.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import AltPattern, CallPattern, TuplePattern, WildcardPattern, is_constant, is_op, wildcard

from ..errors import RefcgError
from ..numerics import DTYPE_RANGE

QUANT_DTYPES = ("int8", "uint8")
REQUANTIZE_DTYPES = ("int8", "uint8", "int16", "int32")  # what TVM 0.19 accepts, less int64 inputs
DTYPE_CODE = {"int8": "REFCG_S8", "uint8": "REFCG_U8", "int16": "REFCG_S16", "int32": "REFCG_S32"}
INT32_MAX = 2**31 - 1


# ---- reading expressions ----

def op_name(expr) -> str | None:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def const_value(expr) -> np.ndarray | None:
    return expr.data.numpy() if isinstance(expr, relay.Constant) else None


def scalar(expr):
    """The first value of a constant (a scalar qparam)."""
    return const_value(expr).reshape(-1)[0]


def static_shape(expr) -> tuple[int, ...] | None:
    ttype = expr.checked_type
    if not isinstance(ttype, relay.TensorType):
        return None
    if not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
        return None
    return tuple(int(d) for d in ttype.shape)


def dtype_of(expr) -> str:
    return expr.checked_type.dtype


def is_constant_subgraph(expr) -> bool:
    """True when ``expr`` depends on no variable, so the scoped fold can evaluate it."""
    return not relay.analysis.free_vars(expr)


def folded_constant(expr, op: str, what: str) -> np.ndarray:
    """A constant operand after the scoped fold (plans only)."""
    if not isinstance(expr, relay.Constant):
        raise RefcgError(op, what, "did not fold to a constant in the scoped fold")
    return expr.data.numpy()


def first_reason(*reasons) -> str | None:
    return next((r for r in reasons if r), None)


# ---- common checks ----

def check_scale(expr, what: str) -> str | None:
    value = const_value(expr)
    if value is None:
        return f"{what} is not a constant"
    if value.dtype != np.float32:
        return f"{what} has dtype {value.dtype}, expected float32"
    if value.size == 0 or not np.all(np.isfinite(value)) or not np.all(value > 0):
        return f"{what} must be finite and positive"
    return None


def check_zero_point(expr, dtype: str, what: str, allow_vector: bool = False) -> str | None:
    value = const_value(expr)
    if value is None:
        return f"{what} is not a constant"
    if value.ndim > 0 and not allow_vector:
        return f"{what} must be a scalar"
    if value.size == 0 or np.any(value != value.reshape(-1)[0]):
        return f"{what} varies per channel"
    if dtype not in DTYPE_RANGE:
        return f"{what} is for dtype {dtype}, which refcg does not compute"
    lo, hi = DTYPE_RANGE[dtype]
    if not lo <= int(value.reshape(-1)[0]) <= hi:
        return f"{what} {int(value.reshape(-1)[0])} is outside the {dtype} range"
    return None


def check_qparams(scale, zero_point, dtype: str, what: str) -> str | None:
    """A per-tensor (scalar) scale and zero point, as the elementwise kernels take them."""
    reason = first_reason(check_scale(scale, f"{what} scale"),
                          check_zero_point(zero_point, dtype, f"{what} zero point"))
    if reason is None and const_value(scale).size != 1:
        return f"{what} scale must be a scalar"
    return reason


def check_elements(shape, what: str) -> str | None:
    """Kernel parameters hold dimensions as int32: bigger tensors stay in TVM."""
    count = math.prod(shape)
    return f"{what} has {count} elements, more than int32 indexing allows" if count > INT32_MAX else None


def check_tensor(expr, what: str, dtypes=QUANT_DTYPES, max_rank: int = 6, min_rank: int = 1) -> str | None:
    shape = static_shape(expr)
    if shape is None:
        return f"{what} shape must be static"
    if not min_rank <= len(shape) <= max_rank:
        return f"{what} rank {len(shape)} is not between {min_rank} and {max_rank}"
    if min(shape, default=1) <= 0:
        return f"{what} is zero-sized"
    if check_elements(shape, what):
        return check_elements(shape, what)
    if dtype_of(expr) not in dtypes:
        return f"{what} dtype {dtype_of(expr)} is not one of {'/'.join(dtypes)}"
    return None


def check_clip(clip, dtype: str) -> str | None:
    if dtype not in DTYPE_RANGE:
        return f"clip of a {dtype} tensor"
    lo, hi = DTYPE_RANGE[dtype]
    a_min, a_max = float(clip.attrs.a_min), float(clip.attrs.a_max)
    if not (math.isfinite(a_min) and math.isfinite(a_max)):
        return "clip bounds must be finite"
    if not lo <= a_min <= a_max <= hi:
        return f"clip bounds [{a_min}, {a_max}] are outside the {dtype} range"
    return None


def out_range(dtype: str, clip) -> tuple[int, int]:
    """The output dtype's range intersected with a clip's (TVM truncates clip bounds)."""
    lo, hi = DTYPE_RANGE[dtype]
    if clip is None:
        return lo, hi
    return max(lo, int(clip.attrs.a_min)), min(hi, int(clip.attrs.a_max))


# ---- patterns ----

def constants(n: int) -> list:
    """``n`` distinct constant patterns: one pattern object used twice must match one expr."""
    return [is_constant() for _ in range(n)]


def any_of(patterns):
    """The alternation of ``patterns``, tried in order."""
    return functools.reduce(lambda a, b: a | b, patterns)


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


def dequantized(x=None):
    return is_op("qnn.dequantize")(wildcard() if x is None else x, *constants(2))


def bound_inputs(pattern, expr) -> list:
    """The expressions a match of ``pattern`` at ``expr`` binds to wildcards: the composite's
    inputs, as ``pattern.partition(expr)`` would pass them (alternatives tried in order)."""
    if isinstance(pattern, WildcardPattern):
        return [expr]
    if isinstance(pattern, AltPattern):
        return bound_inputs(pattern.left if pattern.left.match(expr) else pattern.right, expr)
    pairs = zip(pattern.args, expr.args) if isinstance(pattern, CallPattern) else \
        zip(pattern.fields, expr.fields) if isinstance(pattern, TuplePattern) else ()
    return [bound for p, e in pairs for bound in bound_inputs(p, e)]


# ---- TVM's SimplifyConsecutiveCast ----

def cast_wraps_when_folded(src: str, dst: str) -> bool:
    """Whether TVM 0.19's SimplifyConsecutiveCast (src/relay/transforms/simplify_expr.cc:112-156)
    drops a cast src -> dst that wraps: cast(cast(x, dst), t) -> cast(x, t) when IsWidenCast holds,
    which counts int -> uint of as many bits or more (int < uint < float, bits <=) as widening.
    (Its int -> float casts that round feed no refcg composite whose lowering starts with a cast.)"""
    s, d = tvm.DataType(src), tvm.DataType(dst)
    return s.type_code == tvm.DataTypeCode.INT and d.type_code == tvm.DataTypeCode.UINT and s.bits <= d.bits


def folded_cast(expr) -> str | None:
    """``"cast <src> -> <dst>"`` when ``expr`` is a cast TVM-only folds into a following cast, else None."""
    if op_name(expr) != "cast":
        return None
    src, dst = dtype_of(expr.args[0]), dtype_of(expr)
    return f"cast {src} -> {dst}" if cast_wraps_when_folded(src, dst) else None


def folded_cast_input_reason(pattern, expr) -> str | None:
    """A composite must not read such a cast: when its TVM lowering starts with a cast, TVM-only
    computes it from the value before the cast (no wrap), refcg from the value after."""
    for bound in bound_inputs(pattern, expr):
        cast = folded_cast(bound)
        if cast:
            return (f"reads a {cast} that TVM's SimplifyConsecutiveCast folds into a following cast "
                    "(IsWidenCast): TVM-only may not wrap it")
    return None


# ---- plans ----

@dataclass
class Buffer:
    """A tensor the generated function reads or writes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input", "output", "scratch" or "const"
    index: int  # argument position for inputs/outputs, slot for scratch
    data: np.ndarray | None = None  # the value of a "const" buffer, embedded in the C source
    # physical axis order chosen by the planner (plan.py): memory holds the compact tensor of shape
    # (shape[perm[0]], shape[perm[1]], ...); None is the logical order
    perm: tuple[int, ...] | None = None
    # (top, left, bottom, right): a channels-last 4-D tensor stored inside a border of that many rows and
    # pixels (physical axes 1 and 2), which the depthwise conv reading it fills and reads in place (plan.py)
    halo: tuple[int, int, int, int] | None = None
    # int8 values stored as uint8 (each + 128, the byte ^ 0x80), the domain of the x86 variants: a tensor
    # the depthwise conv reading it in place would otherwise copy to flip (plan.plan_flips)
    flipped: bool = False

    @property
    def physical_shape(self) -> tuple[int, ...]:
        """The tensor's axes as memory holds them (a halo's rows and pixels included)."""
        shape = self.shape if self.perm is None else tuple(self.shape[a] for a in self.perm)
        if self.halo is None:
            return shape
        top, left, bottom, right = self.halo
        return (shape[0], shape[1] + top + bottom, shape[2] + left + right, *shape[3:])

    def whole(self) -> "Buffer":
        """The same memory as a tensor of its own: the halo's rows and pixels part of it (from the first byte)."""
        if self.halo is None:
            return self
        logical = list(self.shape)
        for position in (1, 2):
            logical[self.perm[position] if self.perm is not None else position] = self.physical_shape[position]
        return Buffer(self.name, tuple(logical), self.dtype, self.kind, self.index, perm=self.perm)

    @property
    def halo_offset(self) -> int:
        """Bytes from the first byte of the memory to the tensor's first element."""
        if self.halo is None:
            return 0
        strides = compact_strides(self.physical_shape)
        return (self.halo[0] * strides[1] + self.halo[1] * strides[2]) * np.dtype(self.dtype).itemsize

    def physical_axis(self, axis: int) -> int:
        """Where logical ``axis`` sits in the physical order."""
        return axis if self.perm is None else self.perm.index(axis)

    @property
    def strides(self) -> list[int]:
        """Element strides per logical axis."""
        physical = compact_strides(self.physical_shape)
        order = self.perm if self.perm is not None else range(len(self.shape))
        strides = [0] * len(self.shape)
        for position, axis in enumerate(order):
            strides[axis] = physical[position]
        return strides

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.physical_shape)) * np.dtype(self.dtype).itemsize

    @property
    def ctype(self) -> str:
        """The element type a kernel's pointer to this tensor has: float for float32, else void (the
        kernel reads the integer dtype from its parameters)."""
        return "float" if self.dtype == "float32" else "void"


@dataclass
class Call:
    """One C call of a step: ``entry(&<prefix>_<ref>..., inputs..., output)``. ``refs`` name what the
    family's template declares for the step (``<prefix>`` is ``<symbol>_<step name>``)."""

    entry: str
    refs: list[str]
    inputs: list[Buffer]
    output: Buffer


@dataclass
class Step:
    """One kernel of a partition: the template (``<family>.c.j2``) that declares its constant data
    and parameter structs from ``values``, and the C calls that run it, in order."""

    name: str
    family: str
    inputs: list[Buffer]
    output: Buffer
    values: dict
    calls: list[Call] = field(default_factory=list)

    @property
    def template(self) -> str:
        return f"{self.family}.c.j2"


@dataclass
class FloatBetween:
    """The parameter object of a match qnn.dequantize -> one float op -> qnn.quantize (the root)."""

    quantize: relay.Call
    op: relay.Call
    dequantize: relay.Call

    @classmethod
    def parse(cls, root):
        return cls(root, root.args[0], root.args[0].args[0])


@dataclass
class OneCall:
    """The parameter object of a family whose match is one call: the report names that call."""

    call: relay.Call

    @classmethod
    def parse(cls, call):
        return cls(call)

    def members(self) -> list:
        return [self.call]


def operands(func: relay.Function, srcs: list[Buffer], exprs) -> list[Buffer]:
    """Buffers of composite-body operands: one tensor used twice is a single composite parameter."""
    by_param = dict(zip(func.params, srcs))
    return [by_param[e] for e in exprs]


def param_index(func: relay.Function, expr) -> int | None:
    """Position of a composite-body operand among the composite's parameters (None: a constant)."""
    return next((i for i, param in enumerate(func.params) if param.same_as(expr)), None)


def folded_operand(func: relay.Function, srcs: list, expr) -> bool:
    """Whether a composite-body operand is a constant (in the body, or the constant argument ``srcs`` holds):
    TVM-only's FoldConstant requantizes it when it builds, on the host target "llvm"
    (src/relay/transforms/fold_constant.cc:403 at v0.19.0), so without FMA and without NEON."""
    index = param_index(func, expr)
    return index is None or srcs[index].kind == "const"


def layout_dims(shape, layout: str) -> dict:
    return {axis: shape[layout.index(axis)] for axis in "NHWC"}


def compact_strides(shape) -> list[int]:
    return [int(s) for s in np.cumprod((tuple(shape)[1:] + (1,))[::-1], dtype=np.int64)[::-1]]


def layout_strides(buf: Buffer, layout: str) -> list[int]:
    """Element strides of ``buf`` (in its physical layout) in batch, height, width, channel order."""
    strides = buf.strides
    return [strides[layout.index(axis)] for axis in "NHWC"]


def prod(values) -> int:
    return int(np.prod(values, dtype=np.int64))
