"""refcg.lut: a unary function of one int8/uint8 tensor, ``qnn.<op>(x, qparams)`` or
``qnn.quantize(f(qnn.dequantize(x)))``, computed as the 256-entry table TVM-only computes for it
(refcodegen/lut.py builds it; runtime refcg_lut looks it up). A ``qnn.add/subtract/mul`` of ``x`` and
such a function of ``x`` (swish: ``x * sigmoid(x)``, EfficientNet's activation) is a function of each
value of ``x`` as well: one table, one pass over the tensor instead of a lookup and a binary op."""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from .. import lut as tables
from ..errors import RefcgError
from ..numerics import is_arm_cpu_aarch64
from . import binary
from .base import (Buffer, Call, Step, any_of, check_qparams, check_tensor, const_value, constants, dequantized, dtype_of,
                   first_reason, op_name, prod, static_shape)

NAME = "lut"
NEON_REQUANTIZE = False
# qnn unary ops TVM 0.19 canonicalizes to a function of each 8-bit value (a lookup table)
QNN_OPS = ("qnn.sigmoid", "qnn.tanh", "qnn.hardswish", "qnn.leaky_relu", "qnn.exp", "qnn.log", "qnn.abs")
FLOAT_OPS = ("sigmoid", "tanh", "nn.leaky_relu")
BINARY_OPS = ("qnn.add", "qnn.subtract", "qnn.mul")


def _scaled(e):
    return e | is_op("multiply")(e, is_constant()) | is_op("divide")(e, is_constant())


def hardsigmoid_of(x):
    """relu6(x + 3) / 6 (PyTorch's quantized hardsigmoid: MobileNetV3's squeeze-excite) or
    clip(alpha * x + beta, 0, 1) (ONNX HardSigmoid), in the forms the frontends emit."""
    return _scaled(is_op("clip")(is_op("add")(_scaled(x), is_constant())))


def hardswish_of(x):
    """x * hardsigmoid(x) in the forms the TFLite, PyTorch and ONNX frontends emit."""
    gate = hardsigmoid_of(x)
    return _scaled(is_op("multiply")(x, gate) | is_op("multiply")(gate, x))


def unary_of(x) -> list:
    """The forms of a table op of the 8-bit tensor ``x``: each qnn op, and a float op between
    dequantize and quantize (before refcg.quantize: these end in a qnn.quantize that would otherwise
    run alone)."""
    qnn_ops = [is_op(name)(x, *constants(4)) for name in QNN_OPS]
    dq = dequantized(x)
    float_op = any_of([is_op(name)(dq) for name in FLOAT_OPS] + [hardswish_of(dq), hardsigmoid_of(dq)])
    return [*qnn_ops, is_op("qnn.quantize")(float_op, *constants(2))]


def patterns() -> list:
    x = wildcard()  # one pattern node: both operands of the binary op read the same tensor
    unary = any_of(unary_of(x))
    with_input = any_of([is_op(name)(x, unary, *constants(6)) | is_op(name)(unary, x, *constants(6))
                         for name in BINARY_OPS])
    return [(p, Lut.parse) for p in (with_input, *unary_of(wildcard()))]


@dataclass
class Lut:
    """``op``: the call the report names; ``input``: the 8-bit tensor; ``calls``: every call of the
    chain; ``qparams``: its (scale, zero point, quantized dtype, name) quadruples."""

    root: relay.Call
    op: relay.Call
    input: relay.Expr
    calls: list
    qparams: list
    inner: "Lut | None" = None  # a binary root's table op of its input

    @classmethod
    def parse(cls, root) -> "Lut":
        if op_name(root) in BINARY_OPS:  # x and a table op of x (the pattern matched one of the orders)
            lhs, rhs = root.args[:2]
            inner = cls.parse(rhs) if op_name(rhs) in QNN_OPS + ("qnn.quantize",) else None
            if inner is None or not inner.input.same_as(lhs):
                inner = cls.parse(lhs)
            names = ("lhs", "rhs", "output")
            qparams = [(root.args[2 + 2 * i], root.args[3 + 2 * i], dtype_of(e), n)
                       for i, (e, n) in enumerate(zip((lhs, rhs, root), names))]
            return cls(root, root, inner.input, [root, *inner.calls], inner.qparams + qparams, inner)
        if op_name(root) in QNN_OPS:
            data, in_scale, in_zp, out_scale, out_zp = root.args
            dtype = dtype_of(data)
            return cls(root, root, data, [root],
                       [(in_scale, in_zp, dtype, "input"), (out_scale, out_zp, dtype, "output")])
        calls, dequantize = [], None

        def walk(expr):
            nonlocal dequantize
            if op_name(expr) == "qnn.dequantize":
                dequantize = expr
            elif isinstance(expr, relay.Call) and expr not in calls:
                calls.append(expr)
                for arg in expr.args:
                    walk(arg)

        walk(root.args[0])
        data = dequantize.args[0]
        return cls(root, root.args[0], data, [root, dequantize, *calls],
                   [(dequantize.args[1], dequantize.args[2], dtype_of(data), "dequantize"),
                    (root.args[1], root.args[2], dtype_of(root), "quantize")])

    def members(self) -> list:
        return [self.op]

    def reason(self, ctx) -> str | None:
        """Scalar qparams and constants; the table must be computable for the partition's target."""
        data, root = self.input, self.root
        reason = first_reason(check_tensor(data, "input"), check_tensor(root, "output"))
        if reason:
            return reason
        if static_shape(data) != static_shape(root):
            return f"output shape {static_shape(root)} differs from input shape {static_shape(data)}"
        for scale, zero_point, dtype, what in self.qparams:
            reason = check_qparams(scale, zero_point, dtype, what)
            if reason:
                return reason
        for call in self.calls:
            for arg in call.args:
                value = const_value(arg)
                if value is not None and value.size != 1:
                    return f"{op_name(call)} has a constant of shape {value.shape}, not a scalar"
        return (ctx.dequantize_uses.cast_reason(root) if op_name(root) == "qnn.quantize" else None) or \
            self._binary_reason(ctx) or tables.cannot_compute(op_name((self.inner or self).op), ctx.target)

    def _binary_reason(self, ctx) -> str | None:
        if self.inner is None:
            return None
        if op_name(self.inner.root) == "qnn.quantize" and ctx.dequantize_uses.loads_scale(self.inner.root):
            return "its qnn.quantize divides by a loaded scale in TVM-only: not computed as one table"
        return self._rounding_reason(ctx.target)

    def _rounding_reason(self, target) -> str | None:
        """On aarch64 a binary op's requantize rounds as TVM-only's fused kernel does (NEON int32x4 or not),
        a question armfuse answers for a binary composite, not for one inside a table: they stay apart."""
        if self.inner is None or not is_arm_cpu_aarch64(target):
            return None
        return (f"{op_name(self.root)} of a tensor and its {op_name(self.inner.op)}: on aarch64 TVM-only's "
                "requantize rounding depends on its fused kernel, not computed as one table")

    @property
    def writes_strided(self) -> bool:
        """Its output may be stored inside a halo (plan.plan_halos): one image's rows, out_row_stride apart."""
        shape = static_shape(self.root)
        return len(shape) == 4 and shape[0] == 1

    def flippable_output(self, target) -> bool:
        """Its int8 output can be stored flipped (plan.plan_flips): the table's entries ^ 0x80, exact."""
        return True

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Elementwise over the flat tensor: any layout its input and output share."""
        return list(src_perms) == [dst_perm]

    def one_table(self, func: relay.Function) -> bool:
        """Whether the composite ``func`` is one table: no binary root, or in a stagewise conv's kernel
        (refcodegen/lut.py builds the whole function in such a kernel)."""
        return self.inner is None or tables.in_stagewise_kernel(func)

    def table_function(self, func: relay.Function) -> relay.Function:
        """The function of the composite ``func`` whose table TVM computes: itself when ``one_table``,
        else its binary root's table op."""
        return func if self.one_table(func) else relay.Function(func.params, self.inner.root)

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        reason = self._rounding_reason(target)  # partitioned without target=
        if reason:
            raise RefcgError(op_name(self.root), "target", reason + "; pass target= to partition_for_refcg")
        ops = []
        relay.analysis.post_order_visit(func.body, lambda e: ops.append(op_name(e)) if op_name(e) else None)
        table = tables.lookup_table(self.table_function(func), target)
        values = {"size": prod(dst.shape), "ops": " -> ".join(ops), "table": table, **_rows(dst)}
        # the kernels take the table as a pointer to its first entry
        if self.one_table(func):
            return Step(name, NAME, srcs[:1], dst, values, [Call("refcg_lut", ["params", "table[0]"], srcs[:1], dst)])
        values["binary"], values["table_first"] = self._on_every_value(name, target, dst)
        return Step(name, NAME, srcs[:1], dst, values,
                    [Call("refcg_lut_binary", ["params", "table[0]"], srcs[:1], dst)])

    def _on_every_value(self, name: str, target, dst) -> tuple[Step, bool]:
        """The binary root's step on 256 elements (every byte value, and its table entry), as the binary
        family plans it: the runtime composes the two tables with the kernel the unfused op runs."""
        x = relay.var("x", shape=(256,), dtype=dtype_of(self.input))
        t = relay.var("t", shape=(256,), dtype=dtype_of(self.inner.root))
        table_first = not self.root.args[0].same_as(self.input)
        call = relay.Call(self.root.op, [*((t, x) if table_first else (x, t)), *self.root.args[2:]], self.root.attrs)
        srcs = [Buffer(v.name_hint, (256,), str(v.type_annotation.dtype), "scratch", i) for i, v in enumerate((x, t))]
        composed = Buffer("composed", (256,), dst.dtype, "scratch", 2)
        return binary.Binary(call, None).plan(name, relay.Function([x, t], call), srcs, composed, target), table_first


def _rows(dst: Buffer) -> dict:
    """refcg_lut_params' output rows: contiguous, or an image's rows (H of W x C) inside dst's halo; its
    int8 values flipped (Buffer.flipped)."""
    rows = {"row_len": 0, "out_row_stride": 0, "out_xor": 0x80 if dst.flipped else 0}
    if dst.halo is not None:
        physical = dst.physical_shape
        rows["row_len"] = prod(dst.shape) // (physical[0] * (physical[1] - dst.halo[0] - dst.halo[2]))
        rows["out_row_stride"] = physical[2] * physical[3]
    return rows


def parse(body) -> Lut:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Lut.parse(body)
