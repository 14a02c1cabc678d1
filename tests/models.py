"""Quantized Relay test models built in code (no downloads)."""
from __future__ import annotations

import tvm
from tvm import relay

from examples.networks import qconv as qconv_block  # noqa: F401  one conv-block builder for all


def nchw_or_nhwc(layout: str, n: int, c: int, h: int, w: int) -> tuple[int, ...]:
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def module(inputs, body) -> tvm.IRModule:
    return tvm.IRModule.from_expr(relay.Function(inputs, body))
