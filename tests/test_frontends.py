"""Models quantized by ONNX Runtime and by PyTorch, imported by TVM's frontends, offloaded to refcg.

Each model: refcg vs TVM-only bit-exact (compare_with_tvm), the QNN offload fraction checked
against a floor, and the difference to the quantizer's own runtime printed (run with -s to see
it; ONNX Runtime and PyTorch round differently from TVM, so it is reported, not asserted).
"""
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

from conftest import assert_not_degenerate, compare_with_tvm
from examples import onnx_models, torch_models
from refcodegen import RefcgError, offload_report, partition_for_refcg, runner
from refcodegen.partition import refcg_functions
from refcodegen.frontends import load_model, parse_shape

# The goal: at least 95% of each model's QNN ops offloaded. At the last measurement all
# reached 100%; the glue between them (int32 average pools, casts, reshapes, pads) is offloaded
# too since refcg.reduce/refcg.copy. The test prints what stays.
OFFLOAD_FLOOR = {"tiny_cnn": 0.95, "mobilenet_v2": 0.95, "resnet18": 0.95, "mlp": 0.95, "pytorch": 0.95,
                 "upsample_cnn": 1.0, "pytorch_upsample": 1.0}


# Shallower than the demo's networks, same layer kinds: TVM-only's own build of the reference
# dominates the run time (about 1 s per layer). make demo / refcg bench run the full depth.
TEST_MODELS = {
    "tiny_cnn": onnx_models.tiny_cnn,
    "mobilenet_v2": partial(onnx_models.mobilenet_v2, size=16, blocks=3),
    "resnet18": partial(onnx_models.resnet18, size=16, blocks=1),
    "mlp": onnx_models.mlp_block,
    "upsample_cnn": onnx_models.upsample_cnn,
}


def quantized_onnx(tmp_path, name, fmt, per_channel, activation):
    path = str(tmp_path / f"{name}_{fmt}_{activation}{'_pc' if per_channel else ''}.onnx")
    return onnx_models.quantize(TEST_MODELS[name](), path, fmt=fmt, per_channel=per_channel,
                                activation=activation)


def check_model(model, inputs, tmp_path, name, reference_outputs):
    """Bit-exact with TVM-only on outputs that are not degenerate, offload fraction at or above the
    floor; returns the report."""
    outputs = []
    # runner.prepared already ran the frontend clean-ups (FakeQuantizationToInteger): not twice
    partitioned = compare_with_tvm(runner.prepared(model), inputs, tmp_path, outputs=outputs,
                                   fold_batch_norm=False)
    assert_not_degenerate(outputs)
    report = offload_report(partitioned)
    diff = runner.max_abs_diff(reference_outputs, outputs)
    print(f"\n{name}: QNN ops offloaded {report.qnn_fraction():.1%}, max |refcg - quantizer runtime| = "
          f"{diff:.4g}, stayed in TVM: {dict(report.stayed_ops)}")
    assert report.qnn_fraction() >= OFFLOAD_FLOOR[name.split("[")[0]], str(report)
    return report


def check_onnx(tmp_path, name, fmt, per_channel, activation):
    path = quantized_onnx(tmp_path, name, fmt, per_channel, activation)
    model = load_model(path)
    assert model.partition_options == {"fake_quantization_to_integer": True}
    inputs = onnx_models.example_input(path)
    ort = runner.onnxruntime_run(runner.onnxruntime_session(path), inputs)
    return check_model(model, inputs, tmp_path, f"{name}[{fmt},{activation},pc={per_channel}]", ort)


# Each format meets each weight granularity and each activation dtype once (4 of the 8 combinations).
FORMATS = [("qdq", False, "int8"), ("qdq", True, "uint8"), ("qoperator", False, "uint8"),
           ("qoperator", True, "int8")]


@pytest.mark.parametrize("fmt,per_channel,activation", FORMATS)
def test_onnx_quantizer_formats(tmp_path, fmt, per_channel, activation):
    report = check_onnx(tmp_path, "tiny_cnn", fmt, per_channel, activation)
    kinds = {composite for kernels in report.partitions.values() for composite, _ in kernels}
    assert "refcg.conv2d" in kinds


@pytest.mark.parametrize("name,fmt,per_channel,activation", [
    ("mobilenet_v2", "qdq", True, "int8"),
    ("resnet18", "qoperator", False, "uint8"),
    ("mlp", "qdq", True, "int8"),
])
def test_onnx_networks(tmp_path, name, fmt, per_channel, activation):
    check_onnx(tmp_path, name, fmt, per_channel, activation)


def test_onnx_nearest_resize_is_inside_the_partition(tmp_path):
    """ONNX Resize nearest between convs (QDQ: after FakeQuantizationToInteger, image.resize2d on int8;
    ONNX's defaults half_pixel + round_prefer_floor to 17x13, then asymmetric + floor by 2): one partition."""
    report = check_onnx(tmp_path, "upsample_cnn", "qdq", False, "int8")
    assert len(report.partitions) == 1 and not report.stayed, str(report)
    assert report.offloaded_ops["image.resize2d"] == 2, str(report)


def check_torch(tmp_path, name):
    torch = pytest.importorskip("torch")  # the torch extra; make test installs it
    traced, example = torch_models.mobilenet_v2_traced(name=name)
    path = str(tmp_path / f"{name}.pt")
    traced.save(path)
    model = load_model(path, {"input": torch_models.INPUT_SHAPE})
    with torch.no_grad():
        expected = [traced(example).numpy()]
    return check_model(model, {"input": example.numpy()}, tmp_path, "pytorch" if name == "mobilenet_v2" else
                       f"pytorch_{name}", expected)


def test_pytorch_post_training_quantized(tmp_path):
    check_torch(tmp_path, "mobilenet_v2")


def test_pytorch_nearest_upsample_is_inside_the_partition(tmp_path):
    """TVM's importer writes a quantized F.interpolate(mode="nearest") as dequantize -> float resize ->
    quantize with the same qparams: one refcg.qdq_resize kernel between the convs."""
    report = check_torch(tmp_path, "upsample")
    assert len(report.partitions) == 1 and not report.stayed, str(report)
    assert [c for c, _ in next(iter(report.partitions.values()))].count("refcg.qdq_resize") == 1, str(report)


@pytest.mark.parametrize("recalibrate", [False, True])
def test_untouched_batch_norm_collapses_and_the_check_fails_it(recalibrate):
    """torchvision's MobileNetV2, random weights, quantized by PyTorch: with the initial batch-norm
    statistics its output is one constant, which the network tests' check rejects; with statistics
    recalibrated on random data (torch_models.recalibrate_batch_norm) it passes."""
    torch = pytest.importorskip("torch")  # the torch extra; make test installs it
    torchvision = torch_models.import_torchvision()  # after tvm (conftest): the CPU torch allows it
    torch.manual_seed(0)
    net = torchvision.models.quantization.mobilenet_v2(weights=None, quantize=False)
    if recalibrate:
        torch_models.recalibrate_batch_norm(net)
    net.eval().fuse_model(is_qat=False)
    torch_models.quantize_eager(net, calibration=2)
    with torch.no_grad():
        outputs = [net(torch.randn(torch_models.INPUT_SHAPE)).numpy()]
    if recalibrate:
        assert_not_degenerate(outputs)
    else:
        with pytest.raises(AssertionError, match="takes 1 distinct value"):
            assert_not_degenerate(outputs)


# torchvision's quantizable networks at 32 px (ShuffleNetV2: 64, its quantized ops fail at 32): the glue between their quantized layers (casts after
# every conv, pads, adaptive pool, reshape/squeeze, ShuffleNet's split and channel shuffle) is offloaded.
# ShuffleNetV2's global pool is a float mean between dequantize and quantize: it stays, two partitions (the
# dequantize ends TVM-only's conv kernel: it leaves with the conv).
# Partitioning only (TVM-only builds of the full depth take minutes; make bench compares them).
@pytest.mark.parametrize("name, size, partitions", [("resnet18", 32, 1), ("shufflenet_v2_x0_5", 64, 2)])
def test_torchvision_networks_are_not_fragmented(tmp_path, name, size, partitions):
    pytest.importorskip("torch")
    shape = (1, 3, size, size)
    traced, _ = torch_models.torchvision_network(name, size, seed=0, calibration=1)
    path = str(tmp_path / f"{name}.pt")
    traced.save(path)
    model = load_model(path, {"input": shape})
    partitioned = partition_for_refcg(runner.prepared(model), fold_batch_norm=False)
    report = offload_report(partitioned)
    assert len(refcg_functions(partitioned)) == partitions, str(report)
    assert dict(report.stayed_ops) == ({} if partitions == 1 else {"mean": 1}), str(report)


def test_triton_cannot_crash_a_process_that_loaded_tvm(tmp_path):
    """CUDA builds of torch install triton, whose LLVM crashes the process when it loads after TVM's
    (torchvision loads it through torch._dynamo). With a stand-in triton that aborts when imported,
    torchvision and torch._dynamo import after refcodegen without loading it."""
    pytest.importorskip("torch")
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("import os\nos.abort()  # as triton after TVM does\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}  # sys.path: examples/ too
    assert subprocess.run([sys.executable, "-c", "import triton"], env=env).returncode != 0  # it does abort
    code = ("import sys, refcodegen; from examples.torch_models import import_torchvision; "
            "import_torchvision(); import torch._dynamo; assert sys.modules['triton'] is None")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_relay_text_with_params(tmp_path):
    """Relay text plus a .params file loads with the weights bound and the data input found."""
    from tvm import relay

    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    w = relay.var("w", shape=(8, 4, 3, 3), dtype="int8")
    y = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.05), relay.const(0.01),
                            kernel_size=(3, 3), channels=8, padding=(1, 1))
    y = relay.qnn.op.requantize(y, relay.const(0.0005), relay.const(0), relay.const(0.1), relay.const(0),
                                out_dtype="int8")
    mod = relay.transform.InferType()(__import__("tvm").IRModule.from_expr(relay.Function([x, w], y)))
    (tmp_path / "m.relay").write_text(mod.astext(show_meta_data=True))
    weight = np.random.default_rng(0).integers(-128, 128, (8, 4, 3, 3)).astype("int8")
    (tmp_path / "m.params").write_bytes(relay.save_param_dict({"w": weight}))
    model = load_model(str(tmp_path / "m.relay"))
    assert model.inputs == {"x": ((1, 4, 6, 6), "int8")}
    assert set(model.params) == {"w"}
    assert model.partition_options == {}


@pytest.mark.parametrize("path,shapes,fragment", [
    ("model.pb", None, "unknown format"),
    ("model.tflite", None, "not a TFLite flatbuffer"),
    ("model.pt", None, "TorchScript has no input shapes"),
    ("missing.onnx", None, "no such file"),
])
def test_load_errors_name_the_problem(tmp_path, path, shapes, fragment):
    full = tmp_path / path
    if "missing" not in path:
        full.write_bytes(b"\0")
    with pytest.raises(RefcgError, match=fragment):
        load_model(str(full), shapes)


def test_onnx_input_shape_must_name_an_input(tmp_path):
    path = quantized_onnx(tmp_path, "mlp", "qdq", False, "int8")
    with pytest.raises(RefcgError, match="no such input"):
        load_model(path, {"nope": (1, 2)})


@pytest.mark.parametrize("text,expected", [("input:1x3x224x224", ("input", (1, 3, 224, 224))),
                                           ("a:b:8X4", ("a:b", (8, 4)))])
def test_parse_shape(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize("text", ["1x3x224x224", "x:1xAx3", "x:0x3", "x:"])
def test_parse_shape_rejects(text):
    with pytest.raises(RefcgError, match="--input-shape"):
        parse_shape(text)
