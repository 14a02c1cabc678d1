"""A non-editable install must ship templates/ and runtime/ inside the package."""
import subprocess
import sys
import zipfile
from pathlib import Path

from refcodegen.resources import core_files, core_sources, templates_dir

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_and_runtime(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("refcodegen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (REPO / "templates").glob("*.j2"):
        assert f"refcodegen/templates/{template.name}" in names
    runtime = REPO / "runtime"
    assert len(core_sources()) >= 10 and (runtime / "include" / "refcg.h") in core_files()
    for path in core_files():
        assert f"refcodegen/runtime/{path.relative_to(runtime).as_posix()}" in names


def test_resources_resolve_where_the_package_is():
    assert (templates_dir() / "module.c.j2").is_file()
    assert all(path.is_file() for path in core_files())
