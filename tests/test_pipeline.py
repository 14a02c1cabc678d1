"""The BYOC contract: what reaches relay.ext.refcg, what comes back, what the user sees."""
import itertools

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import assert_not_degenerate, build_and_load, compare_with_tvm, random_int, run, spy_on_codegen
from models import module, qconv_block
from refcodegen import RefcgError, codegen, objcache, offload_report, partition_for_refcg
from refcodegen.emit import c_identifier, core_source
from refcodegen.partition import refcg_functions


def conv_model(rng, layout="NCHW", in_c=8, **kw):
    shape = (1, in_c, 10, 10) if layout == "NCHW" else (1, 10, 10, in_c)
    x = relay.var("x", shape=shape, dtype="int8")
    return module([x], qconv_block(x, rng, in_c=in_c, out_c=16, layout=layout, **kw)), shape


@pytest.fixture
def observed(monkeypatch):
    seen = []
    spy_on_codegen(monkeypatch, lambda stage, func: seen.append((stage, func)))
    return seen


def qnn_calls(expr, name):
    found = []
    relay.analysis.post_order_visit(
        expr, lambda n: found.append(n) if isinstance(n, relay.Call) and getattr(n.op, "name", None) == name else None
    )
    return found


def test_partition_arrives_intact_with_qparams(tmp_path, rng, observed):
    mod, shape = conv_model(rng, per_channel=True, input_zp=3, output_zp=-2, clip=(0, 127))
    compare_with_tvm(mod, {"x": random_int(rng, shape, "int8")}, tmp_path, expect_partitions=1)
    received = [f for stage, f in observed if stage == "received"][-1]
    assert int(received.attrs["Primitive"]) == 1 and str(received.attrs["global_symbol"]).startswith("tvmgen_")
    (conv,) = qnn_calls(received, "qnn.conv2d")
    (req,) = qnn_calls(received, "qnn.requantize")
    assert int(conv.args[2].data.numpy()) == 3  # input zero point untouched by the main pipeline
    assert req.args[1].data.numpy().shape == (16,)  # per-channel scales still there
    assert int(req.args[4].data.numpy()) == -2
    # FuseOps/Legalize never ran on it: no lowered ops such as nn.conv2d or fixed_point_multiply
    assert not qnn_calls(received, "nn.conv2d") and not qnn_calls(received, "fixed_point_multiply")


def test_weights_are_not_copied_into_params(rng):
    mod, _ = conv_model(rng)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partition_for_refcg(mod), target="llvm")
    assert len(lib.get_params()) == 0  # constant_updater returns {}: weights live in the C source


def compile_strictly(tmp_path, name: str, source: str):
    """``source`` compiles as C++ (g++, as export_library does) and as C11 with -Wall -Wextra -Werror."""
    import subprocess

    from tvm._ffi.libinfo import find_include_path

    includes = [f"-I{p}" for p in find_include_path()]
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    for compiler in (["g++", "-x", "c++"], ["gcc", "-x", "c", "-std=c11"]):
        result = subprocess.run(compiler + ["-Wall", "-Wextra", "-Werror", "-c", str(src), "-o",
                                            str(tmp_path / f"{name}.o")] + includes, capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_generated_c_compiles_without_warnings(tmp_path, rng):
    """A partition's C; the core's (a minute of g++ -O3 per compile) is checked strictly elsewhere:
    as C++ by test_cli's emitted Makefile (the same core_source), as C by the cffi core build and
    file by file, C and C++, by test_core_library's `make -C runtime check`."""
    mod, _ = conv_model(rng, layout="NHWC", in_c=16, bias=False, per_channel=True)  # with a Winograd cache
    partitioned = partition_for_refcg(mod, target="llvm")
    (gv, func), = refcg_functions(partitioned)
    symbol, code = codegen.generate_c(func.with_attr("global_symbol", gv.name_hint))
    compile_strictly(tmp_path, "part", code)
    assert symbol in code and "refcg_wino_release(&" in code


def every_family(rng):
    """One graph with a kernel of every family (reduced sizes: it is compiled, not run)."""
    def q(scale, zp=0):
        return relay.const(np.float32(scale)), relay.const(zp)

    x = relay.var("x", shape=(1, 4, 6, 6), dtype="int8")
    y = qconv_block(x, rng, in_c=4, out_c=4, input_scale=0.1)  # conv2d, requantized to scale 0.1
    y = relay.nn.max_pool2d(y, pool_size=(2, 2), strides=(2, 2))  # pool2d
    y = relay.qnn.op.quantize(relay.image.resize2d(relay.qnn.op.dequantize(y, *q(0.1)), (3, 3), None, "NCHW",
                                                   "nearest_neighbor", "asymmetric"), *q(0.1))  # qdq_resize (3 -> 3)
    y = relay.qnn.op.add(y, y, *q(0.1), *q(0.1), *q(0.2))  # binary
    y = relay.qnn.op.concatenate([y, y], [q(0.2)[0]] * 2, [q(0.2)[1]] * 2, *q(0.2), axis=1)  # concatenate
    y = relay.qnn.op.sigmoid(y, *q(0.2), *q(1 / 256, -128))  # lut
    y = relay.qnn.op.requantize(y, *q(1 / 256, -128), *q(0.02), out_dtype="int8")  # requantize
    y = relay.qnn.op.softmax(y, *q(0.02), *q(1 / 256, -128), axis=1)  # softmax
    y = relay.reshape(relay.transpose(y, (0, 2, 3, 1)), (1, 72))  # copy; the reshape goes with the dense
    w = relay.const(rng.integers(-8, 8, (10, 72)).astype("int8"))
    y = relay.qnn.op.dense(y, w, relay.const(-128), relay.const(0), *q(1 / 256)[:1], relay.const(np.float32(0.01)),
                           units=10)
    y = relay.qnn.op.requantize(y, *q(0.01 / 256), *q(0.05), out_dtype="int8")  # dense's epilogue
    z = relay.reshape(y, (1, 2, 5))
    b = relay.qnn.op.batch_matmul(z, z, relay.const(0), relay.const(0), *q(0.05)[:1], *q(0.05)[:1])  # batch_matmul
    f = relay.qnn.op.dequantize(y, *q(0.05))  # quantize (dequantize) to a float softmax
    y = relay.qnn.op.quantize(relay.nn.softmax(relay.qnn.op.dequantize(y, *q(0.05))), *q(1 / 256, -128))
    s = relay.cast(relay.mean(relay.cast(y, "int32"), axis=[1], keepdims=True), "int8")  # reduce
    return module([x], relay.Tuple([s, relay.qnn.op.quantize(f, *q(0.05)), b]))


def test_every_family_renders_c_that_compiles_without_warnings(tmp_path, rng):
    from refcodegen import ops

    partitioned = partition_for_refcg(every_family(rng), target="llvm")
    report = offload_report(partitioned)
    assert {c for kernels in report.partitions.values() for c, _ in kernels} == set(ops.BY_COMPOSITE), str(report)
    for gv, func in refcg_functions(partitioned):
        symbol, code = codegen.generate_c(func.with_attr("global_symbol", gv.name_hint))
        compile_strictly(tmp_path, symbol, code)


def test_a_library_holds_one_core_however_many_partitions(tmp_path, rng):
    """Every partition module imports the one core module; the exported library defines each core
    entry point once, hidden (not exported to other libraries in the process)."""
    import subprocess

    x = relay.var("x", shape=(1, 8, 10, 10), dtype="int8")
    y = qconv_block(x, rng, in_c=8, out_c=8)
    y = relay.cast(relay.nn.relu(relay.cast(y, "float32")), "int8")  # float op between: two partitions
    mod = module([x], qconv_block(y, rng, in_c=8, out_c=8))
    partitioned = compare_with_tvm(mod, {"x": random_int(rng, (1, 8, 10, 10), "int8")}, tmp_path, expect_partitions=2)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partitioned, target="llvm")
    parts = [m for m in lib.get_lib().imported_modules if m.type_key == "c"]
    assert len(parts) == 2 and all(len(p.imported_modules) == 1 for p in parts)
    assert parts[0].imported_modules[0] == parts[1].imported_modules[0]
    assert parts[0].imported_modules[0].get_source() == core_source()
    lib.export_library(str(tmp_path / "two.so"), fcompile=objcache.create_shared)
    symbols = subprocess.run(["nm", str(tmp_path / "two.so")], capture_output=True, text=True, check=True).stdout
    defined = [line.split()[1:] for line in symbols.splitlines() if line.endswith(" refcg_conv2d")]
    assert defined == [["t", "refcg_conv2d"]], defined  # once, local to the library


def test_export_needs_no_compiler_flags(tmp_path, rng):
    """The generated source asks GCC for -O3 itself: compare with the same source built at plain -O0."""
    import subprocess

    from tvm._ffi.libinfo import find_include_path

    mod, _ = conv_model(rng, layout="NHWC")
    (gv, func), = refcg_functions(partition_for_refcg(mod, target="llvm"))
    symbol, code = codegen.generate_c(func.with_attr("global_symbol", gv.name_hint))
    includes = [f"-I{p}" for p in find_include_path()]

    def stack_traffic(source: str, name: str) -> float:
        (tmp_path / f"{name}.c").write_text(source)
        obj = tmp_path / f"{name}.o"
        subprocess.run(["g++", "-x", "c++", "-c", str(tmp_path / f"{name}.c"), "-o", str(obj)] + includes, check=True)
        asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        body = [line for line in asm if "\t" in line]
        return sum("(%rbp)" in line for line in body) / max(1, len(body))

    as_generated = stack_traffic(code, "generated")
    unoptimized = stack_traffic(code.replace('#pragma GCC optimize("O3", "fp-contract=off")', ""), "plain")
    # -O0 keeps every local on the stack frame; optimized code keeps them in registers
    assert unoptimized > 0.05 and as_generated < unoptimized / 10, (as_generated, unoptimized)


def test_report_explains_what_stays_in_tvm(rng):
    mod, _ = conv_model(rng, clip=(-200, 300))  # clip wider than int8: rejected with a reason
    x = mod["main"].params[0]
    bad = qconv_block(x, rng, in_c=8, out_c=4, kernel=(1, 1), padding=(0, 0))
    mod = module([x], relay.Tuple([mod["main"].body, relay.nn.softmax(relay.cast(bad, "float32"))]))
    report = offload_report(partition_for_refcg(mod))
    text = str(report)
    assert "clip bounds [-200.0, 300.0] are outside the int8 range" in text
    assert report.stayed_ops["nn.softmax"] == 1
    assert report.offloaded_ops["qnn.conv2d"] == 2  # the rejected clip's conv offloads without the clip
    assert 0 < report.qnn_fraction() <= 1


def test_runtime_weight_stays_in_tvm_and_runs(tmp_path, rng):
    x = relay.var("x", shape=(1, 8, 10, 10), dtype="int8")
    w = relay.var("w", shape=(16, 8, 3, 3), dtype="int8")
    y = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.1), relay.const(0.1),
                            kernel_size=(3, 3), channels=16)
    y = relay.qnn.op.requantize(y, relay.const(0.01), relay.const(0), relay.const(0.2), relay.const(0))
    mod = module([x, w], y)
    partitioned = partition_for_refcg(mod)
    report = offload_report(partitioned)
    assert report.stayed_ops["qnn.conv2d"] == 1 and report.offloaded_ops["qnn.conv2d"] == 0
    assert "needs constant weights" in str(report)
    data = {"x": random_int(rng, (1, 8, 10, 10), "int8"), "w": random_int(rng, (16, 8, 3, 3), "int8")}
    got = run(build_and_load(partitioned, "llvm", tmp_path, "fallback"), data)[0]
    want = run(build_and_load(mod, "llvm", tmp_path, "tvm"), data)[0]
    np.testing.assert_array_equal(got, want)


def weight_input_model(rng):
    """main(x, w): qnn.conv2d with a weight input, then a float tail for FakeQuantizationToInteger
    (dequantize -> relu -> quantize) and for batch-norm folding (dequantize -> batch_norm -> quantize)."""
    x = relay.var("x", shape=(1, 8, 10, 10), dtype="int8")
    w = relay.var("w", shape=(16, 8, 3, 3), dtype="int8")
    y = relay.qnn.op.conv2d(x, w, relay.const(0), relay.const(0), relay.const(0.05), relay.const(0.01),
                            kernel_size=(3, 3), channels=16, padding=(1, 1))
    y = relay.qnn.op.requantize(y, relay.const(0.0005), relay.const(0), relay.const(0.1), relay.const(0),
                                out_dtype="int8")
    f = relay.nn.relu(relay.qnn.op.dequantize(y, relay.const(0.1), relay.const(0)))
    y = relay.qnn.op.quantize(f, relay.const(0.1), relay.const(0), out_dtype="int8")
    f = relay.qnn.op.dequantize(y, relay.const(0.1), relay.const(0))
    gamma, beta = rng.uniform(0.5, 2, 16).astype("float32"), rng.uniform(-1, 1, 16).astype("float32")
    mean, var = rng.uniform(-1, 1, 16).astype("float32"), rng.uniform(0.5, 2, 16).astype("float32")
    f = relay.nn.batch_norm(f, *(relay.const(v) for v in (gamma, beta, mean, var)))[0]
    return module([x, w], relay.qnn.op.quantize(f, relay.const(0.1), relay.const(0), out_dtype="int8"))


@pytest.mark.parametrize("bind", [False, True])
def test_partition_leaves_its_argument_unchanged(tmp_path, rng, bind):
    """Every option combination returns a new module; the caller's still has main(x, w) and builds."""
    mod = weight_input_model(rng)
    weight = random_int(rng, (16, 8, 3, 3), "int8")
    params = {"w": weight} if bind else None
    original = tvm.ir.load_json(tvm.ir.save_json(mod))
    for fold, fq2i, target in itertools.product([False, True], [False, True], [None, "llvm"]):
        partitioned = partition_for_refcg(mod, params, target=target, fold_batch_norm=fold,
                                          fake_quantization_to_integer=fq2i)
        assert refcg_functions(partitioned) and partitioned is not mod
        assert [p.name_hint for p in partitioned["main"].params] == (["x"] if bind else ["x", "w"])
        assert tvm.ir.structural_equal(original, mod), (fold, fq2i, target)
        assert mod.attrs is None or "refcg_rejections" not in mod.attrs
    # the caller's module still builds TVM-only, with the weight as a param or an input, and
    # matches the last partitioned build (FakeQuantizationToInteger and batch-norm folding both ran)
    data = {"x": random_int(rng, (1, 8, 10, 10), "int8"), **({} if bind else {"w": weight})}
    want = run(build_and_load(mod, "llvm", tmp_path, "tvm", params), data)[0]
    got = run(build_and_load(partitioned, "llvm", tmp_path, "refcg"), data)[0]
    assert_not_degenerate([want])
    np.testing.assert_array_equal(got, want)


def test_explicit_target_fixes_the_numerics(tmp_path, rng):
    """partition_for_refcg(target=...) gives the partition the numerics of that target."""
    mod, shape = conv_model(rng, weight_range=(-63, 63), input_zp=1, output_zp=3)
    data = {"x": random_int(rng, shape, "int8")}
    skylake = "llvm -mcpu=skylake"
    want = run(build_and_load(mod, skylake, tmp_path, "tvm"), data)[0]
    got = run(build_and_load(partition_for_refcg(mod, target=skylake), skylake, tmp_path, "refcg"), data)[0]
    np.testing.assert_array_equal(got, want)


def test_the_build_target_is_found_under_relay_build_and_vm_compile(rng, monkeypatch):
    """Without target=, the codegen reproduces the target relay.build or relay.vm.compile was given."""
    found = []
    resolve = codegen.resolve_build_target
    monkeypatch.setattr(codegen, "resolve_build_target", lambda func: found.append(resolve(func)) or found[-1])
    mod, _ = conv_model(rng)
    skylake = tvm.target.Target("llvm -mcpu=skylake")
    with tvm.transform.PassContext(opt_level=3):
        relay.build(partition_for_refcg(mod), target=skylake)
        relay.vm.compile(partition_for_refcg(mod), target=skylake)
        with tvm.target.Target("llvm -mcpu=sandybridge"):  # relay.build's target=None: the current one
            relay.build(partition_for_refcg(mod))
    assert [str(t) for t in found] == [str(skylake)] * 2 + [str(tvm.target.Target("llvm -mcpu=sandybridge"))]


def test_without_a_build_on_the_stack_the_codegen_asks_for_target(rng):
    (gv, func), = refcg_functions(partition_for_refcg(conv_model(rng)[0]))
    with pytest.raises(RefcgError, match="pass target= to partition_for_refcg"):
        codegen.generate_c(func.with_attr("global_symbol", gv.name_hint))


@pytest.mark.parametrize("build", ["relay.build", "vm.compile"])
def test_a_partition_built_for_another_target_is_an_error_naming_both(rng, build):
    """Partitioned for skylake (float32 requantize), built for llvm (int64): refcg would compute the
    wrong target's numerics; the build stops instead."""
    partitioned = partition_for_refcg(conv_model(rng)[0], target="llvm -mcpu=skylake")
    compile_ = relay.build if build == "relay.build" else relay.vm.compile
    with pytest.raises(RefcgError) as error, tvm.transform.PassContext(opt_level=3):
        compile_(partitioned, target="llvm")
    assert "-mcpu=skylake" in error.value.reason and "built for 'llvm" in error.value.reason, error.value.reason


@pytest.mark.parametrize("name", ["ok_name", "a" * 10])
def test_c_identifier_accepts_plain_names(name):
    assert c_identifier(name, "x") == name


@pytest.mark.parametrize("name", ['x"); system("rm', "a b", "1abc", "", "ok\n#include <x>", "a" * 300])
def test_c_identifier_rejects_hostile_names(name):
    with pytest.raises(RefcgError, match="not a valid C identifier"):
        c_identifier(name, "partition")


@pytest.mark.slow  # make test-slow (CI): a build speed-up, not a result
def test_object_cache_compiles_each_c_file_once(tmp_path, rng, monkeypatch):
    """refcodegen.objcache: a second model's export reuses the core's object (one new object: its
    partition), and the library computes what the default export path's does."""
    from refcodegen.runner import load

    monkeypatch.setenv("REFCG_OBJECT_CACHE", str(tmp_path / "cache"))
    x = relay.var("x", shape=(1, 8, 10, 10), dtype="int8")
    inputs = {"x": random_int(rng, (1, 8, 10, 10), "int8")}
    for name, out_c, objects in [("a", 8, 2), ("b", 16, 3)]:  # core + partition, then + one partition
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(partition_for_refcg(module([x], qconv_block(x, rng, in_c=8, out_c=out_c))), target="llvm")
        lib.export_library(str(tmp_path / f"{name}.so"), fcompile=objcache.create_shared)
        assert len(list((tmp_path / "cache").glob("*.o"))) == objects
    lib.export_library(str(tmp_path / "b_default.so"))
    assert np.array_equal(run(load(str(tmp_path / "b.so")), inputs)[0], run(load(str(tmp_path / "b_default.so")), inputs)[0])
