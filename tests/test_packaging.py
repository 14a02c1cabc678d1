"""The wheel ships the compiler only (refcodegen/ with its templates and C core), and the compiler
needs neither cffi nor the example models."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from refcodegen.resources import core_files, core_header, core_sources, runtime_dir, templates_dir

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_compiler_only(tmp_path):
    # built from a copy: setuptools builds in the source tree, and a build/ left from an older tree
    # (modules since moved or removed) would ship its stale files
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("refcodegen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (REPO / "templates").glob("*.j2"):
        assert f"refcodegen/templates/{template.name}" in names
    assert len(core_sources()) >= 10 and core_header() in core_files()
    for path in core_files():
        assert f"refcodegen/runtime/{path.relative_to(runtime_dir()).as_posix()}" in names
    # the package's modules, all of them (a subpackage missing from pyproject's list would be left out) ...
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "refcodegen").rglob("*.py")}
    assert {name for name in names if name.endswith(".py")} == modules
    # ... and nothing else: no examples/, tests/ or tools/
    metadata = wheel.name.split("-py")[0] + ".dist-info/"
    assert not [name for name in names if not name.startswith(("refcodegen/", metadata))], sorted(names)


def test_resources_resolve_where_the_package_is():
    assert (templates_dir() / "module.c.j2").is_file()
    assert all(path.is_file() for path in core_files())


# Every module of the package imports, and a qnn.dense + requantize offloads, compiles, exports and runs, in a
# process where cffi and the example models cannot be imported (None in sys.modules: import raises).
WITHOUT_CFFI = """
import sys
sys.modules["cffi"] = sys.modules["examples"] = None
import numpy as np
import tvm
from tvm import relay
import importlib, pkgutil
import refcodegen
for module in pkgutil.walk_packages(refcodegen.__path__, "refcodegen."):
    importlib.import_module(module.name)
from refcodegen import objcache, partition_for_refcg
from refcodegen.partition import refcg_functions
from refcodegen.runner import load, run

x = relay.var("x", shape=(2, 8), dtype="int8")
w = relay.const(np.arange(-32, 32, dtype="int8").reshape(8, 8))
y = relay.qnn.op.dense(x, w, relay.const(0), relay.const(0), relay.const(0.05), relay.const(0.01), units=8)
y = relay.qnn.op.requantize(y, relay.const(0.0005), relay.const(0), relay.const(0.1), relay.const(0), out_dtype="int8")
mod = partition_for_refcg(tvm.IRModule.from_expr(relay.Function([x], y)))
assert len(refcg_functions(mod)) == 1, mod
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="llvm")
lib.export_library(sys.argv[1], fcompile=objcache.create_shared)
data = np.arange(-8, 8, dtype="int8").reshape(2, 8)
(out,) = run(load(sys.argv[1]), {"x": data})
want = np.clip(np.round(  # no product is a tie (200k + 100): rounding modes agree
    (data.astype(np.int64) @ np.arange(-32, 32).reshape(8, 8).T) * 0.005), -128, 127)
assert np.array_equal(out, want), (out, want)
"""


def test_compiler_runs_without_cffi_and_examples(tmp_path):
    child = subprocess.run([sys.executable, "-c", WITHOUT_CFFI, str(tmp_path / "dense.so")], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
