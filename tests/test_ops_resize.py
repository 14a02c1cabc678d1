"""image.resize2d nearest_neighbor (refcg.copy through index tables, refcodegen/resize.py) against TVM-only:
bit-exact for every coordinate_transformation_mode and rounding_method TVM 0.19 accepts for nearest, NCHW
and NHWC, up- and downsampling, ratios float32 cannot represent. Where the float index depends on whether
LLVM fuses a multiply-add (FMA targets, or no target given), the resize stays in TVM. Small shapes: each
sweep is one TVM-only and one refcg build per target."""
import itertools

import numpy as np
import pytest
from tvm import relay

from conftest import build_and_load, random_int, run, stays_in_tvm
from models import module, qconv_block
from refcodegen import offload_report, partition_for_refcg, resize as resize_tables
from test_ops_common import Cases, compare

FMA_TARGET = "llvm -mcpu=skylake"  # FMA without AVX-512: it runs on every x86 host CI may have
MODES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "align_corners")
ROUNDINGS = ("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
# (in H, in W) -> (out H, out W): non-representable ratios both ways, 300 -> 17, integer up/downsampling
# (asymmetric divides integers), identity, a 1-wide output
SHAPES = [((7, 13), (13, 7)), ((13, 7), (7, 13)), ((3, 300), (5, 17)), ((5, 4), (10, 12)), ((8, 6), (4, 3)),
          ((6, 5), (6, 1)), ((17, 3), (300, 3))]
# one axis (mode, rounding, in, out) whose float index differs fused and unfused (resize.nearest_indices)
SPLIT = [("half_pixel", "round_prefer_floor", 4, 13), ("tf_half_pixel_for_nn", "round_prefer_floor", 2, 6),
         ("align_corners", "round_prefer_floor", 2, 25), ("half_pixel", "round", 4, 50),
         ("pytorch_half_pixel", "round", 6, 75), ("half_pixel", "round_prefer_ceil", 2, 41)]


def nearest(x, size, layout, mode, rounding):
    return relay.image.resize2d(x, size, None, layout, "nearest_neighbor", mode, rounding)


def shaped(layout, c, hw):
    return (1, c, *hw) if layout == "NCHW" else (1, *hw, c)


@pytest.mark.parametrize("target", ["llvm", FMA_TARGET])
def test_resize_nearest_matches_tvm(tmp_path, rng, target):
    """Every mode x rounding once, on a shape, layout and dtype drawn in turn; all offloaded."""
    cases = Cases()
    layouts, dtypes, shapes = itertools.cycle(("NCHW", "NHWC")), itertools.cycle(("int8", "uint8", "int16")), \
        itertools.cycle(SHAPES)
    for mode, rounding in itertools.product(MODES, ROUNDINGS):
        (in_hw, out_hw), layout, dtype = next(shapes), next(layouts), next(dtypes)
        if mode == "align_corners" and 1 in out_hw:
            in_hw, out_hw = next(shapes)
        x = cases.var(shaped(layout, 3, in_hw), dtype, rng)
        cases.add(nearest(x, out_hw, layout, mode, rounding))
    with_roi = cases.var((1, 2, 5, 7), "int8", rng)  # roi is read only by tf_crop_and_resize
    cases.add(relay.image.resize2d(with_roi, (9, 4), [0.1, 0.2, 0.7, 0.9], "NCHW", "nearest_neighbor", "half_pixel",
                                   "round_prefer_ceil"))
    report = offload_report(cases.compare(tmp_path, (target, {})))
    assert report.offloaded_ops["image.resize2d"] == len(MODES) * len(ROUNDINGS) + 1, str(report)


def test_fma_dependent_index_stays_in_tvm_unless_the_target_has_no_fma(tmp_path):
    """On SPLIT axes the fused and unfused float index give different tables. TVM-only's FMA build reads
    the fused one on some (H, the outer loop) and the unfused one on others (W, whose index LLVM folds to
    constants in an unrolled loop): neither table is certain, so refcg leaves these to TVM for an FMA
    target or no target, and offloads them, bit-exact, for targets without FMA."""
    outs, params, inputs, tables = [], [], {}, []
    for k, (mode, rounding, size, out) in enumerate(SPLIT):
        fused = resize_tables.nearest_indices(size, out, mode, rounding, fused=True)
        unfused = resize_tables.nearest_indices(size, out, mode, rounding, fused=False)
        assert not np.array_equal(fused, unfused), (mode, rounding, size, out)
        for axis in (2, 3):  # NCHW: the output is the index table of this axis, repeated along the other
            shape = [1, 1, 3, 3]
            shape[axis] = size
            x = relay.var(f"x{k}_{axis}", shape=shape, dtype="int16")
            params.append(x)
            inputs[x.name_hint] = np.broadcast_to(np.arange(size, dtype="int16").reshape(
                [size if a == axis else 1 for a in range(4)]), shape).copy()
            outs.append(nearest(x, [out if a == axis else 3 for a in (2, 3)], "NCHW", mode, rounding))
            tables.append((axis, fused, unfused))
    mod = module(params, relay.Tuple(outs))
    for target in (None, FMA_TARGET):
        reason = stays_in_tvm(mod, "image.resize2d", target=target)
        assert "fuses a float multiply-add" in reason, reason
    read = [np.moveaxis(got, axis, -1)[0, 0, 0] for (axis, _, _), got in
            zip(tables, run(build_and_load(mod, FMA_TARGET, tmp_path, "tvm_fma"), inputs))]
    assert any(not np.array_equal(r, unfused) for r, (_, _, unfused) in zip(read, tables)), "FMA build never fused"
    assert any(not np.array_equal(r, fused) for r, (_, fused, _) in zip(read, tables)), "FMA build always fused"
    for target in ("llvm", "llvm -mcpu=sandybridge"):  # no FMA: the unfused table, offloaded
        want = run(build_and_load(mod, target, tmp_path, "tvm_only"), inputs)
        partitioned = partition_for_refcg(mod, target=target)
        assert offload_report(partitioned).offloaded_ops["image.resize2d"] == len(outs), target
        got = run(build_and_load(partitioned, target, tmp_path, "refcg"), inputs)
        for case, w, g in zip(tables, want, got):
            assert np.array_equal(w, g), (target, case)


@pytest.mark.parametrize("layout,mode,rounding,target", [
    ("NHWC", "half_pixel", "round_prefer_ceil", FMA_TARGET),  # TFLite RESIZE_NEAREST_NEIGHBOR, half_pixel_centers
    ("NCHW", "half_pixel", "round_prefer_floor", "llvm"),  # ONNX Resize (QDQ, after FakeQuantizationToInteger)
])
def test_conv_resize_conv_is_one_partition(tmp_path, rng, layout, mode, rounding, target):
    """conv -> resize (7x5 -> 13x9, not an integer ratio) -> conv: one partition, the resize inside it."""
    shape = shaped(layout, 4, (7, 5))
    x = relay.var("x", shape=shape, dtype="int8")
    w_range = (-63, 63)  # TVM-only's float32 targets use vpmaddubsw (saturates on full-range data)
    y = qconv_block(x, rng, in_c=4, out_c=6, layout=layout, weight_range=w_range, output_scale=0.08)
    y = nearest(y, (13, 9), layout, mode, rounding)
    y = qconv_block(y, rng, in_c=6, out_c=5, layout=layout, input_scale=0.08, weight_range=w_range)
    partitioned = compare(module([x], y), {"x": random_int(rng, shape, "int8")}, tmp_path, (target, {}),
                          expect_partitions=1)
    report = offload_report(partitioned)
    assert not report.stayed, str(report)
    assert [c for c, _ in next(iter(report.partitions.values()))] == [
        "refcg.conv2d", "refcg.copy", "refcg.conv2d"], str(report)


def test_resize_rejections():
    x = relay.var("x", shape=(1, 3, 4, 5), dtype="int8")
    assert "only nearest_neighbor" in stays_in_tvm(
        module([x], relay.image.resize2d(x, (8, 10), None, "NCHW", "linear")), "image.resize2d")
    assert "tf_crop_and_resize" in stays_in_tvm(
        module([x], relay.image.resize2d(x, (8, 10), [0.1, 0.1, 0.9, 0.9], "NCHW", "nearest_neighbor",
                                         "tf_crop_and_resize")), "image.resize2d")
    assert "divides by zero" in stays_in_tvm(module([x], nearest(x, (1, 10), "NCHW", "align_corners", "")),
                                             "image.resize2d")
    w = relay.var("w", shape=(1, 3, 4, 5), dtype="int32")
    assert "through float32" in stays_in_tvm(module([w], nearest(w, (8, 10), "NCHW", "asymmetric", "")),
                                             "image.resize2d")


def qdq_nearest(x, size, scale, zero_point, out_dtype=None, out_scale=None):
    """PyTorch's quantized nearest upsample as TVM's importer writes it (qnn_torch.apply_with_fp32_fallback)."""
    s, z = relay.const(np.float32(scale)), relay.const(zero_point)
    y = nearest(relay.qnn.op.dequantize(x, s, z), size, "NCHW", "asymmetric", "")
    out_s = s if out_scale is None else relay.const(np.float32(out_scale))
    return relay.qnn.op.quantize(y, out_s, z, out_dtype=out_dtype or x.type_annotation.dtype)


@pytest.mark.parametrize("target", ["llvm", FMA_TARGET])
def test_qdq_nearest_resize_is_the_8bit_resize(tmp_path, rng, target):
    """quantize(dequantize(v)) is v for every 8-bit v and normal scale: full-range int8 and uint8 through
    scales float32 rounds (0.0137, 3e-7, 1e5), extreme zero points; one refcg.qdq_resize each."""
    cases = Cases()
    for dtype, scale, zp in [("uint8", 0.0137, 0), ("uint8", 3e-7, 255), ("int8", 1e5, -128), ("int8", 0.37, 127),
                             ("uint8", 2.0 ** -60, 128)]:
        cases.add(qdq_nearest(cases.var((1, 2, 3, 5), dtype, rng), (6, 10), scale, zp))
    report = offload_report(cases.compare(tmp_path, (target, {})))
    assert not report.stayed, str(report)
    assert [c for part in report.partitions.values() for c, _ in part] == ["refcg.qdq_resize"] * 5, str(report)


def test_qdq_nearest_resize_rejections():
    """Anything but the identity around the resize stays out of refcg.qdq_resize, with the reason."""
    x = relay.var("x", shape=(1, 3, 4, 5), dtype="uint8")
    for kw, reason in [({"out_scale": 0.2}, "scale or zero point differ"),
                       ({"out_dtype": "int8"}, "quantize to int8 of a dequantized uint8"),
                       ({"scale": 1e-30}, "outside [2**-60, 2**60]")]:
        args = {"scale": 0.1, **kw}
        report = offload_report(partition_for_refcg(module([x], qdq_nearest(x, (8, 10), args.pop("scale"), 3, **args)),
                                                    target="llvm"))
        assert "refcg.qdq_resize" not in str(report) and reason in str(report), str(report)
