"""A tiny aarch64 library, loaded over RPC next to the models, to steer and observe the C core's
run-time dispatch in the server process: a refcg library reads REFCG_ISA at its first dispatching
call (Server.run loads a fresh copy per run), and the probe bundles the same core, so it reports the
variant refcg modules pick on that CPU."""
from __future__ import annotations

from pathlib import Path

import tvm

from refcodegen.emit import bundled_core

from .host import CROSS_CXX

ISAS = ("dotprod", "neon", "scalar")

_SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <tvm/runtime/c_backend_api.h>
#include <tvm/runtime/c_runtime_api.h>
#define REFCG_API static inline
%(core)s
static const char* const refcg_probe_isas[] = {%(isas)s};

/* refcg_probe_set_isa(name): REFCG_ISA=name for the libraries loaded next ("" unsets it), and the
 * probe's own core switched to it (that core chose its variant at its first call). */
extern "C" TVM_DLL int32_t refcg_probe_set_isa(TVMValue* args, int* codes, int n, TVMValue* ret, int* ret_code) {
  if (n != 1 || codes[0] != kTVMStr) return -1;
  if (*args[0].v_str) setenv("REFCG_ISA", args[0].v_str, 1); else unsetenv("REFCG_ISA");
  refcg_set_isa(args[0].v_str);
  ret->v_int64 = 0;
  *ret_code = kDLInt;
  return 0;
}

/* refcg_probe_isa(): index in ISAS of the variant the dispatcher picks now, -1 if unknown. */
extern "C" TVM_DLL int32_t refcg_probe_isa(TVMValue* args, int* codes, int n, TVMValue* ret, int* ret_code) {
  (void)args; (void)codes; (void)n;
  ret->v_int64 = -1;
  for (int i = 0; i < (int)(sizeof(refcg_probe_isas) / sizeof(refcg_probe_isas[0])); ++i)
    if (!strcmp(refcg_isa_name(), refcg_probe_isas[i])) ret->v_int64 = i;
  *ret_code = kDLInt;
  return 0;
}
"""


def build_probe(path: Path) -> Path:
    code = _SOURCE % {"core": bundled_core(), "isas": ", ".join(f'"{name}"' for name in ISAS)}
    module = tvm.get_global_func("runtime.CSourceModuleCreate")(
        code, "cc", ["refcg_probe_set_isa", "refcg_probe_isa"], [])
    module.export_library(str(path), cc=CROSS_CXX, options=["-O1"])
    return path


class Probe:
    """The probe loaded in one RPC server."""

    def __init__(self, server, path: Path):
        server.session.upload(str(path), target="refcg_probe.so")
        lib = server.session.load_module("refcg_probe.so")
        self._set = lib.get_function("refcg_probe_set_isa")
        self._get = lib.get_function("refcg_probe_isa")

    def set_isa(self, name: str) -> None:
        self._set(name)

    def isa(self) -> str:
        index = self._get()
        return ISAS[index] if index >= 0 else "unknown"
