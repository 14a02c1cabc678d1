"""The model zoo: real CNNs with random weights, quantized the way their users quantize them (no downloads).

One registry (``NETWORKS``) shared by the tests (``tests/test_zoo.py``, at ``test_size``) and the bench
(``python -m tools.bench --networks``, at ``size``, the network's real input size). Each entry says how
to build the network (``build``), at which sizes, and where its peers come from: the runtime the
network's users run the same converted model on.

- torchvision quantizable networks (``torch_models.torchvision_network``: eager PTQ, fbgemm qconfig,
  batch-norm statistics measured, traced): peers PyTorch itself (``torch.backends.quantized.engine =
  "fbgemm"`` on the traced module) and ONNX Runtime on ``torch.onnx.export`` of that module (QDQ).
- Keras applications converted full-int8 by TFLiteConverter (``tflite_models.make_tflite``, in a child
  process, cached): peer LiteRT (XNNPACK) on the same ``.tflite``; no ONNX export (tf2onnx is not a
  dependency).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from . import tflite_models, torch_models

SEED = 0
PYTORCH, LITERT, ONNXRUNTIME = "pytorch fbgemm", "litert xnnpack", "onnxruntime"


@dataclass(frozen=True)
class Network:
    name: str
    framework: str  # "torchvision" or "keras"
    size: int  # the input size the network is made for (the bench)
    test_size: int  # a reduced size with the same layer kinds (the tests)
    options: dict = field(default_factory=dict)  # tflite_models.settings overrides

    @property
    def peers(self) -> tuple:
        return (PYTORCH, ONNXRUNTIME) if self.framework == "torchvision" else (LITERT,)

    def build(self, directory: str, size: int | None = None, seed: int = SEED) -> "Built":
        """Make the network at ``size`` (default: its real size) with ``seed``; files go to ``directory``."""
        size = size or self.size
        if self.framework == "torchvision":
            path = os.path.join(directory, f"{self.name}-{size}-{seed}.pt")
            if os.path.isfile(path + ".npy"):  # built in this directory already (the bench's build children)
                import torch

                traced, example = torch.jit.load(path), np.load(path + ".npy")
            else:
                traced, example = torch_models.torchvision_network(self.name, size, seed=seed)
                example = example.numpy()
                traced.save(path)
                np.save(path + ".npy", example)
            return Built(self, size, path, {"input": (1, 3, size, size)}, {"input": example}, traced)
        path = tflite_models.make_tflite(self.name.removeprefix("keras_"), size=size, seed=seed, classes=1000,
                                         **self.options)
        return Built(self, size, path, None, None, None)


@dataclass
class Built:
    network: Network
    size: int
    path: str  # the model file TVM imports and the peers run: .pt (TorchScript) or .tflite
    shapes: dict | None  # input name -> shape, for load_model (TorchScript has none of its own)
    inputs: dict | None  # name -> array, when the framework made the example (else random_inputs)
    traced: object | None  # the traced quantized torch module (PyTorch's own execution)

    def model(self):
        from refcodegen.frontends import load_model

        return load_model(self.path, self.shapes)

    def example(self, model) -> dict:
        from refcodegen import runner

        return self.inputs if self.inputs is not None else runner.random_inputs(model.inputs)

    def onnx(self) -> tuple[str | None, str]:
        """(path of the ONNX export, "") or (None, why there is none)."""
        if self.traced is None:
            return None, "no ONNX export of a .tflite (tf2onnx is not a dependency)"
        import torch

        path = self.path[: -len(".pt")] + ".onnx"
        example = torch.from_numpy(self.inputs["input"])
        try:
            torch.onnx.export(self.traced, (example,), path, opset_version=13, dynamo=False, input_names=["input"])
        except Exception as error:  # noqa: BLE001  (the exporter's failures have no common type)
            return None, f"torch.onnx.export failed: {type(error).__name__}: {str(error)[:120]}"
        return path, ""


def _torchvision(name: str, size: int = 224, test_size: int = 32) -> Network:
    return Network(name, "torchvision", size, test_size)


def _keras(name: str, **options) -> Network:
    return Network(name, "keras", 224, 32, options)


# Test sizes: the smallest input each network takes with all its layer kinds (Inception-v3: 75;
# ShuffleNetV2: 64, since at 32 PyTorch's own quantized mean over its 1x1 last map fails to trace,
# "required rank 4 tensor to use channels_last format").
# Keras MobileNets at width 1.0 (tflite_models' own defaults are narrower, for its tests).
NETWORKS = {n.name: n for n in (
    _torchvision("resnet18"), _torchvision("resnet50"), _torchvision("mobilenet_v2"),
    _torchvision("mobilenet_v3_large"), _torchvision("shufflenet_v2_x1_0", test_size=64), _torchvision("googlenet"),
    _torchvision("inception_v3", size=299, test_size=75),
    _keras("keras_mobilenet_v2", alpha=1.0), _keras("keras_mobilenet_v3_small", alpha=1.0),
    _keras("keras_resnet50"), _keras("keras_efficientnet_b0"),
)}
