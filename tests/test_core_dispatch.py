"""The dispatching kernels inside exported models: every variant compiled for this architecture
(forced by REFCG_ISA, which a library reads at its first call; a variant the host cannot run is a
skip naming the CPU features it lacks), TVM's thread pool, and warning-free generated C."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import TARGET_LLVM, build_and_load, random_int, run
from models import module, qconv_block
from refcodegen import objcache, partition_for_refcg
from core_cffi import Core


def network(rng):
    """NCHW conv (GEMM path, transposed copy) -> max pool + residual qnn.add -> depthwise (plane
    kernels) -> 1x1 -> 1x1 -> depthwise reading the planner's channels-last tensor and writing the
    NCHW output (the channel kernels' strided store), full-range int8 weights."""
    x = relay.var("x", shape=(1, 13, 15, 14), dtype="int8")
    y = qconv_block(x, rng, in_c=13, out_c=24, per_channel=True, clip=(-100, 127), input_zp=-3, output_zp=2)
    pooled = relay.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1))
    q = (relay.const(np.float32(0.1)), relay.const(2))
    y = relay.qnn.op.add(y, pooled, *q, *q, relay.const(np.float32(0.12)), relay.const(-1))
    y = qconv_block(y, rng, in_c=24, out_c=24, groups=24, strides=(2, 2), input_scale=0.12, input_zp=-1)
    y = qconv_block(y, rng, in_c=24, out_c=35, kernel=(1, 1), padding=(0, 0), input_scale=0.1)
    # 80 channels: 5 blocks of 16, two AVX-512 channel groups, which threads must not split by group
    y = qconv_block(y, rng, in_c=35, out_c=80, kernel=(1, 1), padding=(0, 0), input_scale=0.1)
    y = qconv_block(y, rng, in_c=80, out_c=80, groups=80, input_scale=0.1)
    return module([x], y), {"x": random_int(rng, (1, 13, 15, 14), "int8")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(11)
    mod, inputs = network(rng)
    tmp = tmp_path_factory.mktemp("dispatch")
    reference = run(build_and_load(mod, TARGET_LLVM, tmp, "tvm_only"), inputs)[0]
    partitioned = partition_for_refcg(mod)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partitioned, target=TARGET_LLVM)
    path = str(tmp / "refcg.so")
    # objcache: the core object the other tests compiled (the default export path, a minute of g++ for
    # the same object, is test_tvmc's: tvmc exports with it)
    lib.export_library(path, fcompile=objcache.create_shared)
    sources = [m.get_source() for m in lib.get_lib().imported_modules if m.type_key == "c"]
    return path, inputs, reference, sources


CORE = Core()


@pytest.mark.parametrize("isa", list(CORE.compiled_variants()))
def test_every_variant_bit_exact_in_exported_model(built, isa, tmp_path):
    """A fresh copy of the library per variant (dlopen would hand back the loaded one, whose core has
    chosen its variant already), loaded with REFCG_ISA set."""
    CORE.require(isa)
    path, inputs, reference, _ = built
    copy = shutil.copy(path, tmp_path / f"refcg_{isa}.so")
    saved = os.environ.get("REFCG_ISA")
    try:
        os.environ["REFCG_ISA"] = isa
        graph = tvm.contrib.graph_executor.GraphModule(tvm.runtime.load_module(str(copy))["default"](tvm.cpu()))
        assert np.array_equal(run(graph, inputs)[0], reference), isa
    finally:
        os.environ.pop("REFCG_ISA", None) if saved is None else os.environ.__setitem__("REFCG_ISA", saved)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("isa", ["", "avx2"], ids=["best", "avx2"])
def test_thread_pool_results_identical(built, threads, isa, tmp_path):
    """A fresh process per TVM_NUM_THREADS (the pool size is fixed at its first use): 3 threads split
    the GEMM tiles inside row blocks and channel groups. The timeouts are generous: on 2 cores shared
    with 3 other busy processes a 3-thread run took 22 s (the pool's spinning barriers), under a make
    test beside them over 120 s."""
    if isa:
        CORE.require(isa)
    path, inputs, reference, _ = built
    np.save(tmp_path / "x.npy", inputs["x"])
    script = (
        "import sys, numpy as np, tvm\nfrom tvm.contrib import graph_executor\n"
        f"g = graph_executor.GraphModule(tvm.runtime.load_module({path!r})['default'](tvm.cpu()))\n"
        f"g.set_input('x', np.load({str(tmp_path / 'x.npy')!r})); g.run()\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, g.get_output(0).numpy())\n"
    )
    env = dict(os.environ, TVM_NUM_THREADS=threads, **({"REFCG_ISA": isa} if isa else {}))
    subprocess.run([os.sys.executable, "-c", script], env=env, check=True, timeout=600)
    assert np.array_equal(np.load(tmp_path / "y.npy"), reference)


@pytest.mark.parametrize("language", ["c++", "c"])
def test_generated_c_compiles_warning_free(built, tmp_path, language):
    _, _, _, sources = built
    assert sources and all("refcg_conv2d(&" in s for s in sources)
    assert any("refcg_binary(&" in s for s in sources) and any("refcg_pool2d(&" in s for s in sources)
    includes = []
    for path in tvm._ffi.libinfo.find_include_path():
        includes += ["-I", path]
    for i, source in enumerate(sources):
        src = tmp_path / f"gen{i}.c"
        src.write_text(source)
        subprocess.run(["g++" if language == "c++" else "gcc", "-x", language, "-Wall", "-Wextra", "-Werror",
                        "-c", "-o", str(tmp_path / f"gen{i}.o"), *includes, str(src)], check=True, capture_output=True)


def test_reference_only_conv_compiles_and_matches(tmp_path):
    """A grouped conv (no accelerated layout) emits REFCG_FAST_NONE and runs the reference."""
    from conftest import compare_with_tvm

    rng = np.random.default_rng(12)
    x = relay.var("x", shape=(1, 8, 9, 9), dtype="int8")
    y = qconv_block(x, rng, in_c=8, out_c=12, groups=2, input_zp=1)
    partitioned = compare_with_tvm(module([x], y), {"x": random_int(rng, (1, 8, 9, 9), "int8")}, tmp_path)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partitioned, target=TARGET_LLVM)
    source = next(m.get_source() for m in lib.get_lib().imported_modules if m.type_key == "c")
    assert re.search(r"refcg_conv2d_fast \w+_fast = \{\s*\.kind = REFCG_FAST_NONE,", source)


def test_avx2_vpmaddubsw_path_in_exported_model(tmp_path):
    """A conv whose weights all pass the pair proof and a dense with one unit past it, built through
    relay.build and run in a child process with REFCG_ISA=avx2 on 2 threads: bit-exact with TVM-only, and the
    library holds the proof's flags (conv: every block, dense: all but the block of that unit)."""
    from conftest import build_and_load

    CORE.require("avx2")
    rng = np.random.default_rng(13)
    x = relay.var("x", shape=(1, 16, 12, 12), dtype="int8")
    conv = qconv_block(x, rng, in_c=16, out_c=24, per_channel=True, input_zp=-3, output_zp=2, weight_range=(-64, 63))
    d = relay.var("d", shape=(5, 40), dtype="uint8")
    w = rng.integers(-64, 64, (40, 40))
    w[21] = rng.integers(-128, 128, 40)  # block 1 (units 16-31) keeps vpmaddwd
    dense = relay.qnn.op.dense(d, relay.const(w.astype("int8")), relay.const(128), relay.const(0),
                               relay.const(np.float32(0.05)), relay.const(np.float32(0.01)), units=40)
    dense = relay.qnn.op.requantize(dense, relay.const(np.float32(0.0005)), relay.const(0),
                                    relay.const(np.float32(0.1)), relay.const(-4), out_dtype="int8")
    mod = module([x, d], relay.Tuple([conv, dense]))
    inputs = {"x": random_int(rng, (1, 16, 12, 12), "int8"), "d": random_int(rng, (5, 40), "uint8")}
    reference = run(build_and_load(mod, TARGET_LLVM, tmp_path, "tvm_only"), inputs)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(partition_for_refcg(mod), target=TARGET_LLVM)
    source = "".join(m.get_source() for m in lib.get_lib().imported_modules if m.type_key == "c")
    assert sorted(re.findall(r"_gsafe\[\d+\] = \{ ([\d, ]+) \}", source)) == ["1, 0, 1", "1, 1"]
    lib.export_library(str(tmp_path / "refcg.so"), fcompile=objcache.create_shared)
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = (
        "import sys, numpy as np, tvm\nfrom tvm.contrib import graph_executor\n"
        f"g = graph_executor.GraphModule(tvm.runtime.load_module({str(tmp_path / 'refcg.so')!r})['default'](tvm.cpu()))\n"
        f"inputs = np.load({str(tmp_path / 'inputs.npz')!r})\n"
        "for k in inputs.files: g.set_input(k, inputs[k])\n"
        f"g.run(); np.savez({str(tmp_path / 'out.npz')!r}, *[g.get_output(i).numpy() for i in range(2)])\n"
    )
    # two threads: each gets a range of row tiles ending inside a block (the 1-3 row tail kernels)
    env = dict(os.environ, REFCG_ISA="avx2", TVM_NUM_THREADS="2")
    subprocess.run([os.sys.executable, "-c", script], env=env, check=True, timeout=600)
    got = np.load(tmp_path / "out.npz")
    for i, want in enumerate(reference):
        assert np.array_equal(got[f"arr_{i}"], want), i
        assert len(np.unique(want)) > 8  # not a collapsed output
