"""Kernel plan: a typed description of every kernel one partition runs, in order.

Input is the partition after the scoped fold, where every composite call holds its
QNN ops with constant qparams and constant (folded) weights. Each composite's family
(``ops/``) parses its body and plans its ``Step``: the C entry point, its buffers and the
ready values its template renders. ``emit.py`` turns the plan into C.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field

import numpy as np
from tvm import relay

from . import lut
from .armfuse import FusionContext
from .errors import RefcgError
from .numerics import is_arm_cpu_aarch64
from .ops import family_of
from .ops.base import Buffer, Step


@dataclass
class KernelPlan:
    symbol: str
    target: str
    inputs: list[Buffer]
    outputs: list[Buffer]
    scratch: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    constants: list[Buffer] = field(default_factory=list)

    def offset(self, buf: Buffer) -> int:
        """Where ``buf`` starts in its buffer: 0, or for a scratch tensor, centred in its slot (a
        multiple of 4096 bytes: the tensor keeps the alignment it had at the slot's start). Kernels split
        their rows in two halves over 2 threads: centred, each core writes and reads the same half of the
        slot's lines for every tensor the slot holds in turn, instead of taking the lines the other core
        last wrote (a cross-core transfer each) wherever two tensors' sizes differ."""
        if buf.kind != "scratch":
            return 0
        return (self.scratch[buf.index].nbytes - buf.nbytes) // 2 // 4096 * 4096

    def pointer(self, buf: Buffer) -> str:
        """The C expression of ``buf``'s first element."""
        offset = self.offset(buf) + buf.halo_offset
        return f"((char*){buf.name} + {offset})" if offset else buf.name


def _buffer_for(expr, kind: str, index: int, name: str) -> Buffer:
    ttype = expr.checked_type
    return Buffer(name, tuple(int(d) for d in ttype.shape), str(ttype.dtype), kind, index)


def _readers(calls) -> dict:
    """The composite calls that read each expression, once per argument it is."""
    readers: dict = {}
    for call in calls:
        for arg in call.args:
            readers.setdefault(arg, []).append(call)
    return readers


# Channels last: the conv kernels' own layout (NHWC reads as a straight copy, no 8x8 transposes
# on the way in and no unpack on the way out)
CHANNELS_LAST = (0, 2, 3, 1)


def _composite_calls(body_fields) -> list:
    """Each composite call of the partition once, in dataflow order."""
    calls: dict = {}

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function):
            calls[node] = True

    for expr in body_fields:
        relay.analysis.post_order_visit(expr, visit)
    return list(calls)


def plan_layouts(body_fields, parsed: dict) -> dict:
    """The physical axis order of each intermediate tensor (composite call -> perm; absent: logical).

    In a partition whose convs and pools are all NCHW, every 4-D intermediate is stored channels last
    when the kernel writing it and every kernel reading it take that layout (``layout_ok`` of their
    parameter objects); partition inputs and outputs stay logical, so the first conv converts on its
    way in and the last kernel writes the logical layout: no conversion step between two kernels.
    """
    layouts = {p.layout() for p in parsed.values() if hasattr(p, "layout")}
    if layouts != {"NCHW"}:
        return {}
    outputs = set(body_fields)
    perm = {call: CHANNELS_LAST for call in parsed
            if call not in outputs and isinstance(call.checked_type, relay.TensorType)
            and len(call.checked_type.shape) == 4}
    changed = True
    while changed:  # a kernel that cannot take its tensors' layouts makes them logical
        changed = False
        for call, params in parsed.items():
            src_perms, dst_perm = [perm.get(arg) for arg in call.args], perm.get(call)
            if not any(src_perms) and dst_perm is None:
                continue
            ok = getattr(params, "layout_ok", lambda srcs, dst: not any(srcs) and dst is None)
            if ok(src_perms, dst_perm):
                continue
            # the output alone when that is enough (e.g. a reduction whose result stays logical)
            dropped = (call,) if dst_perm is not None and ok(src_perms, None) else (*call.args, call)
            for expr in dropped:
                changed |= perm.pop(expr, None) is not None
    return perm


def plan_halos(parsed: dict, perm: dict, readers: dict, outputs: set) -> dict:
    """The halo (Buffer.halo) of each intermediate tensor a depthwise conv reads in place: written by a conv
    (through strides), read by that padded depthwise conv alone, channels last, of channels the
    depthwise kernels' pixels hold exactly (a multiple of 16). The producer then writes inside the halo
    and the depthwise conv fills it with its zero point and reads the tensor as its padded copy, instead
    of copying it into one (the copy was a fifth of MobileNetV2's depthwise time)."""
    halos = {}
    for call, params in parsed.items():
        halo = getattr(params, "in_place_halo", lambda: None)()
        if halo is None:
            continue
        src = call.args[0]
        producer = parsed.get(src)
        layout = params.layout()
        channels_last = perm.get(src) == CHANNELS_LAST if layout == "NCHW" else layout == "NHWC" and src not in perm
        if producer is not None and getattr(producer, "writes_strided", False) and src not in outputs and \
                readers.get(src) == 1 and channels_last:
            halos[src] = halo
    return halos


def _x86(target) -> bool:
    """The build target's CPU is x86 (a target without -mtriple: this host's)."""
    triple = str(target.attrs.get("mtriple", "")) if target is not None and "mtriple" in target.attrs else ""
    return triple.startswith("x86_64") if triple else platform.machine() in ("x86_64", "AMD64")


def plan_flips(halos: dict, parsed: dict, readers: dict, outputs: set, target) -> set:
    """The int8 intermediate tensors stored flipped (Buffer.flipped) for an x86 target, whose variants
    compute in the uint8 domain: those of ``halos``, which the depthwise conv then reads in place where it
    copied them to flip each byte, and those every reader of which reads flipped (``reads_flipped``: convs,
    whose tiles then read their own domain instead of flipping each byte as they read or copying, and
    binary ops in int64 numerics: a residual block's output, which its add and the next expand conv read).
    Only where the writer's requantize adds its zero point as an integer (int64 numerics), so that the
    zero point + 128 gives each value + 128 exactly (float numerics round zp + 128 apart)."""
    if not _x86(target):
        return set()
    flips = set()
    for expr, writer in parsed.items():
        if expr in outputs or expr.checked_type.dtype != "int8" or \
                not getattr(writer, "flippable_output", lambda t: False)(target):
            continue
        read_flipped = expr in readers and \
            all(getattr(parsed[r], "reads_flipped", lambda t: False)(target) for r in readers[expr])
        if expr in halos or read_flipped:
            flips.add(expr)
    return flips


class _ScratchPool:
    """Workspace slots for intermediate tensors, reused once their last reader has run."""

    def __init__(self, plan: KernelPlan):
        self.plan, self.free = plan, []

    def take(self, expr, perm=None, halo=None, flipped=False) -> Buffer:
        ttype = expr.checked_type
        shape, dtype = tuple(int(d) for d in ttype.shape), str(ttype.dtype)
        if self.free:
            slot = self.free.pop()
        else:
            slot = Buffer(f"tmp{len(self.plan.scratch)}", (0,), "uint8", "scratch", len(self.plan.scratch))
            self.plan.scratch.append(slot)
        buf = Buffer(slot.name, shape, dtype, "scratch", slot.index, perm=perm, halo=halo, flipped=flipped)
        slot.shape = (max(slot.shape[0], buf.nbytes),)
        return buf

    def release(self, buf: Buffer):
        self.free.append(self.plan.scratch[buf.index])


def build_plan(func: relay.Function, symbol: str, target, undecided: list | None = None) -> KernelPlan:
    """Walk the folded partition in dataflow order and describe each composite call.

    Composites may take several inputs (partition inputs, other composites' results,
    constants embedded in the C source) and the partition may return a tuple.
    ``undecided``: collects the (composite call, reason) whose aarch64 rounding armfuse cannot
    tell, instead of raising (``partition_for_refcg`` leaves them in TVM).
    """
    inputs = [_buffer_for(p, "input", i, f"in{i}") for i, p in enumerate(func.params)]
    body_fields = list(func.body.fields) if isinstance(func.body, relay.Tuple) else [func.body]
    outputs = [_buffer_for(e, "output", len(inputs) + i, f"out{i}") for i, e in enumerate(body_fields)]
    plan = KernelPlan(symbol, str(target), inputs, outputs)
    done = dict(zip(func.params, inputs))  # expr -> buffer holding its value
    output_of = dict(zip(body_fields, outputs))
    if any(expr in done or isinstance(expr, relay.Constant) for expr in output_of):
        raise RefcgError(symbol, "output", "a partition input or constant is returned unchanged")
    if len(output_of) != len(outputs):
        raise RefcgError(symbol, "output", "the same value is returned twice")
    calls = _composite_calls(body_fields)
    reader_calls = _readers(calls)
    readers = {expr: len(r) for expr, r in reader_calls.items()}  # counted down: scratch is freed after the last
    lut.prepare(func, target)  # one TVM build computes every lookup table of the partition
    scratch = _ScratchPool(plan)
    fusion = FusionContext(func, target, undecided) if is_arm_cpu_aarch64(target) else None
    parsed = {}
    for call in calls:
        family = family_of(str(call.op.attrs["Composite"]))
        if family is None:
            raise RefcgError(str(call.op.attrs["Composite"]), "composite", "no kernel planner for this composite")
        parsed[call] = family.parse(call.op.body)
    perm = plan_layouts(body_fields, parsed)
    halos = plan_halos(parsed, perm, readers, set(body_fields))
    flips = plan_flips(halos, parsed, reader_calls, set(body_fields), target)

    owner = {}  # a view's expr -> the expr whose buffer it reads (readers are counted there)

    def visit(expr) -> Buffer:
        if expr in done:
            return done[expr]
        if isinstance(expr, relay.Constant):
            buf = _buffer_for(expr, "const", len(plan.constants), f"c{len(plan.constants)}")
            buf.data = expr.data.numpy()
            plan.constants.append(buf)
            done[expr] = buf
            return buf
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function)):
            raise RefcgError(symbol, "body", f"unexpected {type(expr).__name__} between kernels")
        family = family_of(str(expr.op.attrs["Composite"]))
        srcs = [visit(arg) for arg in expr.args]
        params = parsed[expr]
        if getattr(params, "is_view", lambda: False)() and expr not in output_of and perm.get(expr) is None and \
                srcs[0].perm is None and srcs[0].kind in ("scratch", "input"):
            # the same bytes under another shape: no step; the input's buffer lives until the view's last reader
            done[expr] = view = _buffer_for(expr, srcs[0].kind, srcs[0].index, srcs[0].name)
            view.perm = None
            root = owner[expr] = owner.get(expr.args[0], expr.args[0])
            readers[root] += readers[expr] - 1
            return view
        dst = output_of.get(expr) or scratch.take(expr, perm.get(expr), halos.get(expr), expr in flips)
        dst.perm = perm.get(expr)
        done[expr] = dst
        ask = None
        if fusion is not None and family.NEON_REQUANTIZE:
            ask = lambda operand=None, call=expr: fusion.q31x4(call, operand)  # noqa: E731
        plan.steps.append(params.plan(f"k{len(plan.steps)}", expr.op, srcs, dst, target, ask))
        for arg, src in zip(expr.args, srcs):
            root = owner.get(arg, arg)
            readers[root] -= 1
            if src.kind == "scratch" and readers[root] == 0:
                scratch.release(src)
        return dst

    for expr in body_fields:
        visit(expr)
    return plan
