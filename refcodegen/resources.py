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


def core_include_dir() -> Path:
    return runtime_dir() / "include"


def core_header() -> Path:
    """The core's API: every struct, enum and entry point."""
    return core_include_dir() / "refcg.h"


def core_sources() -> list[Path]:
    """The core's C files: each compiles alone (runtime/Makefile); emit.bundled_core joins them."""
    return sorted(runtime_dir().glob("*.c"))


def core_files() -> list[Path]:
    """Everything the package ships of the core: sources, headers, the standalone Makefile."""
    root = runtime_dir()
    return core_sources() + sorted(root.glob("*.h")) + sorted(core_include_dir().glob("*.h")) + [root / "Makefile"]
