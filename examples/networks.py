"""Quantized Relay networks built in code with fixed seeds (no downloads), for demo, bench and tests.

Each builder returns ``(IRModule, input_name, input_shape, input_dtype)``. Layers follow what
TFLite/ONNX importers emit: qnn.conv2d + bias_add + qnn.requantize + clip (ReLU/ReLU6),
qnn.add for residuals, int8 max_pool2d, cast-int32 global average pool, qnn.dense classifier.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relay

KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}


def conv_weight_shape(kernel_layout: str, out_c: int, in_c_per_group: int, kh: int, kw: int):
    return {"OIHW": (out_c, in_c_per_group, kh, kw), "HWIO": (kh, kw, in_c_per_group, out_c)}[kernel_layout]


def qconv(x, rng, *, in_c, out_c, kernel=(3, 3), strides=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1,
          layout="NCHW", w_dtype="int8", per_channel=False, bias=True, clip=None, input_zp=0, kernel_zp=0,
          output_zp=0, out_dtype="int8", input_scale=0.05, output_scale=0.1, rounding="None",
          weight_range=None):
    """qnn.conv2d (+bias_add) + qnn.requantize (+clip) on expression ``x``."""
    kernel_layout = KERNEL_LAYOUT[layout]
    info = np.iinfo(w_dtype)
    lo, hi = weight_range or (info.min, info.max)
    weight = rng.integers(lo, hi + 1, conv_weight_shape(kernel_layout, out_c, in_c // groups, *kernel))
    w_scale = (rng.uniform(0.002, 0.02, out_c) if per_channel else np.array(0.01)).astype("float32")
    y = relay.qnn.op.conv2d(
        x, relay.const(weight.astype(w_dtype)), relay.const(input_zp), relay.const(kernel_zp),
        relay.const(np.float32(input_scale)), relay.const(w_scale), kernel_size=kernel, channels=out_c,
        strides=strides, padding=padding, dilation=dilation, groups=groups, data_layout=layout,
        kernel_layout=kernel_layout,
    )
    axis = layout.index("C")
    if bias:
        y = relay.nn.bias_add(y, relay.const(rng.integers(-5000, 5000, out_c).astype("int32")), axis=axis)
    y = relay.qnn.op.requantize(
        y, relay.const((np.float32(input_scale) * w_scale).astype("float32")), relay.const(0),
        relay.const(np.float32(output_scale)), relay.const(output_zp), axis=axis, rounding=rounding,
        out_dtype=out_dtype,
    )
    return relay.clip(y, *clip) if clip is not None else y


class QuantNet:
    """Tracks activation qparams while stacking int8 layers; every activation has scale ``act_scale``."""

    def __init__(self, seed: int, layout: str = "NHWC", act_scale: float = 0.05, per_channel: bool = True):
        self.rng = np.random.default_rng(seed)
        self.layout, self.act_scale, self.per_channel = layout, act_scale, per_channel
        self.axis = layout.index("C")

    def shape(self, n, c, h, w):
        return (n, c, h, w) if self.layout == "NCHW" else (n, h, w, c)

    def conv(self, x, in_c, out_c, kernel=3, stride=1, groups=1, relu=True, relu6=False):
        pad = kernel // 2
        clip = (0, min(127, int(6 / self.act_scale))) if relu6 else ((0, 127) if relu else None)
        # weights with a small spread keep int8 activations in a useful range through deep stacks
        bound = max(4, int(48 / np.sqrt(kernel * kernel * in_c / groups)))
        return qconv(x, self.rng, in_c=in_c, out_c=out_c, kernel=(kernel, kernel), strides=(stride, stride),
                     padding=(pad, pad), groups=groups, layout=self.layout, per_channel=self.per_channel,
                     clip=clip, input_scale=self.act_scale, output_scale=self.act_scale,
                     weight_range=(-bound, bound))

    def add(self, a, b, relu=False):
        s, z = relay.const(np.float32(self.act_scale)), relay.const(0)
        y = relay.qnn.op.add(a, b, s, z, s, z, relay.const(np.float32(self.act_scale * 1.5)), z)
        return relay.clip(y, 0, 127) if relu else y

    def max_pool(self, x):
        return relay.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1), layout=self.layout)

    def global_pool(self, x):
        y = relay.nn.global_avg_pool2d(relay.cast(x, "int32"), layout=self.layout)
        return relay.cast(relay.clip(y, -128, 127), "int8")

    def classifier(self, x, in_c, classes):
        x = relay.reshape(x, (1, in_c))
        bound = max(4, int(48 / np.sqrt(in_c)))
        w = self.rng.integers(-bound, bound + 1, (classes, in_c)).astype("int8")
        y = relay.qnn.op.dense(x, relay.const(w), relay.const(0), relay.const(0),
                               relay.const(np.float32(self.act_scale)), relay.const(np.float32(0.01)),
                               units=classes)
        y = relay.nn.bias_add(y, relay.const(self.rng.integers(-500, 500, classes).astype("int32")))
        return relay.qnn.op.requantize(y, relay.const(np.float32(self.act_scale * 0.01)), relay.const(0),
                                       relay.const(np.float32(0.1)), relay.const(0), out_dtype="int8")

    def module(self, x, body):
        return tvm.IRModule.from_expr(relay.Function([x], body))


def resnet18_style(size: int = 224, classes: int = 1000, width: int = 64, layout: str = "NHWC", seed: int = 18):
    net = QuantNet(seed, layout)
    shape = net.shape(1, 3, size, size)
    x = relay.var("input", shape=shape, dtype="int8")
    y = net.max_pool(net.conv(x, 3, width, kernel=7, stride=2))
    channels = width
    for stage, out_c in enumerate([width, width * 2, width * 4, width * 8]):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = y if stride == 1 and channels == out_c else net.conv(y, channels, out_c, 1, stride, relu=False)
            z = net.conv(y, channels, out_c, 3, stride)
            z = net.conv(z, out_c, out_c, 3, 1, relu=False)
            y = net.add(z, shortcut, relu=True)
            channels = out_c
    y = net.classifier(net.global_pool(y), channels, classes)
    return net.module(x, y), "input", shape, "int8"


def mobilenetv2_style(size: int = 224, classes: int = 1000, layout: str = "NHWC", seed: int = 2):
    net = QuantNet(seed, layout)
    shape = net.shape(1, 3, size, size)
    x = relay.var("input", shape=shape, dtype="int8")
    y = net.conv(x, 3, 32, 3, 2, relu6=True)
    channels = 32
    # (expansion, out_channels, repeats, first stride) as in MobileNetV2
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = channels * t
            z = net.conv(y, channels, hidden, 1, relu6=True) if t != 1 else y
            z = net.conv(z, hidden, hidden, 3, stride, groups=hidden, relu6=True)
            z = net.conv(z, hidden, c, 1, relu=False)
            y = net.add(z, y) if stride == 1 and channels == c else z
            channels = c
    y = net.conv(y, channels, 1280, 1, relu6=True)
    y = net.classifier(net.global_pool(y), 1280, classes)
    return net.module(x, y), "input", shape, "int8"
