"""The aarch64 requantize rule against what TVM-only actually emits (x86 host, no emulator).

numerics.tvm_uses_neon_q31x4 encodes which arm_cpu schedules hand tir.q_multiply_shift int32x4
vectors (lowered to sqrdmulh + srshl); this re-derives it from TVM's LLVM IR for a grid of shapes.
"""
import numpy as np
import pytest
import tvm
from tvm import relay

from arm.host import TARGET_DOTPROD, TARGET_NEON
from models import module, nchw_or_nhwc, qconv_block
from refcodegen.numerics import resolve_mode, tvm_uses_neon_q31x4
from test_ops_dense import dense_block


def emits_sqrdmulh(mod, target) -> bool:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    return "llvm.aarch64.neon.sqrdmulh" in lib.lib.get_source("ll")


def conv(layout, out_c, groups=1):
    in_c = out_c if groups > 1 else 8
    x = relay.var("x", shape=nchw_or_nhwc(layout, 1, in_c, 6, 6), dtype="int8")
    return module([x], qconv_block(x, np.random.default_rng(0), in_c=in_c, out_c=out_c, layout=layout, groups=groups))


def dense(units):
    x = relay.var("x", shape=(2, 24), dtype="int8")
    return module([x], dense_block(x, np.random.default_rng(0), in_f=24, units=units))


def requantize(shape, out_dtype):
    x = relay.var("x", shape=shape, dtype="int32")
    y = relay.qnn.op.requantize(x, relay.const(np.float32(0.0123)), relay.const(0), relay.const(np.float32(0.3)),
                                relay.const(1), out_dtype=out_dtype)
    return module([x], y)


GRID = [
    # op, model, rule arguments
    ("conv2d", conv("NHWC", 16), dict(channels=16, layout="NHWC")),
    ("conv2d", conv("NHWC", 4), dict(channels=4, layout="NHWC")),
    ("conv2d", conv("NHWC", 12), dict(channels=12, layout="NHWC")),
    ("conv2d", conv("NHWC", 24), dict(channels=24, layout="NHWC")),
    ("conv2d", conv("NHWC", 6), dict(channels=6, layout="NHWC")),
    ("conv2d", conv("NCHW", 16), dict(channels=16, layout="NCHW")),
    ("conv2d", conv("NCHW", 16, groups=16), dict(channels=16, layout="NCHW", groups=16)),
    ("dense", dense(4), dict(channels=4)),
    ("dense", dense(8), dict(channels=8)),
    ("requantize", requantize((1, 16), "int32"), dict(channels=16, out_dtype="int32")),
    ("requantize", requantize((1, 6), "int32"), dict(channels=6, out_dtype="int32")),
    ("requantize", requantize((1, 16), "int8"), dict(channels=16, out_dtype="int8")),
]


@pytest.mark.parametrize("target", [TARGET_NEON, TARGET_DOTPROD], ids=["neon", "dotprod"])
def test_neon_rule_matches_tvm_lowering(target):
    target = tvm.target.Target(target)
    wrong = [(op, args) for op, mod, args in GRID
             if emits_sqrdmulh(mod, target) != tvm_uses_neon_q31x4(target, op, **args)]
    assert not wrong, f"rule disagrees with TVM for {wrong}"


def test_neon_mode_only_for_aarch64_upward_int64():
    arm = tvm.target.Target(TARGET_DOTPROD)
    assert resolve_mode("None", "None", arm, True) == ("UPWARD", "int64-neon")
    assert resolve_mode("None", "None", arm, False) == ("UPWARD", "int64")  # no sse4.1: int64
    assert resolve_mode("TONEAREST", "None", arm, True) == ("TONEAREST", "int64")
    assert not tvm_uses_neon_q31x4(tvm.target.Target("llvm"), "conv2d", channels=16, layout="NHWC")
