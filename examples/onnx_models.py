"""Quantized example networks built in code with fixed seeds (no downloads).

Float ONNX graphs (MobileNetV2-style, ResNet-18-style, an MLP block) are written with
``onnx.helper`` and quantized by ONNX Runtime's own ``quantize_static``, the way users
produce them. Used by the tests, the bench and ``make demo``. Needs the ``onnx`` extra.
"""
from __future__ import annotations

import numpy as np

OPSET = 13  # TVM 0.19's ONNX importer and ORT's per-channel QDQ both handle it


class _Graph:
    """Collects nodes and float initializers for one ONNX graph."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, prefix: str, value: np.ndarray, dtype=np.float32) -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(value.astype(dtype), name))
        return name

    def node(self, op: str, inputs: list, **attrs) -> str:
        from onnx import helper

        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x, in_c, out_c, k=3, stride=1, groups=1, act="relu"):
        fan_in = in_c // groups * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), (out_c, in_c // groups, k, k))
        b = self.rng.normal(0, 0.05, out_c)
        y = self.node("Conv", [x, self.const("w", w), self.const("b", b)], kernel_shape=[k, k],
                      strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        if act == "relu":
            return self.node("Relu", [y])
        if act == "relu6":
            return self.node("Clip", [y, self.const("lo", np.array(0.0)), self.const("hi", np.array(6.0))])
        return y

    def gemm(self, x, in_f, out_f, act=None):
        w = self.rng.normal(0, np.sqrt(2.0 / in_f), (out_f, in_f))
        y = self.node("Gemm", [x, self.const("w", w), self.const("b", self.rng.normal(0, 0.05, out_f))],
                      transB=1)
        return self.node("Relu", [y]) if act == "relu" else y

    def model(self, x_shape, y):
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes, "refcg_example",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        return model


MOBILENET_BLOCKS = [(1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 32, 2), (4, 32, 1)]  # expand, out_c, stride


def mobilenet_v2(seed: int = 0, size: int = 32, classes: int = 10, blocks: int = len(MOBILENET_BLOCKS)):
    """Stem, inverted residual blocks (expand 1x1, depthwise 3x3, project 1x1, residual add), head."""
    g = _Graph(seed)
    x = g.conv("input", 3, 16, stride=2, act="relu6")
    c = 16
    for expand, out_c, stride in MOBILENET_BLOCKS[:blocks]:
        hidden = c * expand
        y = g.conv(x, c, hidden, k=1, act="relu6") if expand != 1 else x
        y = g.conv(y, hidden, hidden, stride=stride, groups=hidden, act="relu6")
        y = g.conv(y, hidden, out_c, k=1, act=None)
        x = g.node("Add", [x, y]) if stride == 1 and c == out_c else y
        c = out_c
    x = g.conv(x, c, 64, k=1, act="relu6")
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    return g.model((1, 3, size, size), g.gemm(x, 64, classes))


def resnet18(seed: int = 0, size: int = 32, classes: int = 10, blocks: int = 2):
    """Stem conv + max pool, four stages of ``blocks`` basic blocks (batch norm folded into the convs)."""
    g = _Graph(seed)
    x = g.conv("input", 3, 16, k=3, stride=1)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 16
    for out_c, stride in [(16, 1), (32, 2), (64, 2), (64, 2)]:
        for block in range(blocks):
            s = stride if block == 0 else 1
            y = g.conv(x, c, out_c, stride=s)
            y = g.conv(y, out_c, out_c, act=None)
            shortcut = g.conv(x, c, out_c, k=1, stride=s, act=None) if (s != 1 or c != out_c) else x
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            c = out_c
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    return g.model((1, 3, size, size), g.gemm(x, c, classes))


def upsample_cnn(seed: int = 0, size: int = 9):
    """Convs around nearest Resizes: ONNX's defaults (half_pixel, round_prefer_floor) to a size that is
    no integer ratio, then PyTorch's export (asymmetric, floor) by scales 2 (FPN / segmentation necks)."""
    g = _Graph(seed)
    x = g.conv("input", 3, 8)
    out = [1, 8, 2 * size - 1, size + 4]
    x = g.node("Resize", [x, "", "", g.const("sizes", np.array(out), np.int64)], mode="nearest")
    x = g.conv(x, 8, 8)
    x = g.node("Resize", [x, "", g.const("scales", np.array([1, 1, 2, 2]))], mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return g.model((1, 3, size, size), g.conv(x, 8, 4, act=None))


def mlp_block(seed: int = 0, tokens: int = 8, width: int = 64):
    """Transformer-style feed-forward block: up projection, ReLU, down projection, residual add."""
    g = _Graph(seed)
    y = g.gemm("input", width, 4 * width, act="relu")
    y = g.gemm(y, 4 * width, width)
    return g.model((tokens, width), g.node("Add", ["input", y]))


def tiny_cnn(seed: int = 0):
    """One inverted residual block between stem and head: every op kind of the CNNs, built fast."""
    return mobilenet_v2(seed, size=16, blocks=1)


MODELS = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18, "mlp": mlp_block, "tiny_cnn": tiny_cnn}


def input_shape(model) -> tuple[int, ...]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return tuple(int(d.dim_value) for d in dims)


def calibration_data(model, samples: int = 8, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, input_shape(model)).astype(np.float32) for _ in range(samples)]


def quantize(model, path: str, *, fmt: str = "qdq", per_channel: bool = False,
             activation: str = "int8", samples: int = 8) -> str:
    """Quantize a float ONNX model with ORT's ``quantize_static``; write it to ``path``."""
    import logging
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(calibration_data(model, samples))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"input": batch}

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_static warns about pre-processing on every call
    with tempfile.TemporaryDirectory() as tmp:
        float_path = os.path.join(tmp, "float.onnx")
        onnx.save(model, float_path)
        quantize_static(
            float_path, path, Reader(),
            quant_format={"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}[fmt],
            per_channel=per_channel,
            activation_type={"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[activation],
            weight_type=QuantType.QInt8,
        )
    root.setLevel(level)
    return path


def example_input(path_or_model, seed: int = 2) -> dict:
    """A fixed random float input for an ONNX model (file path or ModelProto)."""
    import onnx

    model = onnx.load(path_or_model) if isinstance(path_or_model, str) else path_or_model
    rng = np.random.default_rng(seed)
    return {model.graph.input[0].name: rng.normal(0, 1, input_shape(model)).astype(np.float32)}
