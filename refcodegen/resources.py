"""Where the installed package keeps its templates and C core."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def package_root() -> Path:
    return Path(str(resources.files("refcodegen")))


def templates_dir() -> Path:
    return package_root() / "templates"


def runtime_dir() -> Path:
    return package_root() / "runtime"


def core_sources() -> list[Path]:
    """Core C files in the order they must be concatenated (listed in runtime/CORE_SOURCES)."""
    root = runtime_dir()
    names = (root / "CORE_SOURCES").read_text().split()
    return [root / name for name in names]
