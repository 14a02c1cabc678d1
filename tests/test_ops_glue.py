"""The glue between quantized layers of real CNNs (refcg.reduce, refcg.copy) against TVM-only: bit-exact.

Reductions are int32 sums and truncating divisions (topi's div), checked on negative sums; data
movement and clamps move integers. Small shapes: each sweep is one TVM-only and one refcg build."""
import numpy as np
from tvm import relay

from conftest import random_int
from models import module
from refcodegen import offload_report, partition_for_refcg
from refcodegen.partition import refcg_functions
from test_ops_common import Cases, const, qparams, reason_for, stays_in_tvm


def test_reductions_match_tvm(tmp_path, rng):
    cases = Cases()
    for dtype in ("int8", "uint8"):
        x = cases.var((2, 3, 5, 4), dtype, rng)  # NHWC-like: TFLite MEAN over H, W
        def wide():  # one cast per reduction, as frontends emit (a shared cast stays in TVM)
            return relay.cast(x, "int32")

        cases.add(relay.qnn.op.requantize(relay.mean(wide(), axis=[1, 2], keepdims=True), *qparams(0.1, -3),
                                          *qparams(0.05, 2), out_dtype="int8"))
        cases.add(relay.cast(relay.mean(wide(), axis=[2, 3]), dtype))  # int8: negative sums, truncated
        cases.add(relay.sum(wide(), axis=[1]))  # int32 out
        cases.add(relay.cast(relay.sum(wide(), axis=[3], keepdims=True), "int8"))  # wrapping cast
        cases.add(relay.cast(relay.nn.adaptive_avg_pool2d(wide(), output_size=(1, 1)), dtype))  # PyTorch
        cases.add(relay.cast(relay.nn.adaptive_avg_pool2d(wide(), output_size=(1, 1), layout="NHWC"), dtype))
        cases.add(relay.mean(wide(), axis=[0, 1, 2, 3]))  # everything, rank-0 result
        cases.add(relay.mean(wide(), axis=[3], exclude=True))  # exclude: axes 0-2
    y = cases.var((1, 4, 3, 3), "int8", rng, -128, -100)  # all negative: truncation differs from floor
    cases.add(relay.mean(relay.cast(y, "int32"), axis=[2, 3]))
    cases.add(relay.cast(relay.nn.global_avg_pool2d(relay.cast(y, "int32")), "int32"))
    # FakeQuantizationToInteger's form: a requantize to int32 (its qparams bound the sum), the pool, a
    # requantize back; per-channel input scales too
    for z, in_scale in ((y, 0.05), (cases.var((1, 4, 5, 7), "uint8", rng), np.float32([0.02, 0.04, 0.01, 0.03]))):
        zp = 0 if z is y else 120
        wide = relay.qnn.op.requantize(z, const(np.float32(in_scale)), const(zp, "int32"), *qparams(0.01, 3),
                                       out_dtype="int32", axis=1)
        cases.add(relay.qnn.op.requantize(relay.nn.global_avg_pool2d(wide), *qparams(0.01, 3), *qparams(0.07, -5),
                                          out_dtype="int8"))
    cases.compare(tmp_path)


def test_a_pool_of_requantized_int32_is_in_the_partition_when_bounded():
    """The int32 sum of a requantize's result is bounded by its qparams: offloaded when the bound fits
    int32, left in TVM with the reason when it may overflow or the int32 tensor comes from elsewhere."""
    x = relay.var("x", shape=(1, 4, 64, 64), dtype="int8")

    def pooled(ratio):
        wide = relay.qnn.op.requantize(x, *qparams(ratio, 0), *qparams(1.0, 0), out_dtype="int32")
        return module([x], relay.nn.global_avg_pool2d(wide))

    assert offload_report(partition_for_refcg(pooled(1.0))).offloaded_ops.get("nn.global_avg_pool2d") == 1
    assert "can overflow" in reason_for(pooled(2.0**20), "nn.global_avg_pool2d")  # the requantize is offloaded
    w = relay.var("w", shape=(1, 4, 64, 64), dtype="int32")
    assert "range is not known" in stays_in_tvm(module([w], relay.nn.global_avg_pool2d(w)), "nn.global_avg_pool2d")


def test_data_movement_matches_tvm(tmp_path, rng):
    cases = Cases()
    for dtype in ("int8", "uint8"):
        x = cases.var((1, 6, 4, 5), dtype, rng)
        cases.add(relay.reshape(x, (1, 2, 3, 20)))
        cases.add(relay.squeeze(x, axis=[0]))
        cases.add(relay.expand_dims(x, axis=2))
        cases.add(relay.nn.batch_flatten(x))
        cases.add(relay.transpose(x, (0, 2, 3, 1)))
        cases.add(relay.transpose(x))
        cases.add(relay.layout_transform(x, "NCHW", "NHWC"))
        cases.add(relay.strided_slice(x, begin=[0, 1, 0, 1], end=[1, 6, 4, 5], strides=[1, 2, 3, 2]))
        cases.add(relay.strided_slice(x, begin=[-3], end=[100], axes=[1]))
        cases.add(relay.strided_slice(x, begin=[0, 1], end=[1, 5], strides=[2]))  # strides shorter than begin
        cases.add(relay.nn.pad(x, ((0, 0), (0, 0), (1, 2), (2, 1)), pad_value=const(-5 if dtype == "int8" else 7,
                                                                                   dtype)))
        cases.add(relay.nn.pad(x, ((0, 1), (1, 0), (0, 0), (0, 0)), pad_value=3))
        cases.add(relay.clip(x, 10, 100))
        cases.add(relay.clip(x, 2.5, 99.9))  # TVM truncates the bounds
        cases.add(relay.maximum(x, const(20, dtype)))
        cases.add(relay.cast(x, "int32"), dtype="int32")
        cases.add(relay.cast(relay.cast(x, "int32"), "int8" if dtype == "uint8" else "uint8"))  # wraps
        cases.add(relay.minimum(const(50, dtype), x))
        parts = relay.split(x, 3, axis=1)  # ShuffleNet's chunk: slices, each offloaded
        cases.add(parts[0])
        cases.add(relay.qnn.op.add(parts[1], parts[2], *qparams(0.1, 2), *qparams(0.1, 2), *qparams(0.2, 1)))
        # channel shuffle (ShuffleNet): reshape -> transpose -> reshape
        shuffled = relay.transpose(relay.reshape(x, (1, 2, 3, 4, 5)), (0, 2, 1, 3, 4))
        cases.add(relay.reshape(shuffled, (1, 6, 4, 5)))
    for layout, mode in (("NCHW", "DCR"), ("NCHW", "CDR"), ("NHWC", "DCR"), ("NHWC", "CDR")):
        # 9 channels for block 2: the last one is read by neither (topi divides the channels down)
        d = cases.var((1, 9, 3, 9) if layout == "NCHW" else (1, 3, 5, 9), "int8", rng)
        cases.add(relay.nn.depth_to_space(d, 2, layout=layout, mode=mode))
        cases.add(relay.nn.depth_to_space(d, 3, layout=layout, mode=mode))
    tail = cases.var((5,), "int8", rng)  # 1-D, padded after only: not one memcpy (it read past the input)
    cases.add(relay.nn.pad(tail, ((0, 3),), pad_value=const(7, "int8")))
    w = cases.var((2, 3), "int32", rng, -1000, 1000)
    cases.add(relay.transpose(w), dtype="int32")
    cases.add(relay.cast(w, "int8"))  # PyTorch: requantize to int32, clip, cast; here it wraps
    cases.compare(tmp_path)


def test_glue_chain_is_one_partition(tmp_path, rng):
    """conv -> pad -> max pool -> mean (TFLite form) -> requantize -> reshape -> mul by a rank-0
    constant: one partition, bit-exact."""
    x = relay.var("x", shape=(1, 8, 8, 4), dtype="int8")
    w = relay.const(random_int(rng, (3, 3, 4, 6), "int8"))
    y = relay.qnn.op.conv2d(x, w, const(0, "int32"), const(0, "int32"), const(0.02), const(0.03), kernel_size=(3, 3),
                            channels=6, padding=(1, 1), data_layout="NHWC", kernel_layout="HWIO")
    y = relay.qnn.op.requantize(y, const(0.0006), const(0, "int32"), const(0.1), const(-2, "int32"), out_dtype="int8")
    y = relay.nn.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)), pad_value=const(-128, "int8"))
    y = relay.nn.max_pool2d(y, (3, 3), strides=(2, 2), layout="NHWC")
    y = relay.mean(relay.cast(y, "int32"), axis=[1, 2], keepdims=True)
    y = relay.qnn.op.requantize(y, const(0.1), const(-2, "int32"), const(0.05), const(1, "int32"), out_dtype="int8")
    y = relay.reshape(y, (1, 6))
    y = relay.qnn.op.mul(y, relay.const(np.array(40, "int8")), *qparams(0.05, 1), *qparams(0.01, 0),
                         *qparams(0.07, 3))
    cases = Cases()
    cases.params, cases.inputs = [x], {"x": random_int(rng, (1, 8, 8, 4), "int8")}
    cases.add(y)
    assert len(refcg_functions(cases.compare(tmp_path))) == 1


def test_glue_rejections():
    x = relay.var("x", shape=(1, 4, 5, 6), dtype="int8")
    assert "not one contiguous run" in reason_for(module([x], relay.mean(relay.cast(x, "int32"), axis=[1, 3])), "mean")
    assert "not a permutation" in stays_in_tvm(module([x], relay.layout_transform(x, "NCHW", "NCHW2c")),
                                               "layout_transform")
    assert "negative stride" in stays_in_tvm(
        module([x], relay.strided_slice(x, begin=[3], end=[0], strides=[-1], axes=[1])), "strided_slice")
    assert "pad mode" in stays_in_tvm(module([x], relay.nn.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), pad_mode="edge")),
                                      "nn.pad")
    f = relay.var("f", shape=(2, 3), dtype="float32")
    assert "dtype float32" in stays_in_tvm(module([f], relay.reshape(f, (3, 2))), "reshape")


def test_pytorch_epilogue_cast_is_fused(tmp_path, rng):
    """PyTorch's conv and linear: requantize to int32 -> clip -> cast(uint8). The cast joins the conv or
    dense kernel, which stores uint8 directly; a clip wider than the cast's type keeps the cast apart."""
    cases = Cases()
    x = cases.var((1, 4, 6, 6), "uint8", rng)
    w = relay.const(random_int(rng, (5, 4, 3, 3), "int8"))
    y = relay.qnn.op.conv2d(x, w, const(60, "int32"), const(0, "int32"), const(0.05), const(0.02), kernel_size=(3, 3),
                            channels=5, padding=(1, 1))
    y = relay.qnn.op.requantize(y, const(0.001), const(0, "int32"), const(0.03), const(7, "int32"), out_dtype="int32")
    cases.add(relay.cast(relay.clip(y, 0, 255), "uint8"))
    d = cases.var((2, 12), "uint8", rng)
    weight = random_int(rng, (7, 12), "int8")

    def linear():
        z = relay.qnn.op.dense(d, relay.const(weight), const(3, "int32"), const(0, "int32"), const(0.05), const(0.02),
                               units=7)
        return relay.qnn.op.requantize(z, const(0.001), const(0, "int32"), const(0.004), const(60, "int32"),
                                       out_dtype="int32")

    cases.add(relay.cast(relay.clip(linear(), 0, 255), "uint8"))
    cases.add(relay.cast(relay.clip(linear(), -300, 300), "int8"))  # wraps: the cast runs on its own
    partitioned = cases.compare(tmp_path)
    kinds = [composite for kernels in offload_report(partitioned).partitions.values() for composite, _ in kernels]
    assert sorted(kinds) == ["refcg.conv2d", "refcg.copy", "refcg.dense", "refcg.dense"], kinds
