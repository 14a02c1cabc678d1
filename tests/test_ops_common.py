"""Helpers shared by the operator sweeps (tests/test_ops_*.py), and the cross-op tests:
chains in one partition, partial offload, rejections that keep an op in TVM."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import TARGET_F32, TARGET_LLVM, compare_with_tvm, random_int, stays_in_tvm  # noqa: F401  (test_ops_*)
from models import module, qconv_block
from refcodegen import offload_report, partition_for_refcg
from refcodegen.ops.quantize import scale_loaded
from refcodegen.partition import refcg_functions

# (target, requantize_config overrides): TVM-only numerics refcg must reproduce
NUMERICS = {
    "llvm": (TARGET_LLVM, {}),
    "tonearest": (TARGET_LLVM, {"rounding": "TONEAREST"}),
    "float32": (TARGET_F32, {}),  # skylake: sse4.1 and FMA (fused multiply-add in the requantize)
    "float32-nofma": ("llvm -mcpu=sandybridge", {}),  # sse4.1 (AVX) without FMA
    "float64": (TARGET_LLVM, {"compute_dtype": "float64"}),
}


def const(value, dtype="float32"):
    return relay.const(np.array(value, dtype=dtype))


def qparams(scale, zero_point):
    return const(scale), const(zero_point, "int32")


def requantize_config(target: str, config: dict):
    """relay.qnn.op.requantize_config(**config) made under ``target``: TVM fills the fields not given
    from the target in scope when the config is made (compute_dtype float32 with sse4.1), so a config
    made outside any target forces int64 even for ``llvm -mcpu=skylake``."""
    with tvm.target.Target(target):
        return relay.qnn.op.requantize_config(**config)


def compare(mod, inputs, tmp_path, numerics="llvm", **kw):
    """compare_with_tvm under one of NUMERICS, or a (target, requantize_config) pair."""
    target, config = NUMERICS[numerics] if isinstance(numerics, str) else numerics
    with requantize_config(target, config):
        return compare_with_tvm(mod, inputs, tmp_path, target=target, **kw)


class Cases:
    """Several independent test graphs built into one module (one tuple output each), so a
    sweep costs one TVM-only and one refcg build per numerics setting instead of one per case."""

    def __init__(self):
        self.params, self.outputs, self.inputs = [], [], {}

    def var(self, shape, dtype, rng, low=None, high=None):
        name = f"v{len(self.inputs)}"
        self.params.append(relay.var(name, shape=shape, dtype=dtype))
        self.inputs[name] = random_int(rng, shape, dtype, low, high)
        return self.params[-1]

    def add(self, output, dtype="int8"):
        """``dtype``: float32 outputs are compared by their bits (compare_with_tvm compares integers)."""
        self.outputs.append(relay.reinterpret(output, "int32") if dtype == "float32" else output)

    def compare(self, tmp_path, numerics="llvm", **kw):
        """Bit-exact against TVM-only, and every op of every case offloaded."""
        mod = module(self.params, relay.Tuple(self.outputs))
        partitioned = compare(mod, self.inputs, tmp_path, numerics, **kw)
        report = offload_report(partitioned)
        assert not [op for op in report.stayed_ops if op != "reinterpret"], str(report)
        return partitioned


def reason_for(mod, op):
    """The offload-report reasons for ``op`` after partitioning; the op must have stayed in TVM.

    Other ops may still be offloaded (a requantize behind a rejected conv runs in refcg alone).
    """
    report = offload_report(partition_for_refcg(mod))
    reasons = [reason for name, _, reason in report.stayed if name == op]
    assert reasons, str(report)
    return "; ".join(reasons)


def qadd(a, b, sa=0.1, za=0, sb=0.1, zb=0, so=0.1, zo=0):
    return relay.qnn.op.add(a, b, *qparams(sa, za), *qparams(sb, zb), *qparams(so, zo))


@pytest.mark.parametrize("numerics", ["llvm", "float32"])
def test_resnet_style_chain_is_one_partition(tmp_path, rng, numerics):
    """conv -> conv -> residual qnn.add -> avg pool -> dense: one partition, one C function."""
    shape = (1, 8, 10, 10)
    x = relay.var("x", shape=shape, dtype="int8")
    w_range = (-63, 63)  # TVM-only's float32 target uses vpmaddubsw (saturates on full-range data)
    a = qconv_block(x, rng, in_c=8, out_c=8, per_channel=True, clip=(0, 127), weight_range=w_range,
                    output_scale=0.08)
    b = qconv_block(a, rng, in_c=8, out_c=8, input_scale=0.08, output_scale=0.12, output_zp=3,
                    weight_range=w_range)
    y = qadd(a, b, 0.08, 0, 0.12, 3, 0.15, -2)
    y = relay.cast(relay.nn.global_avg_pool2d(relay.cast(y, "int32")), "int8")
    y = relay.nn.batch_flatten(y)
    w = relay.const(random_int(rng, (5, 8), "int8", -63, 63))
    y = relay.qnn.op.dense(y, w, const(-2, "int32"), const(0, "int32"), const(0.15), const(0.01), units=5)
    y = relay.qnn.op.requantize(y, const(0.0015), const(0, "int32"), const(0.05), const(1, "int32"))
    partitioned = compare(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, numerics)
    assert len(refcg_functions(partitioned)) == 1
    report = offload_report(partitioned)
    assert not report.stayed, str(report)
    assert [c for c, _ in next(iter(report.partitions.values()))] == [
        "refcg.conv2d", "refcg.conv2d", "refcg.binary", "refcg.pool2d", "refcg.dense"], str(report)


def test_partial_offload_float_softmax_tail_and_transpose(tmp_path, rng):
    """A transpose and a slice between quantized layers run in refcg (refcg.copy); a float softmax tail
    (no quantize after it) stays in TVM."""
    x = relay.var("x", shape=(2, 6), dtype="int8")
    w = relay.const(random_int(rng, (6, 6), "int8"))
    y = relay.qnn.op.dense(x, w, const(1, "int32"), const(0, "int32"), const(0.05), const(0.01), units=6)
    y = relay.qnn.op.requantize(y, const(0.0005), const(0, "int32"), const(0.07), const(0, "int32"))
    y = relay.transpose(y)
    y = relay.strided_slice(y, begin=[0, 0], end=[4, 2])
    y = qadd(y, relay.const(random_int(rng, (4, 1), "int8")), 0.07, 0, 0.02, 5, 0.1, 1)
    y = relay.nn.softmax(relay.qnn.op.dequantize(y, const(0.1), const(1, "int32")))
    partitioned = compare(module([x], y), {"x": random_int(rng, (2, 6), "int8")}, tmp_path, expect_partitions=1)
    stayed = offload_report(partitioned).stayed_ops
    assert "transpose" not in stayed and "strided_slice" not in stayed and stayed["nn.softmax"] == 1


def test_graph_with_nothing_to_offload():
    x = relay.var("x", shape=(1, 8), dtype="float32")
    assert "no refcg pattern covers this op" in stays_in_tvm(module([x], relay.nn.softmax(relay.nn.relu(x))), "nn.softmax")


def test_scratch_buffers_are_reused_along_a_chain(rng):
    from refcodegen.plan import build_plan
    from refcodegen.scoped_fold import scoped_fold

    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    y = x
    for _ in range(5):
        y = qconv_block(y, rng, in_c=4, out_c=4, input_scale=0.1)
    (_, func), = refcg_functions(partition_for_refcg(module([x], y)))
    plan = build_plan(scoped_fold(func), "p", tvm.target.Target("llvm"))
    assert len(plan.steps) == 5 and len(plan.scratch) == 2  # ping-pong, not one buffer per layer


def scale_loaded_marks(partitioned) -> int:
    """How many composites the partitioning marked as dividing by their loaded scale."""
    marks = []
    for _, func in refcg_functions(partitioned):
        relay.analysis.post_order_visit(func.body, lambda e: marks.append(e) if isinstance(e, relay.Function)
                                        and scale_loaded(e) else None)
    return len(marks)


def test_scratch_tensors_sit_centred_in_their_slots(rng, tmp_path):
    """A slot holds tensors of different sizes in turn: each sits centred (plan.offset), so the two
    halves 2 threads split a tensor into fall on the same lines for every tensor of the slot; the
    generated C reads them there (bit-exact with TVM-only)."""
    from refcodegen import codegen
    from refcodegen.plan import build_plan
    from refcodegen.scoped_fold import scoped_fold

    x = relay.var("x", shape=(1, 4, 48, 48), dtype="int8")
    y = x
    for c_in, c_out in ((4, 32), (32, 4), (4, 8), (8, 4)):  # 72 KB, 9 KB, 18 KB, 9 KB
        y = qconv_block(y, rng, in_c=c_in, out_c=c_out, input_scale=0.1)
    mod = module([x], y)
    compare(mod, {"x": random_int(rng, (1, 4, 48, 48), "int8")}, tmp_path, expect_partitions=1)
    (_, func), = refcg_functions(partition_for_refcg(mod, target="llvm"))
    plan = build_plan(scoped_fold(func), "p", tvm.target.Target("llvm"))
    placed = [(buf, plan.scratch[buf.index].nbytes) for step in plan.steps for buf in (*step.inputs, step.output)
              if buf.kind == "scratch"]
    for buf, size in placed:
        offset = plan.offset(buf)
        assert offset % 4096 == 0 and 0 <= offset and offset + buf.nbytes <= size
        assert abs(offset + buf.nbytes / 2 - size / 2) < 4096, (buf, offset, size)
    assert any(plan.offset(buf) for buf, _ in placed)
    c_code = codegen.generate_c(func.with_attr("global_symbol", "p"))[1]
    assert all(plan.pointer(buf) in c_code for buf, _ in placed)
