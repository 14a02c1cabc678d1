"""An ``fcompile`` for ``export_library`` that compiles each C file once per content.

Every refcg library holds the same core C file (``codegen.core_module``); the default
``tvm.contrib.cc.create_shared`` recompiles it for every export (~35 s of g++ on x86). Passing
``fcompile=refcodegen.objcache.create_shared`` compiles each C/C++ source to an object keyed by
(compiler, its version, options, source text), reuses it on the next export, and links as
``create_shared`` does. Same compiler, same flags, same objects: the library is the one the default
path builds. Tests, the benchmark and tools exporting many models use it.

    lib.export_library("model.so", fcompile=refcodegen.objcache.create_shared)
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from tvm.contrib import cc as tvm_cc

SOURCE_SUFFIXES = (".c", ".cc", ".cpp")
UNUSED_DAYS = 14  # objects not used for this long are deleted (once per process)


def cache_dir() -> Path:
    """``REFCG_OBJECT_CACHE`` or a per-user directory in the temp dir."""
    default = Path(tempfile.gettempdir()) / f"refcg-objects-{os.getuid()}"
    return Path(os.environ.get("REFCG_OBJECT_CACHE", default))


@lru_cache(maxsize=None)
def _prune(directory: Path) -> None:
    """Keep the cache bounded: every model's partitions add objects; hits refresh an object's mtime."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    for old in directory.glob("*.o"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:  # another process pruned or replaced it
            pass


@lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> str:
    """``--version`` output: an upgraded compiler at the same path must not reuse old objects."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout


def compile_object(source: Path, compiler: str, options: list[str]) -> Path:
    """The object for ``source``, from the cache or compiled into it (atomic rename: concurrent
    test workers may compile the same file)."""
    key = hashlib.sha256("\0".join([compiler, _compiler_identity(compiler), *options]).encode())
    key.update(source.read_bytes())
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _prune(directory)
    obj = directory / f"{key.hexdigest()[:32]}.o"
    try:
        os.utime(obj)  # a hit: mark it used
    except FileNotFoundError:
        fd, partial = tempfile.mkstemp(suffix=".o", dir=directory)
        os.close(fd)
        try:
            result = subprocess.run([compiler, "-c", "-fPIC", "-o", partial, str(source), *options],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"Compilation error:\n{result.stdout}{result.stderr}")
            os.replace(partial, obj)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return obj


def create_shared(output, objects, options=None, cc=None, cwd=None, ccache_env=None):
    """``tvm.contrib.cc.create_shared`` with each C/C++ source compiled through the object cache."""
    compiler = cc or tvm_cc.get_cc()
    options = list(options or [])
    files = [objects] if isinstance(objects, str) else list(objects)
    linked = [str(compile_object(Path(f), compiler, options)) if f.endswith(SOURCE_SUFFIXES) else f for f in files]
    tvm_cc.create_shared(output, linked, options=options, cc=compiler, cwd=cwd, ccache_env=ccache_env)


# export_library asks for the triple when a library has no LLVM module (as create_shared answers it)
create_shared.get_target_triple = tvm_cc.create_shared.get_target_triple
