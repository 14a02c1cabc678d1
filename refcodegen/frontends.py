"""Load a model file into Relay ``(mod, params)`` with the partition options its frontend needs.

Formats, chosen by file suffix:
- ``.onnx``: ``relay.frontend.from_onnx`` (needs the ``onnx`` extra: TVM 0.19's importer uses
  ``onnx.mapping``, removed after onnx 1.17). QDQ graphs and QOperator ops that import as
  dequantize -> op -> quantize need FakeQuantizationToInteger before partitioning.
- ``.pt``/``.pth``/``.ts``/``.torchscript``: a traced TorchScript module (``torch.jit.save``),
  ``relay.frontend.from_pytorch``; TorchScript carries no input shapes, so they must be given.
- ``.tflite``: a TFLite flatbuffer (``tflite_import.from_tflite``: TVM's importer plus per-channel
  FULLY_CONNECTED; needs the ``tflite`` extra); input names, shapes and dtypes come from the model.
- ``.relay``/``.txt``: Relay text (``tvm.relay.fromtext``), with params from ``<stem>.params``
  (``relay.save_param_dict``) when that file exists.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import tvm
from tvm import relay

from .errors import RefcgError

ONNX_SUFFIXES = (".onnx",)
TORCH_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
TFLITE_SUFFIXES = (".tflite",)
RELAY_SUFFIXES = (".relay", ".txt")
QUANT_ONNX_OPS = {"QuantizeLinear", "DequantizeLinear"}


@dataclass
class Model:
    mod: tvm.IRModule
    params: dict
    inputs: dict  # name -> (shape tuple, dtype)
    frontend: str
    partition_options: dict = field(default_factory=dict)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``name:1x3x224x224`` -> ``("name", (1, 3, 224, 224))``."""
    name, sep, dims = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise RefcgError("--input-shape", text, "expected NAME:DxDx..., e.g. input:1x3x224x224") from None
    if any(d <= 0 for d in shape):
        raise RefcgError("--input-shape", text, "dimensions must be positive")
    return name, shape


def load_model(path: str, shapes: dict | None = None) -> Model:
    """Import ``path``; ``shapes`` (name -> shape) overrides or supplies input shapes."""
    if not os.path.isfile(path):
        raise RefcgError("model", path, "no such file")
    suffix = os.path.splitext(path)[1].lower()
    shapes = dict(shapes or {})
    if suffix in ONNX_SUFFIXES:
        return _load_onnx(path, shapes)
    if suffix in TORCH_SUFFIXES:
        return _load_torchscript(path, shapes)
    if suffix in TFLITE_SUFFIXES:
        return _load_tflite(path, shapes)
    if suffix in RELAY_SUFFIXES:
        return _load_relay_text(path, shapes)
    known = ", ".join(ONNX_SUFFIXES + TORCH_SUFFIXES + TFLITE_SUFFIXES + RELAY_SUFFIXES)
    raise RefcgError("model", path, f"unknown format {suffix!r} (known: {known})")


def _require(module: str, extra: str):
    try:
        return __import__(module)
    except ImportError:
        raise RefcgError("model", module, f"not installed: pip install 'refcodegen[{extra}]'") from None


def _graph_inputs(mod, params) -> dict:
    """name -> (shape, dtype) of the data inputs (the parameters that are not weights)."""
    inputs = {}
    for var in mod["main"].params:
        if var.name_hint in params:
            continue
        ttype = var.checked_type
        if not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
            raise RefcgError("input", var.name_hint, f"shape {ttype.shape} is not static")
        inputs[var.name_hint] = (tuple(int(d) for d in ttype.shape), ttype.dtype)
    return inputs


def _load_onnx(path: str, shapes: dict) -> Model:
    onnx = _require("onnx", "onnx")
    model = onnx.load(path)
    initializers = {init.name for init in model.graph.initializer}
    shape_dict = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        static = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
        shape_dict[value.name] = shapes.pop(value.name, static)
        if any(d <= 0 for d in shape_dict[value.name]):
            raise RefcgError("input", value.name, f"shape {static} is not static: give --input-shape "
                             f"{value.name}:...")
    if shapes:
        raise RefcgError("--input-shape", ", ".join(shapes), f"no such input (inputs: {', '.join(shape_dict)})")
    mod, params = relay.frontend.from_onnx(model, shape_dict, freeze_params=True)
    mod = relay.transform.InferType()(mod)
    quantized = any(node.op_type in QUANT_ONNX_OPS or node.op_type.startswith("QLinear")
                    for node in model.graph.node)
    return Model(mod, params, _graph_inputs(mod, params), "onnx",
                 {"fake_quantization_to_integer": True} if quantized else {})


def _load_torchscript(path: str, shapes: dict) -> Model:
    torch = _require("torch", "torch")
    if not shapes:
        raise RefcgError("input", path, "TorchScript has no input shapes: give --input-shape NAME:DxDx...")
    module = torch.jit.load(path, map_location="cpu").eval()
    mod, params = relay.frontend.from_pytorch(module, list(shapes.items()))
    mod = relay.transform.InferType()(mod)
    return Model(mod, params, _graph_inputs(mod, params), "pytorch")


def _load_tflite(path: str, shapes: dict) -> Model:
    from .tflite_import import from_tflite

    mod, params = from_tflite(path, shapes)
    mod = relay.transform.InferType()(mod)
    return Model(mod, params, _graph_inputs(mod, params), "tflite")


def _load_relay_text(path: str, shapes: dict) -> Model:
    with open(path, encoding="utf-8") as f:
        mod = tvm.relay.fromtext(f.read())
    params_path = os.path.splitext(path)[0] + ".params"
    params = {}
    if os.path.isfile(params_path):
        with open(params_path, "rb") as f:
            params = relay.load_param_dict(f.read())
    mod = relay.transform.InferType()(mod)
    inputs = _graph_inputs(mod, params)
    for name, shape in shapes.items():
        if name not in inputs or tuple(inputs[name][0]) != tuple(shape):
            raise RefcgError("--input-shape", name, f"Relay text fixes its input shapes: {inputs}")
    return Model(mod, params, inputs, "relay")
