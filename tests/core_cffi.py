"""Test harness: the C core built on its own through cffi (no TVM runtime: serial threads, malloc
workspace), and numpy-backed helpers that fill its structs.

Used by the core tests (``tests/test_core_*.py``) and ``tools/bench.py`` to call every kernel
variant directly; ``Core.use(isa)`` switches the variant (refcg_set_isa). The library is the same
bundled source the generated modules embed, compiled once per source hash into a cache directory.
The cffi declarations are runtime/include/refcg.h itself, preprocessed: no struct is restated here.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import cffi
import numpy as np

from refcodegen.emit import bundled_core
from refcodegen.numerics import Requantize
from refcodegen.resources import core_header


@lru_cache(maxsize=1)
def header_cdef() -> str:
    """refcg.h through the C preprocessor (REFCG_API empty, the system headers empty stubs:
    cffi knows the <stdint.h> types), comments and macros resolved: what cffi's cdef reads."""
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    with tempfile.TemporaryDirectory() as stubs:
        for name in ("stdint.h", "stddef.h"):
            Path(stubs, name).write_text("")
        done = subprocess.run([cc, "-E", "-P", "-nostdinc", "-isystem", stubs, "-DREFCG_API=", str(core_header())],
                              capture_output=True, text=True, check=True)
    return done.stdout


def _enums():
    """The header's enum constants, without building the library (ABI mode reads them from the cdef)."""
    ffi = cffi.FFI()
    ffi.cdef(header_cdef())
    return ffi.dlopen(None)


ENUMS = _enums()
DTYPE_CODE = {name: getattr(ENUMS, const) for name, const in
              (("int8", "REFCG_S8"), ("uint8", "REFCG_U8"), ("int32", "REFCG_S32"), ("int16", "REFCG_S16"))}


HARNESS = Path(__file__).with_name("epilogue_harness.c")
HARNESS_CDEF = """int refcg_harness_epilogue(const char* isa, int32_t planar, const refcg_requant* rq, const int32_t* acc,
                           const int32_t* corr, int32_t pixels, int32_t channels, void* out, int32_t out_dtype);
void refcg_harness_tasks(int32_t n);
int32_t refcg_harness_ws_fail(uint32_t mask);"""


def _build(cache: Path, source: str | None = None, harness: bool = False, defines: tuple[str, ...] = ()):
    """``source``: another bundled core (tools/bench_epilogue.py builds an older one beside this one);
    ``harness``: with tests/epilogue_harness.c appended (refcg_harness_epilogue); ``defines``: macros."""
    cdef = header_cdef() + (HARNESS_CDEF if harness else "")
    source = "".join(f"#define {d}\n" for d in defines) + (source or bundled_core())
    source += ("\n" + HARNESS.read_text()) if harness else ""
    digest = hashlib.sha256((cdef + source).encode()).hexdigest()[:16]
    name = f"_refcg_core_{digest}"
    target = cache / name
    if not any(target.glob(f"{name}*.so")):
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        ffi.set_source(name, source, extra_compile_args=["-O3", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror"])
        target.mkdir(parents=True, exist_ok=True)
        # compile in a private directory, then rename: parallel test workers may build it at once
        with tempfile.TemporaryDirectory(dir=target) as work:
            built = Path(ffi.compile(tmpdir=work, verbose=False))
            os.replace(built, target / built.name)
    so = next(target.glob(f"{name}*.so"))
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@lru_cache(maxsize=1)
def _cpu_flags() -> set[str]:
    """CPU feature flags of /proc/cpuinfo (x86 "flags", aarch64 "Features"), spelled as refcg's
    variant configs spell them (avx512_vnni -> avx512vnni); empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("flags", "Features")), ":")
    return {flag.replace("_", "") for flag in line.split(":", 1)[1].split()}


def avxvnni_as_evex() -> bool:
    """Whether this host runs the AVX-VNNI variant only as its EVEX stand-in (REFCG_AVXVNNI_AS_EVEX in
    refcg_fast_x86.c): AVX-512 VNNI and VL, no AVX-VNNI (Zen 4, Ice Lake and later Xeons)."""
    flags = _cpu_flags()
    return "avxvnni" not in flags and {"avx2", "fma", "avx512vnni", "avx512vl"} <= flags


class Core:
    """The compiled core plus helpers that keep the numpy arrays behind each C struct alive.

    ``avxvnni_evex``: the AVX-VNNI variant's vpdpbusd EVEX-encoded (pass avxvnni_as_evex()), so that its
    code runs on AVX-512 VNNI hosts; for the core's own tests and kernel timings: generated libraries
    (and REFCG_ISA in them) have the VEX form."""

    def __init__(self, cache: str | None = None, *, source: str | None = None, harness: bool = False,
                 avxvnni_evex: bool = False):
        cache_dir = Path(cache or os.environ.get("REFCG_CORE_CACHE", Path(tempfile.gettempdir()) / "refcg-core"))
        self.avxvnni_evex = avxvnni_evex
        module = _build(cache_dir, source, harness, ("REFCG_AVXVNNI_AS_EVEX",) if avxvnni_evex else ())
        self.ffi, self.lib, self.path = module.ffi, module.lib, module.__file__
        self._keep: list = []

    def ptr(self, array: np.ndarray, ctype: str):
        array = np.ascontiguousarray(array)
        self._keep.append(array)
        return self.ffi.cast(ctype, self.ffi.from_buffer(array))

    def requant(self, rq: Requantize):
        s = self.ffi.new("refcg_requant*")
        s.mode, s.per_channel, s.identity = rq.mode, int(rq.per_channel), int(rq.identity)
        s.input_zp, s.output_zp, s.out_min, s.out_max = rq.input_zp, rq.output_zp, rq.out_min, rq.out_max
        s.multiplier = self.ptr(np.array(rq.multipliers, np.int32), "int32_t*")
        s.shift = self.ptr(np.array(rq.shifts, np.int32), "int32_t*")
        s.scale_f32 = self.ptr(np.array(rq.scales_f32, np.float32), "float*")
        s.scale_f64 = self.ptr(np.array(rq.scales_f64, np.float64), "double*")
        s.fused, s.round_emulated = int(rq.fused), int(rq.round_emulated)
        s.addend_f32, s.post_f32 = s.addend_f64, s.post_f64 = rq.addend, rq.post
        self._keep.append(s)
        return s

    def gemm_weights(self, g) -> object:
        s = self.ffi.new("refcg_gemm_weights*")
        s.kp, s.np = g.kp, g.np
        s.w = self.ptr(g.w, "int8_t*")
        s.corr_u8 = self.ptr(g.corr_u8, "int32_t*")
        s.corr_s8 = self.ptr(g.corr_s8, "int32_t*")
        s.pair_safe = self.ptr(g.pair_safe, "uint8_t*")
        self._keep.append(s)
        return s

    def conv_fast(self, f, layouts: bool = True):
        """``layouts=False`` withholds the depthwise layouts packed ahead of time (refcg_conv2d builds them)."""
        s = self.ffi.new("refcg_conv2d_fast*")
        if f is None:
            return s  # kind 0: reference only
        s.kind, s.cp = getattr(self.lib, f.kind), f.cp
        if f.gemm is not None:
            s.gemm = self.gemm_weights(f.gemm)[0]
        if f.winograd:
            # its weights: malloc'd at the first Winograd call and kept (a library frees them at unload)
            cache = self.ffi.new("refcg_wino_cache*")
            s.wino = cache
            self._keep.append(cache)
        if f.dw_w is not None:
            s.dw_w = self.ptr(f.dw_w, "int16_t*")
            s.dw_corr_u8 = self.ptr(f.dw_corr_u8, "int32_t*")
            s.dw_corr_s8 = self.ptr(f.dw_corr_s8, "int32_t*")
            if layouts and f.dw_pairs is not None:
                s.dw_pairs = self.ptr(f.dw_pairs, "int16_t*")
            if layouts and f.dw_quads is not None:
                s.dw_quads = self.ptr(f.dw_quads, "int8_t*")
        self._keep.append(s)
        return s

    def isa_name(self) -> str:
        return self.ffi.string(self.lib.refcg_isa_name()).decode()

    def compiled_variants(self) -> dict[str, str]:
        """Every variant compiled for this architecture, best first ("scalar" last): the CPU features each needs."""
        found, features = {}, self.ffi.new("const char**")
        while (name := self.lib.refcg_isa_variant(len(found), features)) != self.ffi.NULL:
            found[self.ffi.string(name).decode()] = self.ffi.string(features[0]).decode()
        return found

    def variants(self) -> list[str]:
        """Variants this host runs, best first, ending with the scalar reference."""
        return [name for name in self.compiled_variants() if self.lib.refcg_isa_supported(name.encode())]

    def use(self, isa: str | None) -> None:
        """Run every later call on ``isa`` (None: the best the CPU supports); it must be supported."""
        status = self.lib.refcg_set_isa(isa.encode() if isa else self.ffi.NULL)
        if status != 0 or (isa and self.isa_name() != isa):
            raise ValueError(f"variant {isa!r} is not supported here ({self.variants()})")

    def require(self, isa: str) -> None:
        """Skip the calling test, naming the CPU features this host lacks, unless it runs ``isa``."""
        import pytest

        if not self.lib.refcg_isa_supported(isa.encode()):
            needs = self.compiled_variants()[isa].split()
            missing = [f for f in needs if f not in _cpu_flags()] or needs
            pytest.skip(f"host lacks {' '.join(missing)} (the {isa} variant needs {' '.join(needs)})")

    def use_or_skip(self, isa: str) -> None:
        self.require(isa)
        self.use(isa)

    def tasks(self, n: int) -> None:
        """Split every later kernel call into ``n`` ranges run in turn, as ``n`` threads would (harness cores)."""
        self.lib.refcg_harness_tasks(n)

    def fail_alloc(self, mask: int) -> int:
        """Make the workspace allocations from now fail where their bit of ``mask`` is set (bit i: the
        i-th; 0: none; harness cores); returns how many were made since the previous call."""
        return self.lib.refcg_harness_ws_fail(mask)

    def release(self) -> None:
        self._keep.clear()


def _strides(shape, layout: str) -> list[int]:
    compact = np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1]
    return [int(compact[layout.index(axis)]) for axis in "NHWC"]


class Conv2D:
    """One conv bound to the core: ``run(x, fast)`` through refcg_conv2d or refcg_conv2d_ref."""

    def __init__(self, core: Core, *, in_shape, layout: str, weight_ohwi: np.ndarray, strides=(1, 1),
                 padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, in_dtype="int8", out_dtype="int8",
                 input_zp=0, kernel_zp=0, bias=None, requant: Requantize, reference_weights: bool = True):
        """``reference_weights=False`` passes NULL weights, as generated libraries do for convs with
        packed GEMM data (then every variant, the scalar one included, runs the packed GEMM)."""
        from refcodegen.packing import pack_conv2d_fast

        self.core, self.layout, self.out_dtype = core, layout, out_dtype
        n, c, h, w = ((in_shape[0], in_shape[1], in_shape[2], in_shape[3]) if layout == "NCHW"
                      else (in_shape[0], in_shape[3], in_shape[1], in_shape[2]))
        out_c, kh, kw, _ = weight_ohwi.shape
        pt, pl, pb, pr = padding
        oh = (h + pt + pb - (kh - 1) * dilation[0] - 1) // strides[0] + 1
        ow = (w + pl + pr - (kw - 1) * dilation[1] - 1) // strides[1] + 1
        self.out_shape = (n, out_c, oh, ow) if layout == "NCHW" else (n, oh, ow, out_c)
        params = dict(batch=n, in_h=h, in_w=w, in_c=c, out_h=oh, out_w=ow, out_c=out_c, kernel_h=kh, kernel_w=kw,
                      stride_h=strides[0], stride_w=strides[1], dilation_h=dilation[0], dilation_w=dilation[1],
                      pad_top=pt, pad_left=pl, groups=groups, in_dtype=DTYPE_CODE[in_dtype],
                      w_dtype=DTYPE_CODE[str(weight_ohwi.dtype)], out_dtype=DTYPE_CODE[out_dtype],
                      input_zp=input_zp, kernel_zp=kernel_zp)
        p = core.ffi.new("refcg_conv2d_params*")
        for key, value in params.items():
            setattr(p, key, int(value))
        p.in_stride = _strides(in_shape, layout)
        p.out_stride = _strides(self.out_shape, layout)
        k = core.ffi.new("refcg_conv2d_consts*")
        k.weight = core.ptr(weight_ohwi, "void*") if reference_weights else core.ffi.NULL
        k.bias = core.ptr(np.asarray(bias, np.int32), "int32_t*") if bias is not None else core.ffi.NULL
        k.requant = core.requant(requant)[0]
        self.weight = weight_ohwi
        self.fast_data = pack_conv2d_fast(weight_ohwi, params, in_dtype, bias)
        self.p, self.k, self.f = p, k, core.conv_fast(self.fast_data)
        self.macs = n * oh * ow * out_c * kh * kw * (c // groups)

    def run(self, x: np.ndarray, fast: bool = True, out: np.ndarray | None = None) -> np.ndarray:
        out = np.empty(self.out_shape, self.out_dtype) if out is None else out
        ffi, lib = self.core.ffi, self.core.lib
        src, dst = ffi.from_buffer(x), ffi.from_buffer(out)
        status = lib.refcg_conv2d(self.p, self.k, self.f, src, dst) if fast else lib.refcg_conv2d_ref(self.p, self.k, src, dst)
        if status != 0:
            raise RuntimeError(f"refcg conv2d returned {status}")
        return out


class Dense:
    """out = requant((x - input_zp) @ (w - kernel_zp).T + bias) through refcg_dense."""

    def __init__(self, core: Core, *, weight_nk: np.ndarray, batch: int, in_dtype="int8", out_dtype="int8",
                 input_zp=0, kernel_zp=0, bias=None, requant: Requantize):
        from refcodegen.packing import pack_gemm_weights

        units, features = weight_nk.shape
        self.core, self.out_shape, self.out_dtype = core, (batch, units), out_dtype
        packed = pack_gemm_weights(weight_nk, kernel_zp, input_zp, in_dtype, bias)
        if packed is None:
            raise ValueError("weights do not fit the accelerated dense layout")
        self.packed = packed
        p = core.ffi.new("refcg_dense_params*")
        p.batch, p.in_features, p.units = batch, features, units
        p.in_dtype, p.w_dtype, p.out_dtype = DTYPE_CODE[in_dtype], 0, DTYPE_CODE[out_dtype]
        p.input_zp, p.kernel_zp = input_zp, 0
        self.p, self.g, self.rq = p, core.gemm_weights(packed), core.requant(requant)
        self.macs = batch * units * features

    def run(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        out = np.empty(self.out_shape, self.out_dtype) if out is None else out
        ffi = self.core.ffi
        status = self.core.lib.refcg_dense(self.p, self.g, self.rq, ffi.from_buffer(x), ffi.from_buffer(out))
        if status != 0:
            raise RuntimeError(f"refcg_dense returned {status}")
        return out


class Binary:
    """qnn.add/subtract/mul of x and y (numpy broadcasting) bound to the core: ``run(x, y, reference)``
    through refcg_binary or refcg_binary_ref."""

    def __init__(self, core: Core, op: str, x_shape, y_shape, x_dtype, y_dtype, out_dtype, rq_a: Requantize,
                 rq_b: Requantize, zps, out_range):
        self.core, self.out_dtype = core, out_dtype
        self.out_shape = np.broadcast_shapes(tuple(x_shape), tuple(y_shape))
        ndim = len(self.out_shape)
        p = core.ffi.new("refcg_binary_params*")
        p.op = {"add": core.lib.REFCG_BIN_ADD, "sub": core.lib.REFCG_BIN_SUB, "mul": core.lib.REFCG_BIN_MUL}[op]
        p.ndim = ndim
        p.shape = list(self.out_shape) + [0] * (len(p.shape) - ndim)
        for name, shape in (("a_stride", tuple(x_shape)), ("b_stride", tuple(y_shape))):
            shape = (1,) * (ndim - len(shape)) + shape
            compact = np.cumprod((shape[1:] + (1,))[::-1])[::-1]
            setattr(p, name, [int(st) if dim != 1 else 0 for dim, st in zip(shape, compact)] + [0] * (len(p.shape) - ndim))
        p.a_dtype, p.b_dtype, p.out_dtype = DTYPE_CODE[str(x_dtype)], DTYPE_CODE[str(y_dtype)], DTYPE_CODE[out_dtype]
        p.a_zp, p.b_zp, p.out_zp = zps
        p.out_min, p.out_max = out_range
        p.rq_a, p.rq_b = core.requant(rq_a)[0], core.requant(rq_b)[0]
        self.p = p

    def run(self, x: np.ndarray, y: np.ndarray, reference: bool = False) -> np.ndarray:
        out = np.empty(self.out_shape, self.out_dtype)
        ffi, lib = self.core.ffi, self.core.lib
        fn = lib.refcg_binary_ref if reference else lib.refcg_binary
        if fn(self.p, ffi.from_buffer(x), ffi.from_buffer(y), ffi.from_buffer(out)) != 0:
            raise RuntimeError("refcg_binary returned an error")
        return out
