"""refcg.batch_matmul (qnn.batch_matmul on run-time operands + bias + requantize + clip + cast) against
TVM-only: bit-exact; what TVM-only computes differently stays in TVM with a reason."""
import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import compare_with_tvm, random_int
from models import module
from refcodegen import offload_report, partition_for_refcg
from test_ops_common import Cases, const, stays_in_tvm


def bmm(x, y, x_zp=0, y_zp=0):
    return relay.qnn.op.batch_matmul(x, y, const(x_zp, "int32"), const(y_zp, "int32"), const(0.05), const(0.02))


def requantize(y, out_dtype, rng=None, channels=None, out_zp=0, clip=None, cast=None):
    """Per-tensor, or per output column (axis 2) with ``channels`` scales."""
    scale = rng.uniform(0.0005, 0.002, channels).astype("float32") if channels else np.float32(0.001)
    y = relay.qnn.op.requantize(y, relay.const(scale), const(0, "int32"), const(0.08), const(out_zp, "int32"),
                                axis=2, out_dtype=out_dtype)
    y = relay.clip(y, *clip) if clip else y
    return relay.cast(y, cast) if cast else y


SWEEP = [
    # x shape, y shape, x dtype, y dtype, (x zp, y zp), epilogue: (out dtype, out zp, clip) or None (int32 kept)
    ((2, 3, 7), (2, 5, 7), "int8", "int8", (3, -2), ("int8", 1, None)),
    ((3, 17, 19), (3, 33, 19), "uint8", "int8", (128, 0), ("uint8", 120, (10, 250))),  # M, N not multiples of 4/8/16
    ((2, 4, 9), (2, 6, 9), "int8", "uint8", (-5, 130), None),
    ((1, 5, 1), (1, 3, 1), "uint8", "uint8", (7, 200), ("int8", -3, None)),  # K = 1
    ((1, 1, 6), (1, 1, 6), "int8", "int8", (0, 0), ("int8", 0, None)),  # 1x1 output
    ((4, 2, 3), (1, 3, 3), "int8", "int8", (-1, 4), ("int8", 2, (-100, 100))),  # y broadcast over the batch
    ((1, 3, 5), (2, 4, 5), "int8", "uint8", (2, 128), None),  # x broadcast
    ((2, 3, 8), (2, 16, 8), "uint8", "int8", (100, -3), ("uint8", 0, None)),  # TVM's batch_matmul_int8.x86 path
    ((2, 6, 4), (1, 16, 4), "int8", "int8", (1, 1), ("int8", 5, None)),  # int8 x int8 broadcast with N % 16 == 0
]


def test_batch_matmul_matches_tvm(tmp_path, rng):
    cases = Cases()
    for x_shape, y_shape, x_dt, y_dt, (x_zp, y_zp), epi in SWEEP:
        y = bmm(cases.var(x_shape, x_dt, rng), cases.var(y_shape, y_dt, rng), x_zp, y_zp)
        cases.add(requantize(y, epi[0], out_zp=epi[1], clip=epi[2]) if epi else y)
    # per-column requantize, then clip and cast after a requantize to int32 (PyTorch's form), plus a bias
    x, y = cases.var((2, 5, 11), "int8", rng), cases.var((2, 7, 11), "int8", rng)
    acc = relay.add(bmm(x, y, 4, -6), relay.const(rng.integers(-500, 500, 7).astype("int32")))
    cases.add(requantize(acc, "int8", rng, channels=7, out_zp=-2))
    cases.add(requantize(bmm(x, y, 1, 2), "int32", clip=(-128, 127), cast="int8"))
    # one tensor on both sides (x . x^T), and y from another branch (a reshaped tensor) and a constant y
    a = cases.var((2, 4, 6), "uint8", rng)
    cases.add(requantize(bmm(a, a, 128, 128), "uint8", out_zp=128))
    b = cases.var((2, 30), "int8", rng)
    cases.add(requantize(bmm(a, relay.reshape(b, (2, 5, 6)), 128, -1), "int8"))
    cases.add(requantize(bmm(a, relay.const(random_int(rng, (1, 3, 6), "int8")), 128, 0), "int8"))
    partitioned = cases.compare(tmp_path)
    assert offload_report(partitioned).offloaded_ops["qnn.batch_matmul"] == len(SWEEP) + 5


@pytest.mark.parametrize("numerics", ["float32", "tonearest"])
def test_batch_matmul_requantize_modes(tmp_path, rng, numerics):
    """skylake: TVM-only requantizes in float32 with FMA; tonearest: the int64 rounding attribute."""
    cases = Cases()
    x, y = cases.var((2, 5, 13), "int8", rng), cases.var((2, 9, 13), "uint8", rng)
    cases.add(requantize(bmm(x, y, -3, 129), "int8", out_zp=3, clip=(-90, 110)))
    cases.add(requantize(bmm(x, x, 2, 2), "uint8", rng, channels=5, out_zp=100))
    cases.compare(tmp_path, numerics)


def test_overflowing_accumulator_stays_in_tvm():
    """Run-time operands: the bound is K * max|x - zx| * max|y - zy| = 33100 * 255 * 255 > 2^31 - 1."""
    x = relay.var("x", shape=(1, 2, 33100), dtype="int8")
    y = relay.var("y", shape=(1, 3, 33100), dtype="int8")
    line = stays_in_tvm(module([x, y], bmm(x, y, 127, 127)), "qnn.batch_matmul")
    assert "int32 accumulator can overflow" in line
    a, b = (relay.var(n, shape=(1, 2, 33000), dtype="int8") for n in "ab")  # 33000 * 255 * 255 fits: offloaded
    assert not offload_report(partition_for_refcg(module([a, b], bmm(a, b, 127, 127)))).stayed


def test_what_tvm_computes_differently_stays_in_tvm():
    x = relay.var("x", shape=(relay.Any(), 3, 8), dtype="int8")
    y = relay.var("y", shape=(2, 4, 8), dtype="int8")
    assert "x shape must be static" in stays_in_tvm(module([x, y], bmm(x, y)), "qnn.batch_matmul")
    # measured: TVM-only's uint8 x int8 kernel (N % 16 == 0, K % 4 == 0) miscomputes a broadcast batch
    u = relay.var("u", shape=(3, 5, 4), dtype="uint8")
    w = relay.var("w", shape=(1, 16, 4), dtype="int8")
    assert "broadcast" in stays_in_tvm(module([u, w], bmm(u, w)), "qnn.batch_matmul")
    # aarch64: which TVM loop computes a requantize after it (NEON rounding or not) is not modelled
    from arm.host import TARGET_NEON
    a, b = relay.var("a", shape=(2, 3, 8), dtype="int8"), relay.var("b", shape=(2, 5, 8), dtype="int8")
    assert "aarch64" in stays_in_tvm(module([a, b], requantize(bmm(a, b, 1, 2), "int8")), "qnn.batch_matmul",
                                     target=TARGET_NEON)
    kept = offload_report(partition_for_refcg(module([a, b], bmm(a, b, 1, 2)), target=TARGET_NEON))
    assert kept.offloaded_ops["qnn.batch_matmul"] == 1, str(kept)  # without a requantize it is offloaded
    # other transposes type-check, but TVM's canonicalization accepts only x . y^T (batch_matmul.cc:85)
    a, b = relay.var("a", shape=(2, 3, 8), dtype="int8"), relay.var("b", shape=(2, 8, 4), dtype="int8")
    attrs = tvm.ir.make_node("relay.attrs.BatchMatmulAttrs", out_dtype="int32", transpose_a=False,
                             transpose_b=False)
    call = relay.Call(tvm.ir.Op.get("qnn.batch_matmul"), [a, b, *bmm(a, a).args[2:]], attrs)
    assert "transpose_b=False" in stays_in_tvm(module([a, b], call), "qnn.batch_matmul")


def test_core_kernel_matches_numpy(rng):
    """refcg_batch_matmul called directly (tests/core_cffi.py): int32 out, a broadcast y, a bias; bad batches -1."""
    from core_cffi import DTYPE_CODE, Core
    from refcodegen.numerics import no_requantize

    core = Core()
    x, y = random_int(rng, (3, 7, 21), "uint8"), random_int(rng, (1, 10, 21), "int8")
    bias = rng.integers(-1000, 1000, 10).astype("int32")
    p = core.ffi.new("refcg_batch_matmul_params*")
    p.batch, p.m, p.n, p.k, p.x_batch, p.y_batch = 3, 7, 10, 21, 3, 1
    p.x_dtype, p.y_dtype, p.out_dtype = DTYPE_CODE["uint8"], DTYPE_CODE["int8"], DTYPE_CODE["int32"]
    p.x_zp, p.y_zp = 129, -4
    p.bias, p.rq = core.ptr(bias, "int32_t*"), core.requant(no_requantize())[0]
    out = np.zeros((3, 7, 10), "int32")
    args = [core.ffi.from_buffer(a) for a in (x, y, out)]
    assert core.lib.refcg_batch_matmul(p, *args) == 0
    want = np.einsum("bmk,nk->bmn", x.astype(np.int64) - 129, y[0].astype(np.int64) + 4) + bias
    assert np.array_equal(out, want)
    p.y_batch = 2  # neither 1 nor the batch
    assert core.lib.refcg_batch_matmul(p, *args) == -1


def onnx_matmul(path, op: str, a_dtype: str, b_dtype: str):
    """One QLinearMatMul (a, b -> uint8) or MatMulInteger (-> int32) of two 3-D run-time inputs."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    def tensor(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    inits = {"a_scale": np.array(0.05, "float32"), "a_zp": np.array(120 if a_dtype == "uint8" else 5, a_dtype),
             "b_scale": np.array(0.02, "float32"), "b_zp": np.array(-3 if b_dtype == "int8" else 130, b_dtype),
             "y_scale": np.array(0.3, "float32"), "y_zp": np.array(100, "uint8")}
    if op == "QLinearMatMul":
        names, out = ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], "uint8"
    else:
        names, out = ["a", "b", "a_zp", "b_zp"], "int32"
    node = helper.make_node(op, names, ["y"])
    graph = helper.make_graph([node], op, [tensor("a", a_dtype, [2, 3, 8]), tensor("b", b_dtype, [2, 8, 5])],
                              [tensor("y", out, [2, 3, 5])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items() if k in node.input])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize("op,a_dtype,b_dtype", [("QLinearMatMul", "uint8", "int8"), ("MatMulInteger", "int8", "int8")])
def test_onnx_3d_matmul_offloads(tmp_path, rng, op, a_dtype, b_dtype):
    """TVM 0.19's ONNX importer turns a 3-D QLinearMatMul / MatMulInteger (equal dtypes only) into
    transpose(b) -> qnn.batch_matmul (-> reshape -> qnn.requantize TONEAREST): all of it runs in refcg."""
    from refcodegen.frontends import load_model

    model = load_model(onnx_matmul(str(tmp_path / f"{op}.onnx"), op, a_dtype, b_dtype))
    inputs = {"a": random_int(rng, (2, 3, 8), a_dtype), "b": random_int(rng, (2, 8, 5), b_dtype)}
    partitioned = compare_with_tvm(model.mod, inputs, tmp_path, params=model.params, **model.partition_options)
    report = offload_report(partitioned)
    assert report.offloaded_ops["qnn.batch_matmul"] == 1 and not report.stayed, str(report)


def test_int32_result_matches_tvm_on_aarch64(tmp_path, rng):
    """Without a requantize the op is offloaded on aarch64 too: built for +neon,+dotprod, run on the
    emulated host (QEMU max) against TVM-only's aarch64 build."""
    from arm.host import TARGET_DOTPROD, Server, ensure_host, export_aarch64
    from test_arm_models import assert_same

    ensure_host()  # skips, with the reason, where the emulator cannot be installed
    cases = Cases()
    x, y = cases.var((3, 5, 8), "uint8", rng), cases.var((1, 10, 8), "int8", rng)
    cases.add(bmm(x, y, 130, -2))  # y broadcast over the batch
    cases.add(bmm(x, x, 7, 250))
    mod = module(cases.params, relay.Tuple(cases.outputs))
    partitioned = partition_for_refcg(mod, target=TARGET_DOTPROD)
    assert offload_report(partitioned).offloaded_ops["qnn.batch_matmul"] == 2
    reference = export_aarch64(mod, TARGET_DOTPROD, tmp_path / "tvm.so")
    refcg = export_aarch64(partitioned, TARGET_DOTPROD, tmp_path / "refcg.so")
    server = Server("max", tmp_path)
    try:
        assert_same(server.run(reference, cases.inputs), server.run(refcg, cases.inputs))
    finally:
        server.close()
