"""tvmc with refcg: `python -m refcodegen.tvmc compile --target "refcg, llvm" MODEL` (TFLite, ONNX)."""
import importlib.util
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from refcodegen import RefcgError, runner, tvmc
from refcodegen.frontends import load_model


def has_refcg_partitions(library) -> bool:
    symbols = subprocess.run(["nm", str(library)], capture_output=True, text=True, check=True).stdout
    return " T tvmgen_default_refcg_main_0" in symbols


def test_tvmc_compile_and_run(tmp_path):
    """tvmc with refcg builds a package with refcg partitions; plain tvmc (a process without refcg)
    runs it, with the same outputs as tvmc's own TVM-only build."""
    missing = [m for m in ("tflite", "tensorflow") if importlib.util.find_spec(m) is None]
    if missing:  # find_spec, not import: TensorFlow must stay out of this process
        pytest.skip(f"{', '.join(missing)} not installed: the tflite and tflite-models extras (make test installs them)")
    from examples import tflite_models

    path = tflite_models.make_tflite("small_cnn")
    model = load_model(path)
    assert not tvmc.is_qdq(model.mod)  # TFLite full-int8 imports as QNN ops: no FakeQuantizationToInteger
    np.savez(tmp_path / "x.npz", **runner.random_inputs(model.inputs))
    for name, target in [("refcg", "refcg, llvm"), ("tvm", "llvm")]:
        package = str(tmp_path / f"{name}.tar")
        assert tvmc.main(["compile", "--target", target, path, "-o", package]) == 0
        with tarfile.open(package) as tar:
            tar.extract("mod.so", tmp_path / name)
        assert has_refcg_partitions(tmp_path / name / "mod.so") == (name == "refcg")
    run = [sys.executable, "-m", "tvm.driver.tvmc", "run", str(tmp_path / "refcg.tar"), "--inputs",
           str(tmp_path / "x.npz"), "-o", str(tmp_path / "refcg.npz")]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tvmc.main(["run", str(tmp_path / "tvm.tar"), "--inputs", str(tmp_path / "x.npz"),
                      "-o", str(tmp_path / "tvm.npz")]) == 0
    refcg, tvm_only = np.load(tmp_path / "refcg.npz"), np.load(tmp_path / "tvm.npz")
    assert sorted(refcg.keys()) == sorted(tvm_only.keys())
    for key in tvm_only:
        np.testing.assert_array_equal(refcg[key], tvm_only[key])


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "refcodegen.tvmc", "compile", "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "--target" in done.stdout


@pytest.mark.slow  # its tvmc export compiles the core (a minute of g++ -O3); test_tvmc_compile_and_run covers tvmc in make test
def test_tvmc_onnx_qdq(tmp_path):
    """An ONNX QDQ model through tvmc: FakeQuantizationToInteger chosen by itself, refcg partitions built."""
    pytest.importorskip("onnx", reason="the onnx extra (make test installs it)")
    from examples import onnx_models

    path = onnx_models.quantize(onnx_models.MODELS["mlp"](), str(tmp_path / "mlp.onnx"))
    assert tvmc.is_qdq(load_model(path).mod)
    assert tvmc.main(["compile", "--target", "refcg, llvm", path, "-o", str(tmp_path / "m.tar")]) == 0
    with tarfile.open(tmp_path / "m.tar") as tar:
        tar.extract("mod.so", tmp_path)
    assert has_refcg_partitions(tmp_path / "mod.so")


def test_tvmc_option_errors():
    with pytest.raises(RefcgError, match="unknown refcg option"):
        tvmc.partition(None, None, bogus="1")
