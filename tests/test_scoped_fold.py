"""Scoped legalize-and-fold: constant QNN subgraphs fold inside the codegen, every other QNN op keeps
its qparams, and the main pipeline never touches the partition (issue: upstream BYOC + qnn.quantize(const))."""
import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import compare_with_tvm, spy_on_codegen
from refcodegen.scoped_fold import scoped_fold


def calls(expr, name):
    found = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == name:
            found.append(node)

    relay.analysis.post_order_visit(expr, visit)
    return found


def quantize_const(value, scale, zp=0, axis=-1, out_dtype="int8"):
    """A weight the way the PyTorch frontend and FakeQuantizationToInteger hand it over."""
    return relay.qnn.op.quantize(relay.const(value.astype("float32")), relay.const(scale), relay.const(zp),
                                 axis=axis, out_dtype=out_dtype)


def seed_model(rng, per_channel: bool):
    """float input -> batch_norm -> quantize -> conv(quantize(const) weights, quantize(const) int32 bias)
    -> requantize -> relu -> dequantize/quantize -> dense(quantize(const)) -> requantize -> dequantize."""
    x = relay.var("x", shape=(1, 8, 10, 10), dtype="float32")
    bn = [relay.const(rng.uniform(0.5, 1.5, 8).astype("float32")) for _ in range(2)] + [
        relay.const(rng.uniform(-0.2, 0.2, 8).astype("float32")), relay.const(rng.uniform(0.5, 2, 8).astype("float32"))]
    y = relay.nn.batch_norm(x, *bn)[0]
    in_scale = np.float32(0.03)
    q = relay.qnn.op.quantize(y, relay.const(in_scale), relay.const(2), out_dtype="int8")
    w = rng.normal(0, 0.05, (16, 8, 3, 3))
    w_scale = (np.abs(w).reshape(16, -1).max(1) / 127 if per_channel else np.array(np.abs(w).max() / 127)).astype("float32")
    bias_scale = (in_scale * w_scale).astype("float32")
    conv = relay.qnn.op.conv2d(q, quantize_const(w, w_scale, axis=0), relay.const(2), relay.const(0),
                               relay.const(in_scale), relay.const(w_scale), kernel_size=(3, 3), channels=16,
                               padding=(1, 1))
    bias = quantize_const(rng.normal(0, 0.1, 16), bias_scale, axis=0, out_dtype="int32")
    conv = relay.nn.bias_add(conv, bias)
    act_scale = np.float32(0.02)
    y = relay.qnn.op.requantize(conv, relay.const(bias_scale), relay.const(0), relay.const(act_scale),
                                relay.const(-128), axis=1, out_dtype="int8")
    y = relay.clip(y, -128, 127)
    y = relay.reshape(y, (1, 16 * 10 * 10))
    w2 = rng.normal(0, 0.02, (10, 1600))
    w2_scale = (np.abs(w2).max(1) / 127 if per_channel else np.array(np.abs(w2).max() / 127)).astype("float32")
    d = relay.qnn.op.dense(y, quantize_const(w2, w2_scale, axis=0), relay.const(-128), relay.const(0),
                           relay.const(act_scale), relay.const(w2_scale), units=10)
    d = relay.qnn.op.requantize(d, relay.const((act_scale * w2_scale).astype("float32")), relay.const(0),
                                relay.const(np.float32(0.05)), relay.const(0), axis=1, out_dtype="int8")
    out = relay.qnn.op.dequantize(d, relay.const(np.float32(0.05)), relay.const(0))
    return tvm.IRModule.from_expr(relay.Function([x], out))


@pytest.fixture
def stages(monkeypatch):
    seen = {}
    spy_on_codegen(monkeypatch, lambda stage, func: seen.setdefault(stage, []).append(func))
    return seen


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_const_weights_fold_in_codegen_and_stay_bit_exact(tmp_path, rng, stages, per_channel):
    mod = seed_model(rng, per_channel)
    data = {"x": rng.normal(0, 1, (1, 8, 10, 10)).astype("float32")}
    compare_with_tvm(mod, data, tmp_path)
    received, folded = stages["received"], stages["folded"]
    assert received and len(received) == len(folded)
    # the partitions arrive with the weights still as qnn.quantize(const fp32) ...
    assert any(calls(f, "qnn.quantize") for f in received)
    for before, after in zip(received, folded):
        # ... and leave the scoped fold with no quantize of a constant left
        assert not [c for c in calls(after, "qnn.quantize") if isinstance(c.args[0], relay.Constant)]
        for name in ("qnn.conv2d", "qnn.dense", "qnn.requantize"):
            assert len(calls(before, name)) == len(calls(after, name)), name
            for b, a in zip(calls(before, name), calls(after, name)):
                # qparams (everything but the data and weight operands) keep their exact values
                for x, y in zip(b.args[2:] if name != "qnn.requantize" else b.args[1:],
                                a.args[2:] if name != "qnn.requantize" else a.args[1:]):
                    np.testing.assert_array_equal(x.data.numpy(), y.data.numpy())
    conv_weights = [c.args[1] for f in folded for c in calls(f, "qnn.conv2d")]
    assert conv_weights and all(isinstance(w, relay.Constant) and w.data.dtype == "int8" for w in conv_weights)


def test_main_pipeline_does_not_touch_the_partition(rng, stages):
    """What relay.build hands over equals what partition_for_refcg produced (no FuseOps, Legalize, folding)."""
    from refcodegen import partition_for_refcg
    from refcodegen.partition import refcg_functions

    mod = partition_for_refcg(seed_model(rng, True))
    before = {gv.name_hint: func for gv, func in refcg_functions(mod)}
    with tvm.transform.PassContext(opt_level=3):
        relay.build(mod, target="llvm")
    def composite_bodies(func):
        bodies = []
        relay.analysis.post_order_visit(func, lambda n: bodies.append(n.body) if isinstance(n, relay.Function)
                                        and n.attrs and "Composite" in n.attrs.keys() else None)
        return bodies

    assert len(stages["received"]) == len(before)
    for func in stages["received"]:
        original = before[str(func.attrs["global_symbol"])]
        # TVM only adds bookkeeping attributes (hash, layouts); every op and constant is as partitioned
        pairs = list(zip(composite_bodies(func), composite_bodies(original)))
        assert pairs and len(pairs) == len(composite_bodies(original))
        assert all(tvm.ir.structural_equal(a, b, map_free_vars=True) for a, b in pairs)


def test_scoped_fold_folds_layout_ops_on_weights_only():
    x = relay.var("x", shape=(1, 4), dtype="int8")
    w = relay.transpose(relay.cast(relay.const(np.arange(12, dtype="int32").reshape(3, 4)), "int8"))
    body = relay.qnn.op.dense(x, relay.transpose(w), relay.const(1), relay.const(0), relay.const(0.5),
                              relay.const(0.25), units=3)
    func = relay.Function([x], body).with_attr("Primitive", 1)
    folded = scoped_fold(func)
    (dense,) = calls(folded, "qnn.dense")
    assert isinstance(dense.args[1], relay.Constant)
    np.testing.assert_array_equal(dense.args[1].data.numpy(), np.arange(12).reshape(3, 4))
    assert int(dense.args[2].data.numpy()) == 1 and float(dense.args[4].data.numpy()) == 0.5
