"""Where the package keeps its templates and C core.

Installed, they ship inside the package (pyproject maps templates/ and runtime/ to
refcodegen.templates / refcodegen.runtime); in a source checkout they sit beside it.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def _locate(name: str) -> Path:
    package = Path(str(resources.files("refcodegen")))
    installed = package / name
    return installed if installed.is_dir() else package.parent / name


def templates_dir() -> Path:
    return _locate("templates")


def runtime_dir() -> Path:
    return _locate("runtime")


def core_sources() -> list[Path]:
    """Core C files in the order they must be concatenated (listed in runtime/CORE_SOURCES)."""
    root = runtime_dir()
    return [root / name for name in (root / "CORE_SOURCES").read_text().split()]
