"""refcg.lut: a unary function of one int8/uint8 tensor, ``qnn.<op>(x, qparams)`` or
``qnn.quantize(f(qnn.dequantize(x)))``, computed as the 256-entry table TVM-only computes for it
(refcodegen/lut.py builds it; runtime refcg_lut looks it up)."""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relay
from tvm.relay.dataflow_pattern import is_constant, is_op, wildcard

from .. import lut as tables
from .base import (Call, Step, any_of, check_qparams, check_tensor, const_value, constants, dequantized, dtype_of,
                   first_reason, op_name, prod, static_shape)

NAME = "lut"
NEON_REQUANTIZE = False
# qnn unary ops TVM 0.19 canonicalizes to a function of each 8-bit value (a lookup table)
QNN_OPS = ("qnn.sigmoid", "qnn.tanh", "qnn.hardswish", "qnn.leaky_relu", "qnn.exp", "qnn.log", "qnn.abs")
FLOAT_OPS = ("sigmoid", "tanh", "nn.leaky_relu")


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


def patterns() -> list:
    # before refcg.quantize: the float forms end in a qnn.quantize that would otherwise run alone
    qnn_ops = [is_op(name)(wildcard(), *constants(4)) for name in QNN_OPS]
    x = dequantized()
    float_op = any_of([is_op(name)(x) for name in FLOAT_OPS] + [hardswish_of(x), hardsigmoid_of(x)])
    return [(p, Lut.parse) for p in (*qnn_ops, is_op("qnn.quantize")(float_op, *constants(2)))]


@dataclass
class Lut:
    """``op``: the call the report names; ``input``: the 8-bit tensor; ``calls``: every call of the
    chain; ``qparams``: its (scale, zero point, quantized dtype, name) quadruples."""

    root: relay.Call
    op: relay.Call
    input: relay.Expr
    calls: list
    qparams: list

    @classmethod
    def parse(cls, root) -> "Lut":
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
            tables.cannot_compute(op_name(self.op), ctx.target)

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Elementwise over the flat tensor: any layout its input and output share."""
        return list(src_perms) == [dst_perm]

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        ops = []
        relay.analysis.post_order_visit(func.body, lambda e: ops.append(op_name(e)) if op_name(e) else None)
        values = {"size": prod(dst.shape), "ops": " -> ".join(ops), "table": tables.lookup_table(func, target)}
        # refcg_lut takes the table as a pointer to its first entry
        return Step(name, NAME, srcs[:1], dst, values, [Call("refcg_lut", ["params", "table[0]"], srcs[:1], dst)])


def parse(body) -> Lut:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Lut.parse(body)
