"""The refcg command line end to end on small ONNX Runtime-quantized models (in process: TVM loads once)."""
import re
import subprocess
import sys

import numpy as np
import pytest

from examples import onnx_models
from refcodegen import RefcgError, cli, codegen


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense-only MLP (fast to build) and a small CNN (conv, depthwise, add), QDQ int8."""
    folder = tmp_path_factory.mktemp("models")
    return {name: onnx_models.quantize(onnx_models.MODELS[name](), str(folder / f"{name}.onnx"))
            for name in ("mlp", "tiny_cnn")}


def test_compile_and_run_match_tvm_only(models, tmp_path, capsys):
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **onnx_models.example_input(models["mlp"]))
    outputs = {}
    for name, extra in [("refcg", []), ("tvm", ["--tvm-only"])]:
        lib = str(tmp_path / f"{name}.so")
        assert cli.main(["compile", models["mlp"], "-o", lib, *extra]) == 0
        assert cli.main(["run", lib, "--inputs", str(inputs), "-o", str(tmp_path / f"{name}.npz")]) == 0
        outputs[name] = np.load(tmp_path / f"{name}.npz")["output_0"]
    assert outputs["refcg"].shape == (8, 64) and outputs["refcg"].dtype == np.float32
    np.testing.assert_array_equal(outputs["refcg"], outputs["tvm"])
    assert "[refcg] building refcg for 'llvm': " in capsys.readouterr().err  # progress with timing

    assert cli.main(["run", str(tmp_path / "refcg.so")]) == 0  # inputs made from refcg.so.json
    assert "random inputs (seed 0): input float32[8, 64]" in capsys.readouterr().out


def test_report_lists_kernels_and_reasons(models, capsys):
    assert cli.main(["report", models["tiny_cnn"]]) == 0
    out = capsys.readouterr().out
    assert "refcg.conv2d" in out and "qnn.conv2d -> nn.bias_add -> qnn.requantize" in out
    stayed = [line for line in out.splitlines() if line.startswith("  TVM ")]
    assert all(re.match(r"  TVM +\S+ +\[.*\] +\S", line) for line in stayed)  # op, type, reason
    assert "QNN ops offloaded: " in out


def test_emit_writes_c_that_builds_warning_free(models, tmp_path, capsys):
    out = tmp_path / "emitted"
    assert cli.main(["emit", models["tiny_cnn"], "-o", str(out)]) == 0
    sources = sorted(p.name for p in out.glob("*.c"))
    partitions = [name for name in sources if name.startswith("tvmgen_default_refcg_main_")]
    assert partitions and sources == ["refcg_core.c"] + partitions
    assert "refcg.conv2d" in (out / "report.txt").read_text()
    build = subprocess.run(["make", "-C", str(out)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    assert len(list(out.glob("*.o"))) == len(sources)
    symbols = subprocess.run(["nm", str(out / "refcg.so")], capture_output=True, text=True, check=True).stdout
    undefined = [line.split()[-1] for line in symbols.splitlines() if line.split()[0] == "U"]
    assert not [name for name in undefined if name.startswith("refcg_")], undefined  # the core links in
    assert all(f" T {name[:-2]}" in symbols for name in partitions)


@pytest.mark.slow  # make test-slow (CI): the bench's own table
def test_bench_table(models, capsys):
    assert cli.main(["bench", models["mlp"], "--number", "1", "--repeat", "1"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert float(rows["refcg"][-2]) == 0.0 and rows["refcg"][-1] == "32/32"  # max |diff|, top-1 agreement
    assert {"TVM-only", "refcg", "ONNX"} <= set(rows)


def test_codegen_error_names_op_and_reason(models, tmp_path, capsys, monkeypatch):
    """A RefcgError raised inside relay.build crosses TVM's FFI; the CLI still prints op and reason."""
    def refuse(func):
        raise RefcgError("qnn.dense", "weight", "refused by this test")

    monkeypatch.setattr(codegen, "scoped_fold", refuse)
    assert cli.main(["compile", models["mlp"], "-o", str(tmp_path / "x.so")]) == 2
    assert "refcg: error: qnn.dense: weight: refused by this test" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fragment", [
    (["report", "model.tflite"], "model: "),
    (["report", "m.onnx", "--input-shape", "1x3"], "--input-shape: 1x3: expected NAME:DxDx"),
    (["run", "nothing.so"], ""),
])
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.tflite").write_bytes(b"\0")
    (tmp_path / "m.onnx").write_bytes(b"\0")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("refcg: error: ") and fragment in err


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "refcodegen.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "compile" in done.stdout and "bench" in done.stdout
