"""A PyTorch model quantized with PyTorch's own post-training quantization, traced for TVM.

The combination that imports with TVM 0.19's ``relay.frontend.from_pytorch`` (torch 2.13.0):
eager-mode static quantization (``torch.ao.quantization``: QuantStub/DeQuantStub,
``fuse_modules`` for Conv+ReLU, ``get_default_qconfig("fbgemm")``: per-channel int8 weights,
uint8 activations; or ``"qnnpack"``: per-tensor), ``prepare`` -> calibrate -> ``convert``, then
``torch.jit.trace``. Residual adds must use ``FloatFunctional`` so they become ``quantized::add``.
FX mode (``prepare_fx``/``convert_fx`` with ``get_default_qconfig_mapping("fbgemm")``, then
``torch.jit.trace``) imports too, with extra quantize/dequantize pairs around flatten.
Needs the ``torch`` extra.

torchvision (for its quantizable networks) comes through ``import_torchvision()``: the PyPI
torchvision 0.28.0 wheel is built against the CUDA torch, so with the CPU torch its C operators
(detection ops, which the networks do not use) do not load and its import fails unless their
schemas exist. With the CUDA torch it imports as it is, before or after tvm, once refcodegen is
imported: torchvision imports triton (through torch._dynamo), whose LLVM crashes the process when
loaded after TVM's, and ``import refcodegen`` keeps triton from loading (``__init__.py``).
"""
from __future__ import annotations

import sys

INPUT_SHAPE = (1, 3, 32, 32)

# Operators torchvision registers fake kernels for at import time, whether or not its C
# extension loaded: with a CPU torch they must exist, so declare their schemas first.
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_library = None


def import_torchvision():
    """``import torchvision`` that works with the CPU torch build and says why it cannot."""
    global _torchvision_library
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    import torch

    try:
        import torchvision  # a CUDA torch loads torchvision's C operators itself
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        _torchvision_library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _TORCHVISION_SCHEMAS:
            _torchvision_library.define(schema)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        import torchvision
    return torchvision


def _modules():
    import torch.ao.quantization as tq
    from torch import nn

    class InvertedResidual(nn.Module):
        def __init__(self, c, hidden):
            super().__init__()
            self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1), nn.ReLU())
            self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden), nn.ReLU())
            self.project = nn.Conv2d(hidden, c, 1)
            self.add = nn.quantized.FloatFunctional()

        def forward(self, x):
            return self.add.add(x, self.project(self.dw(self.expand(x))))

    class MobileNetV2Style(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU())
            self.b1, self.b2 = InvertedResidual(16, 64), InvertedResidual(16, 64)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, classes)

        def forward(self, x):
            import torch

            x = self.b2(self.b1(self.stem(self.quant(x))))
            return self.dequant(self.fc(torch.flatten(self.pool(x), 1)))

        fuse = [["stem.0", "stem.1"]] + [[f"{b}.{m}.0", f"{b}.{m}.1"] for b in ("b1", "b2") for m in ("expand", "dw")]

    class UpsampleCNN(nn.Module):
        """conv -> nearest 2x upsample of the quantized tensor -> conv (a decoder's shape)."""

        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
            self.head = nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x):
            from torch.nn import functional

            x = self.stem(self.quant(x))
            return self.dequant(self.head(functional.interpolate(x, scale_factor=2, mode="nearest")))

        fuse = [["stem.0", "stem.1"]]

    return {"mobilenet_v2": MobileNetV2Style, "upsample": UpsampleCNN}


def quantize_eager(net, engine: str = "fbgemm", calibration: int = 8, shape=INPUT_SHAPE):
    """Eager-mode post-training static quantization of a fused float ``net`` (in place; returned),
    calibrated on ``calibration`` random inputs from torch's global generator."""
    import torch
    import torch.ao.quantization as tq

    torch.backends.quantized.engine = engine
    net.eval()
    net.qconfig = tq.get_default_qconfig(engine)
    tq.prepare(net, inplace=True)
    with torch.no_grad():
        for _ in range(calibration):
            net(torch.randn(shape))
    return tq.convert(net, inplace=True)


def recalibrate_batch_norm(net, batches: int = 4, shape=INPUT_SHAPE, seed: int = 0):
    """Batch-norm running statistics measured on random data (in place; returned in eval mode).

    With random weights and the initial statistics (mean 0, variance 1) activations shrink layer
    after layer: torchvision's MobileNetV2 then quantizes to one constant output, and a bit-exact
    comparison of it proves nothing. Measured statistics keep every layer's output spread."""
    import torch

    for module in net.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a plain average over the batches
    generator = torch.Generator().manual_seed(seed)
    net.train()
    with torch.no_grad():
        for _ in range(batches):
            net(torch.randn((4, *shape[1:]), generator=generator))
    return net.eval()


def mobilenet_v2_traced(seed: int = 0, engine: str = "fbgemm", calibration: int = 8, name: str = "mobilenet_v2"):
    """(traced quantized ScriptModule, example input) for ``relay.frontend.from_pytorch``; ``name``
    "upsample": a conv -> ``F.interpolate(mode="nearest")`` -> conv net instead."""
    import torch
    import torch.ao.quantization as tq

    torch.manual_seed(seed)
    net = _modules()[name]().eval()
    net = quantize_eager(tq.fuse_modules(net, net.fuse), engine, calibration)
    example = torch.randn(INPUT_SHAPE)
    with torch.no_grad():
        return torch.jit.trace(net, example), example


def torchvision_network(name: str = "inception_v3", input_size: int = 299, seed: int = 0, calibration: int = 4):
    """(traced quantized ScriptModule, example input) of a torchvision quantizable network.

    Random weights and PyTorch's own post-training quantization, as a user would run it:
    ``torchvision.models.quantization.<name>(weights=None, quantize=False)``, ``fuse_model()``,
    fbgemm qconfig, prepare, ``calibration`` random batches, convert; batch-norm statistics
    measured first (``recalibrate_batch_norm``). ``input_size``: Inception-v3 needs at least 75
    (its auxiliary classifier, which needs more, is left out).
    """
    import torch

    models = import_torchvision().models.quantization
    torch.manual_seed(seed)
    extra = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    net = getattr(models, name)(weights=None, quantize=False, **extra)
    shape = (1, 3, input_size, input_size)
    recalibrate_batch_norm(net, shape=shape, seed=seed).fuse_model()
    net = quantize_eager(net, "fbgemm", calibration, shape)
    example = torch.randn(shape)
    with torch.no_grad():
        return torch.jit.trace(net, example), example
