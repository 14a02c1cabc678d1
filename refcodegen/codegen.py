"""``relay.ext.refcg``: partition function in, CSourceModule out.

Stages, one module each: scoped_fold (legalize-and-fold on a module holding only this
partition) -> plan (typed kernel descriptions) -> emit (C from templates). The partition's
module imports the shared core module (the runtime/ C core, one copy per library).
``generate_c`` calls the stages through this module's names (``scoped_fold``, ``build_plan``,
``render``): a test or tool that needs to see a stage's input wraps that name (pytest monkeypatch).
"""
from __future__ import annotations

import threading

import tvm

from .build_target import resolve_build_target
from .emit import core_source, render
from .errors import RefcgError
from .ops import COMPILER
from .partition import TARGET_ATTR, mark_stagewise_tables
from .plan import build_plan
from .scoped_fold import scoped_fold
from .stagewise import partition_tables, refuse_tangles
from .armfuse import keep_boundaries, refuse_tvm_rounding_mates


def generate_c(func) -> tuple[str, str]:
    """(symbol, C source) for one partition function as TVM hands it to the codegen."""
    symbol = str(func.attrs["global_symbol"])
    target = resolve_build_target(func)
    folded = keep_boundaries(func, scoped_fold(func))
    if not (func.attrs and func.attrs.get(TARGET_ATTR)):  # partitioned without target=: the checks could not
        refuse_tvm_rounding_mates(folded, target, symbol)
        refuse_tangles(folded, target, symbol)
    folded = mark_stagewise_tables(folded, partition_tables(folded, target))
    return symbol, render(build_plan(folded, symbol, target))


_CORE: list = []
_CORE_LOCK = threading.Lock()


def core_module():
    """The core as one C module, imported by every partition module: export_library collects an
    imported module once (by identity), so a library holds one copy of the core. One instance per
    process, created under a lock: two instances in one library would define the core twice."""
    with _CORE_LOCK:
        if not _CORE:
            _CORE.append(tvm.get_global_func("runtime.CSourceModuleCreate")(core_source(), "c", [], []))
        return _CORE[0]


@tvm.register_func(f"relay.ext.{COMPILER}")
def refcg_codegen(func):
    symbol, code = generate_c(func)
    module = tvm.get_global_func("runtime.CSourceModuleCreate")(code, "c", [symbol], [])
    module.import_module(core_module())
    return module


@tvm.register_func(f"relay.ext.{COMPILER}.constant_updater")
def refcg_constant_updater(func, symbol):
    """Weights live in the generated C as static data; none go to the graph params."""
    return {}


__all__ = ["generate_c", "refcg_codegen", "RefcgError"]
