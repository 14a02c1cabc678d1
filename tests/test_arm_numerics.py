"""The aarch64 requantize rule (refcodegen.armfuse + numerics.tvm_aarch64_lanes) against what
TVM-only actually lowers (x86 host, no emulator).

TVM lowers tir.q_multiply_shift on int32x4 vectors to NEON sqrdmulh + srshl. For every branch of
the rule, a module below holds a per-tensor requantize in that situation; the test reads the
lanes of each q_multiply_shift in TVM-only's TIR (after VectorizeLoop) and checks that refcg's
plan uses the NEON rounding for exactly the requantizes TVM computes on 4 lanes. Every
requantize gets its own scale ratio, so its fixed-point multiplier identifies it in the TIR.
The same modules run bit-exact on the emulated host in test_arm_models.py.
"""
import functools
import itertools

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import spy_on_codegen
from arm.host import TARGET_DOTPROD, TARGET_NEON
from models import module, qconv_block
from refcodegen import offload_report, partition_for_refcg
from refcodegen.errors import RefcgError
from refcodegen.numerics import MODES, resolve_mode
from refcodegen.plan import build_plan
from test_ops_dense import dense_block


class Net:
    """Builds branches whose requantizes all have distinct scale ratios. Binary, requantize and
    concatenate outputs take a scale ~3x their inputs': a ratio below 1/2 (a negative shift) is
    where the NEON lowering rounds twice (tensor_intrin.py:1135-1145), so results can differ."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.scales = itertools.count()
        self.inputs = []

    def scale(self) -> float:
        return float(np.float32(0.05 + 0.0013 * next(self.scales)))

    def var(self, shape, dtype="int8"):
        x = relay.var(f"x{len(self.inputs)}", shape=shape, dtype=dtype)
        self.inputs.append(x)
        return x, self.scale()

    def conv(self, x, out_c, layout="NHWC", per_channel=False, groups=1, out_dtype="int8", **kw):
        data, scale = x
        in_c = int(relay.transform.InferTypeLocal(data).shape[layout.index("C")])
        out_scale = self.scale()
        y = qconv_block(data, self.rng, in_c=in_c, out_c=out_c, layout=layout, per_channel=per_channel, groups=groups,
                        input_zp=3, output_zp=-1, input_scale=scale, output_scale=out_scale, out_dtype=out_dtype, **kw)
        return y, out_scale

    def dense(self, x, units, per_channel=False):
        data, scale = x
        in_f = int(relay.transform.InferTypeLocal(data).shape[-1])
        y = dense_block(data, self.rng, in_f=in_f, units=units, per_channel=per_channel, input_zp=2, output_zp=1)
        return y, 0.08  # dense_block's output scale

    def add(self, a, b, op=relay.qnn.op.add):
        out_scale = 3 * self.scale()
        c = relay.const
        y = op(a[0], b[0], c(np.float32(a[1])), c(-1), c(np.float32(b[1])), c(-1), c(np.float32(out_scale)), c(2))
        return y, out_scale

    def requantize(self, x, out_dtype="int8"):
        out_scale = 3 * self.scale()
        y = relay.qnn.op.requantize(x[0], relay.const(np.float32(x[1])), relay.const(0),
                                    relay.const(np.float32(out_scale)), relay.const(1), out_dtype=out_dtype)
        return y, out_scale

    def max_pool(self, x, layout="NHWC"):
        return relay.nn.max_pool2d(x[0], (2, 2), (2, 2), layout=layout), x[1]

    def avg_pool(self, x, layout="NHWC"):
        y = relay.nn.avg_pool2d(relay.cast(x[0], "int32"), (2, 2), (2, 2), layout=layout)
        return relay.cast(y, "int8"), x[1]

    def concat(self, parts, axis=-1):
        out_scale = 3 * self.scale()
        c = relay.const
        y = relay.qnn.op.concatenate([p[0] for p in parts], [c(np.float32(p[1])) for p in parts],
                                     [c(0) for _ in parts], c(np.float32(out_scale)), c(0), axis=axis)
        return y, out_scale

    def module(self, outputs):
        body = relay.Tuple([o[0] for o in outputs]) if len(outputs) > 1 else outputs[0][0]
        return module(self.inputs, body)


def failing_chain(net, depthwise=True):
    """issue 14: NHWC per-channel conv -> conv -> residual qnn.add -> max_pool -> depthwise -> dense
    (the add's requantizes are computed in the second conv's kernel, 4 lanes)."""
    x = net.var((1, 12, 12, 8))
    y1 = net.conv(x, 16, per_channel=True)
    y2 = net.conv(y1, 16, per_channel=True)
    y = net.max_pool(net.add(y1, y2))
    if depthwise:
        y = net.conv(y, 16, groups=16, per_channel=True)
    y = (relay.reshape(y[0], (1, -1)), y[1])
    return net.dense(y, 10, per_channel=True)


def nhwc_branches(net):
    """conv NHWC (4-lane gemm output, sliced channels, dilation), requantize, dense and binary
    ops in each fusion situation of the rule."""
    out = []
    x16 = lambda: net.var((1, 6, 6, 16))
    for c in (4, 12, 16):
        out.append(net.conv(net.var((1, 6, 6, 8)), c))                  # own requantize, int8
    out.append(net.conv(net.var((1, 6, 6, 8)), 12, out_dtype="int32"))  # sliced, int32 output
    out.append(net.conv(net.var((1, 8, 8, 8)), 12, dilation=(2, 2), padding=(2, 2)))  # not sliced
    for shape, dtype in (((1, 3, 4), "int8"), ((1, 3, 12), "int32"), ((1, 3, 6), "int32"), ((1, 3, 16), "int8")):
        out.append(net.requantize(net.var(shape, "int32"), dtype))
    out.append(net.add(net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True), x16()))     # add in the conv's kernel
    out.append(net.add(net.conv(net.var((1, 6, 6, 8)), 12, per_channel=True), net.var((1, 6, 6, 12))))  # sliced
    out.append(net.add(net.conv(net.var((1, 6, 6, 8)), 4, per_channel=True), net.var((1, 6, 6, 4))))
    out.append(net.add(net.max_pool(net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True)),
                       net.var((1, 3, 3, 16))))                          # pool kernel: no vector
    x = net.var((1, 6, 6, 8))
    out.append(net.add(net.conv(x, 16, per_channel=True), net.conv(x, 16, per_channel=True)))  # siblings
    a = net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True)
    out.append(net.add(net.add(a, x16()), x16()))                       # add -> add, both in the conv
    out.append(net.add(x16(), x16(), relay.qnn.op.subtract))            # graph inputs: injective
    out.append(net.add(net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True), x16(), relay.qnn.op.mul))
    out.append(net.avg_pool(net.conv(net.var((1, 6, 6, 8)), 12)))       # sliced, ends on int32
    out.append(net.concat([net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True), x16()]))
    d = net.var((3, 24))
    for units in (4, 44, 12):
        out.append(net.dense(d, units))
    out.append(net.add(net.dense(net.var((3, 24)), 4, per_channel=True), net.var((3, 4))))
    return out


def nchw_branches(net):
    out = []
    out.append(net.conv(net.var((1, 16, 6, 6)), 16, layout="NCHW", groups=4))   # group conv: oc_bn 4
    out.append(net.conv(net.var((1, 16, 6, 6)), 8, layout="NCHW", groups=4))    # oc_bn 2
    out.append(net.conv(net.var((1, 6, 6, 16)), 16, groups=4))                  # NHWC group conv: generic
    out.append(net.conv(net.var((1, 64, 4, 4)), 16, layout="NCHW"))             # NCHWc int8 with dotprod
    out.append(net.conv(net.var((1, 8, 6, 6)), 16, layout="NCHW"))              # spatial pack
    out.append(net.conv(net.var((1, 16, 6, 6)), 16, layout="NCHW", groups=16))  # depthwise
    return out


def rule_modules(target: str):
    """The modules covering every branch (NHWC depthwise only without dotprod: TVM-only cannot
    build it for +dotprod targets)."""
    net = Net(1)
    chain = failing_chain(net, depthwise="dotprod" not in target)
    main = net.module([chain] + nhwc_branches(net) + nchw_branches(net))
    return main


def tvm_qms_lanes(mod, target):
    """TVM-only's library and {(multiplier, shift): lanes of each tir.q_multiply_shift} in it."""
    found: dict = {}

    def visit(node):
        if isinstance(node, tvm.tir.Call) and getattr(node.op, "name", "") == "tir.q_multiply_shift":
            m, s = node.args[1], node.args[3]
            m, s = (v.value if isinstance(v, tvm.tir.Broadcast) else v for v in (m, s))
            found.setdefault((int(m), int(s)), set()).add(tvm.DataType(node.args[0].dtype).lanes)

    @tvm.instrument.pass_instrument
    class Grab:
        def run_after_pass(self, ir, info):
            if info.name == "tir.VectorizeLoop":
                for func in ir.functions.values():
                    if isinstance(func, tvm.tir.PrimFunc):
                        tvm.tir.stmt_functor.post_order_visit(func.body, visit)

    with tvm.transform.PassContext(opt_level=3, instruments=[Grab()]):
        lib = relay.build(mod, target=target)
    return lib, found


def refcg_qms(mod, target):
    """refcg's library and {(multiplier, shift): NEON?} for its per-tensor UPWARD int64 requantizes."""
    plans = []

    def observe(stage, func):
        if stage == "folded":
            plans.append(build_plan(func, "probe", tvm.target.Target(target)))

    with pytest.MonkeyPatch.context() as monkeypatch:
        spy_on_codegen(monkeypatch, observe)
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(partition_for_refcg(mod), target=target)
    found = {}
    neon, exact = MODES[("UPWARD", "int64-neon")], MODES[("UPWARD", "int64")]
    for plan in plans:
        for step in plan.steps:
            values = step.values
            rqs = [values.get("requant")] + list(values.get("rq", []) if isinstance(values.get("rq"), list) else [])
            rqs += [part["rq"] for part in values.get("parts", [])]
            for rq in rqs:
                if rq is not None and not rq.per_channel and not rq.identity and rq.mode in (neon, exact):
                    found.setdefault((rq.multipliers[0], rq.shifts[0]), set()).add(rq.mode == neon)
    return lib, found


@functools.lru_cache(maxsize=None)
def rule_builds(target: str):
    """(module, TVM-only library, refcg library, TVM lanes, refcg NEON choices) for ``target``:
    built once per session, for this test and the emulated run in test_arm_models.py."""
    mod = rule_modules(target)
    tvm_lib, lanes = tvm_qms_lanes(mod, target)
    refcg_lib, neon = refcg_qms(mod, target)
    return mod, tvm_lib, refcg_lib, lanes, neon


@pytest.mark.parametrize("target", [TARGET_NEON, TARGET_DOTPROD], ids=["neon", "dotprod"])
def test_rule_matches_tvm_lowering(target):
    _, _, _, tvm_lanes, refcg = rule_builds(target)
    assert len(refcg) >= 30, f"too few requantizes reached the plan: {len(refcg)}"
    wrong = {key: (lanes, refcg[key]) for key, lanes in tvm_lanes.items()
             if key in refcg and refcg[key] != {n == 4 for n in lanes}}
    missing = set(refcg) - set(tvm_lanes)
    assert not missing, f"refcg requantizes TVM-only has no q_multiply_shift for: {missing}"
    assert not wrong, f"rule disagrees with TVM (multiplier, shift: TVM lanes, refcg NEON): {wrong}"
    both = [key for key, lanes in tvm_lanes.items() if key in refcg and 4 in lanes]
    assert len(both) >= 8, "too few NEON-rounded requantizes to test the rule"


def pool1d_into_add():
    net = Net(2)
    x, scale = net.var((1, 12, 16))
    pooled = (relay.nn.max_pool1d(x, (2,), (2,), layout="NWC"), scale)
    return net.module([net.add(pooled, net.var((1, 6, 16)))])


def shared_operand():
    """(Not add(c, c): left in TVM, its canonical form goes through SimplifyExpr, which copies c's graph
    (x + x -> x * 2), so main calls the partition twice and relay.build's Inline pass fails, inline.cc:77.)"""
    net = Net(3)
    c = net.conv(net.var((1, 6, 6, 8)), 16, per_channel=True)
    first = net.add(c, net.var((1, 6, 6, 16)))
    return net.module([net.add(c, first)])


def concat_into_mul():
    """A concatenate read by an elementwise op (last axis 4: an injective schedule would use 4 lanes)."""
    net = Net(4)
    return net.module([net.add(net.concat([net.var((1, 3, 4)), net.var((1, 2, 4))], axis=1), net.var((1, 5, 4)),
                               relay.qnn.op.mul)])


def pool_minimum_mul():
    """Found 2026-12-02 by make fuzz-arm (seed 1100, 1 LSB off on both CPUs): avg pool -> minimum (a
    refcg.copy kernel) -> qnn.mul. TVM-only fuses the minimum and the mul into the pool's kernel
    (scalar); armfuse ended the pool's group at the copy and took the mul for an injective kernel
    vectorizing the output's last axis of 4 (NEON rounding)."""
    from fuzzing.chains import ChainSpec, build_batch

    spec = ChainSpec(shape=(1, 10, 17, 3), layout="NCHW", dtype="int8", scale=0.016910113394260406, zp=-2, seed=939,
                     ops=[{"op": "pool", "kind": "avg", "size": (3, 2), "strides": (2, 1), "padding": (2, 1, 2, 1),
                           "ceil_mode": True, "count_include_pad": True},
                          {"op": "copy", "kind": "minimum", "value": -3, "flip": False},
                          {"op": "binary", "kind": "mul", "other": (1, 10, 10, 4), "flip": False, "const": True,
                           "o_scale": 0.5, "o_zp": -128, "out_scale": 0.125, "out_zp": 43, "clip": None}])
    return build_batch([spec], "aarch64-neon")[0]


def test_a_constant_operand_is_requantized_at_compile_time():
    """Found 2026-12-02 by make fuzz-arm on 732be60 (seed 4500, aarch64-dotprod, 1 LSB): quantize ->
    qnn.hardswish -> qnn.add with a constant operand (4 channels: an injective kernel of 4 lanes).
    TVM-only's FoldConstant requantizes the constant when it builds (on the host: one rounding), so its
    kernel has no q_multiply_shift for it; refcg rounded it at run time with NEON."""
    from fuzzing.chains import ChainSpec, build_batch

    spec = ChainSpec(shape=(1, 13, 13, 4), layout="NHWC", dtype="float32", scale=0.007321823853999376, zp=0,
                     seed=10653, ops=[
                         {"op": "quantize", "axis": -1, "per_axis": False, "out_dtype": "uint8", "out_scale": 0.5,
                          "out_zp": 103},
                         {"op": "lut", "form": "qnn.hardswish", "alpha": 0.01, "out_dtype": "uint8",
                          "out_scale": 0.004869697615504265, "out_zp": 255},
                         {"op": "binary", "kind": "add", "other": (13, 13, 4), "flip": False, "const": True,
                          "o_scale": 0.0013606605352833867, "o_zp": 128, "out_scale": 0.003851078450679779,
                          "out_zp": 0, "clip": (26, 77)}])
    mod = build_batch([spec], "aarch64-dotprod")[0]
    _, lanes = tvm_qms_lanes(mod, TARGET_DOTPROD)
    _, neon = refcg_qms(mod, TARGET_DOTPROD)
    folded = set(neon) - set(lanes)
    assert len(neon) == 2 and len(folded) == 1 and all(neon[key] == {False} for key in folded), (lanes, neon)
    assert all(neon[key] == {n == 4 for n in tvm} for key, tvm in lanes.items()), (lanes, neon)


def test_an_elementwise_copy_after_a_pool_joins_its_kernel():
    mod = pool_minimum_mul()
    _, lanes = tvm_qms_lanes(mod, TARGET_NEON)
    _, neon = refcg_qms(mod, TARGET_NEON)
    assert lanes and all(neon[key] == {n == 4 for n in tvm} for key, tvm in lanes.items()), (lanes, neon)


def test_concatenate_kernel_computes_its_elementwise_readers_on_scalars():
    """What armfuse does not follow (a concatenate's group growing into its elementwise readers,
    scheduled by schedule_concatenate, topi/arm_cpu/injective.py:81-107): TVM-only's TIR for it
    has scalar requantizes only, though the output's last axis is 4."""
    _, lanes = tvm_qms_lanes(concat_into_mul(), TARGET_NEON)
    assert len(lanes) == 3 and all(n == {1} for n in lanes.values()), lanes


@pytest.mark.parametrize("make,ops,why", [
    (pool1d_into_add, {"qnn.add"}, "computed by TVM outside the partition"),
    (shared_operand, {"qnn.add", "qnn.conv2d"}, "also requantized by another kernel"),  # the conv's kernel has them
    (concat_into_mul, {"qnn.concatenate", "qnn.mul"}, "concatenate"),
], ids=["pool1d", "shared", "concat"])
def test_undecidable_rounding_stays_in_tvm_given_the_target(make, ops, why):
    """partition_for_refcg(target=aarch64) asks armfuse: what it cannot tell stays in TVM, with the
    reason, and the build goes through; without target= the codegen refuses instead."""
    mod = make()
    part = partition_for_refcg(mod, target=TARGET_NEON)
    stayed = [(op, reason) for op, _, reason in offload_report(part).stayed if op in ops]
    assert {op for op, _ in stayed} == ops, offload_report(part)
    assert all(r.startswith("aarch64 rounding: ") for _, r in stayed) and any(why in r for _, r in stayed)
    with tvm.transform.PassContext(opt_level=3):
        relay.build(part, target=TARGET_NEON)
        with pytest.raises(RefcgError, match="cannot tell whether TVM-only rounds"):
            relay.build(partition_for_refcg(mod), target=TARGET_NEON)


def test_undecidable_rounding_is_an_error_not_a_guess():
    """An add operand computed by a TVM anchor kernel (max_pool1d, which refcg does not take) could
    have the add's requantize fused into TVM's kernel: on aarch64 refcg refuses to guess."""
    mod = pool1d_into_add()
    part = partition_for_refcg(mod)
    assert "nn.max_pool1d" in part["main"].astext(), "max_pool1d should stay in TVM"
    with pytest.raises(RefcgError, match="cannot tell whether TVM-only rounds"):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(part, target=TARGET_NEON)
    with tvm.transform.PassContext(opt_level=3):
        relay.build(part, target="llvm")  # elsewhere the question does not arise


def test_shared_operand_is_an_error_not_a_guess():
    """A conv output two adds requantize (TVM-only may merge their equal requantize chains into
    one kernel of its own, 4 lanes of int32): refcg refuses to guess on aarch64."""
    mod = shared_operand()
    with pytest.raises(RefcgError, match="also requantized by another kernel"):
        with tvm.transform.PassContext(opt_level=3):
            relay.build(partition_for_refcg(mod), target=TARGET_NEON)


def test_neon_mode_only_for_aarch64_upward_int64():
    arm = tvm.target.Target(TARGET_DOTPROD)
    assert resolve_mode("None", "None", arm, True) == ("UPWARD", "int64-neon")
    assert resolve_mode("None", "None", arm, False) == ("UPWARD", "int64")  # no sse4.1: int64
    assert resolve_mode("TONEAREST", "None", arm, True) == ("TONEAREST", "int64")
