"""Checks are total: every check of the pattern table over every dtype the QNN ops' type relations
accept and every layout either accepts the match or rejects it with a reason; partitioning never
raises. A few accepted cases of each family are then built and compared with TVM-only, bit-exact."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import compare_with_tvm, random_int, stays_in_tvm
from models import module
from refcodegen import offload_report, partition_for_refcg
from refcodegen.report import UNMATCHED
from test_ops_common import const

DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "int64", "float32")
INTS = DTYPES[:-1]
# ops whose rejection must carry a check's reason (they always match a pattern in these cases)
ANCHORS = ("qnn.", "nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d")


class Sweep:
    """Cases of one family; case ``i`` has batch ``i + 1`` so that its ops' types (the report's key)
    are its own."""

    def __init__(self, prefix: str):
        self.prefix = prefix  # input names are unique across families (inputs are bound by name)
        self.cases = []  # (label, output expr, vars, output dtype)
        self.vars = []

    def var(self, shape, dtype):
        v = relay.var(f"{self.prefix}{len(self.vars)}", shape=(len(self.cases) + 1, *shape), dtype=dtype)
        self.vars.append(v)
        return v

    def add(self, label, build):
        """``build()`` makes the case with self.var; kept only when Relay's type relations accept it."""
        start = len(self.vars)
        out = build()
        try:
            typed = relay.transform.InferType()(module(self.vars[start:], out))
        except tvm.TVMError:
            del self.vars[start:]
            return
        self.cases.append((label, out, self.vars[start:], typed["main"].body.checked_type.dtype))


def ints(dtype, shape, rng, low=0, high=3):
    return relay.const(rng.integers(low, high, shape).astype(dtype))


def qp(scale=0.05, zp=0):
    return const(scale), const(zp, "int32")


def requantize(x, out_dtype, scale=0.004, axis=-1, clip=None, channels=None):
    in_scale = const(np.linspace(0.002, 0.006, channels).astype("float32") if channels else scale)
    y = relay.qnn.op.requantize(x, in_scale, const(0, "int32"), const(0.05), const(1, "int32"), axis=axis,
                                out_dtype=out_dtype)
    return relay.clip(y, -5, 100) if clip else y


KERNEL_SHAPE = {"O": 4, "H": 3, "W": 3}


def conv_sweep(s, rng):
    def conv(data_dt="int8", w_dt="int8", out_dt="int32", layout=("NCHW", "OIHW"), req=None, groups=1,
             per_channel=False, pad=False):
        dl, kl = layout
        x = s.var((4, 5, 5) if dl == "NCHW" else (5, 5, 4), data_dt)
        if pad:
            widths = [(0, 0), (0, 0), (1, 1), (1, 1)] if dl == "NCHW" else [(0, 0), (1, 1), (1, 1), (0, 0)]
            x = relay.nn.pad(x, widths, const(0, data_dt if data_dt != "float32" else "float32"))
        w = ints(w_dt, [KERNEL_SHAPE.get(a, 4 // groups) for a in kl], rng)
        y = relay.qnn.op.conv2d(x, w, const(0, "int32"), const(0, "int32"), const(0.05),
                                const(np.full(4, 0.01, "float32") if per_channel else 0.01), kernel_size=(3, 3),
                                channels=4, groups=groups, data_layout=dl, kernel_layout=kl, out_dtype=out_dt)
        return requantize(y, req, axis=dl.index("C"), channels=4 if per_channel else None) if req else y

    for data_dt, w_dt in itertools.product(DTYPES, DTYPES):
        s.add(f"conv {data_dt}x{w_dt}", lambda: conv(data_dt, w_dt, req="int8"))
    for layout in itertools.product(("NCHW", "NHWC"), ("OIHW", "HWIO", "HWOI", "OHWI")):
        for groups in (1, 4):
            s.add(f"conv {layout} groups {groups}", lambda: conv(layout=layout, groups=groups, req="uint8",
                                                                 per_channel=True))
    for out_dt, req in itertools.product(DTYPES, (None, *DTYPES)):
        s.add(f"conv out {out_dt} req {req}", lambda: conv("uint8", "int8", out_dt, req=req))
    for data_dt in DTYPES:
        s.add(f"padded conv {data_dt}", lambda: conv(data_dt, pad=True, req="int8"))


def dense_sweep(s, rng):
    for data_dt, w_dt, out_dt, req in itertools.chain(
            ((d, w, "int32", "int8") for d, w in itertools.product(DTYPES, DTYPES)),
            (("int8", "int8", o, r) for o, r in itertools.product(DTYPES, (None, *DTYPES)))):
        def build():
            x = relay.qnn.op.dense(s.var((6,), data_dt), ints(w_dt, (3, 6), rng), const(0, "int32"),
                                   const(0, "int32"), const(0.05), const(0.01), units=3, out_dtype=out_dt)
            return requantize(x, req, clip=req in ("int8", "int16")) if req else x
        s.add(f"dense {data_dt}x{w_dt} out {out_dt} req {req}", build)


def batch_matmul_sweep(s, rng):
    for x_dt, y_dt, req in itertools.chain(((x, y, "int8") for x, y in itertools.product(DTYPES, DTYPES)),
                                           (("uint8", "int8", r) for r in (None, *DTYPES))):
        def build():
            y = relay.qnn.op.batch_matmul(s.var((3, 5), x_dt), s.var((4, 5), y_dt), const(1, "int32"),
                                          const(-2, "int32"), const(0.05), const(0.01))
            return requantize(y, req) if req else y
        s.add(f"batch_matmul {x_dt}x{y_dt} req {req}", build)


def binary_sweep(s, rng):
    for op, (a_dt, b_dt) in itertools.product((relay.qnn.op.add, relay.qnn.op.subtract, relay.qnn.op.mul),
                                              [(d, d) for d in DTYPES] + [("int8", "uint8"), ("uint8", "int8")]):
        s.add(f"{op.__name__} {a_dt} {b_dt}",
              lambda: op(s.var((3, 4), a_dt), s.var((3, 4), b_dt), *qp(), *qp(0.1, 2), *qp(0.2, 1)))


def pool_sweep(s, rng):
    for dtype, layout, acc in itertools.product(DTYPES, ("NCHW", "NHWC"), ("int32", "int16", "float32")):
        shape = (4, 6, 6) if layout == "NCHW" else (6, 6, 4)
        if acc == "int32":
            s.add(f"max_pool {dtype} {layout}", lambda: relay.nn.max_pool2d(s.var(shape, dtype), (2, 2), layout=layout))
        s.add(f"avg_pool {dtype} {layout} in {acc}", lambda: relay.cast(
            relay.nn.avg_pool2d(relay.cast(s.var(shape, dtype), acc), (3, 3), padding=(1, 1), layout=layout), dtype))
        s.add(f"global_avg_pool {dtype} {layout} in {acc}", lambda: relay.cast(
            relay.nn.global_avg_pool2d(relay.cast(s.var(shape, dtype), acc), layout=layout), dtype))


def concatenate_sweep(s, rng):
    for dtype, axis in itertools.product(DTYPES, (0, -1)):
        s.add(f"concatenate {dtype} axis {axis}", lambda: relay.qnn.op.concatenate(
            [s.var((2, 3), dtype), s.var((2, 3), dtype)], [const(0.1), const(0.2)],
            [const(0, "int32"), const(1, "int32")], *qp(0.15, 2), axis=axis))


def requantize_sweep(s, rng):
    for in_dt, out_dt, clip in itertools.product(DTYPES, DTYPES, (False, True)):
        s.add(f"requantize {in_dt} -> {out_dt} clip {clip}",
              lambda: requantize(s.var((3, 5), in_dt), out_dt, clip=clip, channels=5))


def quantize_sweep(s, rng):
    # axis 0 is the batch axis Sweep varies per case: per-axis qparams go along the others
    for dtype, axis, per_axis in itertools.product(DTYPES, (1, 2, -1), (False, True)):
        scale = const(np.linspace(0.05, 0.2, 4).astype("float32")) if per_axis else const(0.1)
        zp = const(np.arange(4), "int32") if per_axis else const(1, "int32")
        s.add(f"quantize -> {dtype} axis {axis} per_axis {per_axis}", lambda: relay.qnn.op.quantize(
            s.var((4, 4), "float32"), scale, zp, axis=axis, out_dtype=dtype))
        s.add(f"dequantize {dtype} axis {axis} per_axis {per_axis}",
              lambda: relay.qnn.op.dequantize(s.var((4, 4), dtype), scale, zp, axis=axis))


def lut_sweep(s, rng):
    for dtype in DTYPES:
        for op in (relay.qnn.op.sigmoid, relay.qnn.op.tanh, relay.qnn.op.hardswish):
            s.add(f"{op.__name__} {dtype}", lambda: op(s.var((8,), dtype), *qp(0.05, 2), *qp(0.01, 1)))
        s.add(f"leaky_relu {dtype}", lambda: relay.qnn.op.leaky_relu(s.var((8,), dtype), 0.1, *qp(0.05, 2),
                                                                       *qp(0.01, 1)))
        s.add(f"dequantize-sigmoid-quantize {dtype}", lambda: relay.qnn.op.quantize(
            relay.sigmoid(relay.qnn.op.dequantize(s.var((8,), dtype), *qp(0.05, 2))), *qp(0.01, 1),
            out_dtype=dtype))
        s.add(f"qnn.softmax {dtype}", lambda: relay.qnn.op.softmax(s.var((8,), dtype), *qp(0.05, 2),
                                                                     *qp(1 / 256, -128)))
        s.add(f"float softmax {dtype}", lambda: relay.qnn.op.quantize(
            relay.nn.softmax(relay.qnn.op.dequantize(s.var((8,), dtype), *qp(0.05, 2))), *qp(1 / 256, 1),
            out_dtype=dtype))


FAMILIES = [conv_sweep, dense_sweep, batch_matmul_sweep, binary_sweep, pool_sweep, concatenate_sweep,
            requantize_sweep, quantize_sweep, lut_sweep]


def ops_left_in_tvm(expr) -> list[str]:
    """Ops of one case that run in TVM (calls of refcg partitions are GlobalVar calls, not ops)."""
    ops = []
    relay.analysis.post_order_visit(expr, lambda e: ops.append(e.op.name) if isinstance(e, relay.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return ops


def test_checks_accept_or_give_a_reason_and_accepted_cases_match_tvm(tmp_path):
    rng = np.random.default_rng(14)
    chosen = []  # fully offloaded cases, a few per family, compared with TVM-only below
    for family in FAMILIES:
        s = Sweep(family.__name__)
        family(s, rng)
        assert s.cases, family.__name__
        mod = module(s.vars, relay.Tuple([out for _, out, _, _ in s.cases]))
        partitioned = partition_for_refcg(mod)  # must not raise
        report = offload_report(partitioned)
        for op, ttype, reason in report.stayed:
            if op.startswith(ANCHORS):
                assert reason and reason != UNMATCHED.get(op, "no refcg pattern covers this op here"), \
                    f"{family.__name__}: {op} {ttype} stayed in TVM without a check's reason"
        fields = partitioned["main"].body.fields
        offloaded = [case for case, field in zip(s.cases, fields) if not ops_left_in_tvm(field)]
        assert offloaded, f"{family.__name__}: nothing offloaded\n{report}"
        chosen += offloaded[::-(-len(offloaded) // 6)]  # six spread over the family keep the build small
    inputs = {}
    for _, _, variables, _ in chosen:
        for v in variables:
            shape, dtype = tuple(int(d) for d in v.type_annotation.shape), v.type_annotation.dtype
            inputs[v.name_hint] = (rng.uniform(-30, 30, shape).astype(dtype) if dtype == "float32" else
                                   random_int(rng, shape, dtype, *((-40000, 40000) if dtype == "int32" else ())))
    outs = [relay.reinterpret(out, "int32") if dtype == "float32" else out for _, out, _, dtype in chosen]
    mod = module([v for _, _, vs, _ in chosen for v in vs], relay.Tuple(outs))
    partitioned = compare_with_tvm(mod, inputs, tmp_path)
    left = [op for op in offload_report(partitioned).stayed_ops if op != "reinterpret"]
    assert not left, [label for label, _, _, _ in chosen]
    print("\n".join(label for label, _, _, _ in chosen))


def conv_requantize(x, rng, out_dtype):
    y = relay.qnn.op.conv2d(x, ints("int8", (4, 4, 3, 3), rng, -5, 5), const(0, "int32"), const(0, "int32"),
                            const(0.1), const(0.1), kernel_size=(3, 3), channels=4)
    return relay.qnn.op.requantize(y, const(0.01), const(0, "int32"), const(0.05), const(0, "int32"),
                                   out_dtype=out_dtype)


def test_issue_14_int16_requantize_after_conv_partitions(rng):
    """It raised KeyError: 'int16' from check_zero_point and aborted partition_for_refcg."""
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    report = offload_report(partition_for_refcg(module([x], conv_requantize(x, rng, "int16"))))
    assert not report.stayed and report.offloaded_ops["qnn.requantize"] == 1, str(report)


def test_a_check_that_raises_rejects_the_op_with_the_exception_as_reason(rng, monkeypatch):
    from refcodegen.ops import conv2d, epilogue

    def broken(*args, **kwargs):
        raise KeyError("int16")

    for family in (conv2d, epilogue):  # the conv's and the requantize's checks call it
        monkeypatch.setattr(family, "check_zero_point", broken)
    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    mod = module([x], conv_requantize(x, rng, "int8"))
    assert "refcg check of qnn.conv2d raised KeyError: 'int16'" in stays_in_tvm(mod, "qnn.conv2d")
    assert "refcg check of qnn.requantize raised KeyError: 'int16'" in stays_in_tvm(mod, "qnn.requantize")
