"""256-entry lookup tables for unary ops on 8-bit tensors, computed by TVM itself.

``qnn.sigmoid``/``tanh``/``hardswish``/``leaky_relu`` and ``dequantize -> float op -> quantize``
chains are functions of one int8/uint8 value, but TVM-only computes them with float math whose
exact results depend on its lowering (libm exp, the fast tanh polynomial, the requantize mode of
leaky_relu, the target's instruction set). Instead of re-deriving each, refcg builds the composite's
own body on all 256 input values with ``relay.build`` under the build target, the active
PassContext and the active ``requantize_config``, and runs it: the table holds exactly what
TVM-only computes for each value. That needs a target this host can run, except for the ops TVM
itself turns into a table computed on the build host (``HOST_TABLE_OPS``). An op TVM-only computes in a
stagewise conv's kernel (stagewise.py) gets its table from such a kernel, an identity conv in front.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm.target import codegen

from .errors import RefcgError
from .ops.quantize import scale_loaded


# LLVM features naming instruction-set extensions that generated code may use (x86, aarch64): the
# only ones a host must have to run the table's code. The rest tune code generation (fast-*, slow-*)
# or name system instructions no kernel emits (ermsb, invpcid, fsgsbase, rdrnd, xsave, sgx...).
_ISA_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "xop", "amx-", "bmi", "lzcnt", "popcnt", "movbe", "adx", "aes",
                 "vaes", "pclmul", "vpclmulqdq", "gfni", "sha", "cmov", "cx8", "cx16", "sahf", "mmx", "x87", "crc32",
                 "evex512", "neon", "fp-armv8", "dotprod", "fullfp16", "fp16fml", "sve", "sme", "i8mm", "bf16",
                 "f32mm", "f64mm", "lse", "rcpc", "crc", "sm4", "crypto")


@lru_cache(maxsize=None)
def _host_features() -> frozenset:
    """Features of this host's CPU model, plus the baseline every llvm target of this triple has."""
    host = tvm.target.Target(f"llvm -mcpu={codegen.llvm_get_system_cpu()}")
    baseline = tvm.target.Target("llvm")
    return frozenset(codegen.llvm_get_cpu_features(host)) | frozenset(codegen.llvm_get_cpu_features(baseline))


@lru_cache(maxsize=None)
def _cannot_run(target_str: str) -> str | None:
    target = tvm.target.Target(target_str)
    if str(target.kind) != "llvm":
        return f"target kind {target.kind} is not llvm"
    triple = str(target.attrs.get("mtriple", "") or "")
    host_arch = codegen.llvm_get_system_triple().split("-")[0]
    if triple and triple.split("-")[0] != host_arch:
        return f"target triple {triple} does not run on this {host_arch} host"
    missing = {f for f in codegen.llvm_get_cpu_features(target) if f.startswith(_ISA_PREFIXES)}
    missing -= _host_features()
    if missing:
        return f"target needs CPU features this host lacks ({', '.join(sorted(missing)[:4])})"
    return None


def cannot_run(target) -> str | None:
    """Why the lookup table of an op built for ``target`` cannot be computed here (None: it can)."""
    if target is None:
        return None
    reason = _cannot_run(str(tvm.target.Target(target)))
    return f"lookup table must be computed by running TVM's build for the target: {reason}" if reason else None


def _config_key() -> tuple:
    from tvm.relay.qnn.op.qnn import current_requantize_config

    config = current_requantize_config()
    ctx = tvm.transform.PassContext.current()
    return (str(config.rounding), str(config.compute_dtype), int(ctx.opt_level),
            tuple(sorted(str(p) for p in ctx.required_pass)), tuple(sorted(str(p) for p in ctx.disabled_pass)),
            str(ctx.config))


# TVM legalizes these to a table it computes on the build host (numpy and the VM with target llvm,
# relay/qnn/op/legalizations.py), whatever the build target: so does refcg.
HOST_TABLE_OPS = ("qnn.sigmoid", "qnn.tanh", "qnn.hardswish", "qnn.exp", "qnn.log", "qnn.abs")


def table_target(op_name: str | None, target):
    """The target whose build computes the table of an op whose anchor is ``op_name``."""
    return tvm.target.Target("llvm") if op_name in HOST_TABLE_OPS else target


def cannot_compute(op_name: str | None, target) -> str | None:
    """Why the table of an op anchored at ``op_name`` cannot be computed for ``target`` (None: it can)."""
    return cannot_run(table_target(op_name, target))


def _op_name(func: relay.Function) -> str | None:
    body = func.body
    return body.op.name if isinstance(body, relay.Call) and isinstance(body.op, tvm.ir.Op) else None


# Tables computed so far, least recently used first: a model's ops are built once per process, not
# once per partition; bounded so that a long-running compiler does not grow without end.
_TABLES: OrderedDict = OrderedDict()
MAX_TABLES = 4096  # 256 entries each: at most ~1 MB
_TABLES_LOCK = threading.Lock()


def _remember(key, table: np.ndarray) -> None:
    with _TABLES_LOCK:
        _TABLES[key] = table
        _TABLES.move_to_end(key)
        while len(_TABLES) > MAX_TABLES:
            _TABLES.popitem(last=False)


def _recall(key) -> np.ndarray | None:
    with _TABLES_LOCK:
        if key in _TABLES:
            _TABLES.move_to_end(key)
        return _TABLES.get(key)


def _standalone(func: relay.Function) -> relay.Function:
    """``func``'s body on a 256-element input (every bit pattern of its 8-bit parameter). A quantize
    that divides by its loaded scale in TVM-only (``scale_loaded``) gets it as a second parameter,
    which TVM loads too; ``_scale_input`` gives its value."""
    (param,) = func.params
    values = relay.var("x", shape=(256,), dtype=str(param.checked_type.dtype))
    body = relay.bind(func.body, {param: values})
    if not scale_loaded(func):
        return relay.Function([values], body)
    data, scale, zero_point = body.args
    loaded = relay.var("scale", shape=(), dtype="float32")
    return relay.Function([values, loaded], relay.Call(body.op, [data, loaded, zero_point], body.attrs))


def _scale_input(standalone: relay.Function, func: relay.Function) -> np.ndarray | None:
    return func.body.args[1].data.numpy() if len(standalone.params) > 1 else None


def _key(standalone: relay.Function, target, stagewise: bool) -> tuple:
    text = str(relay.transform.InferType()(tvm.IRModule.from_expr(standalone)))
    return text, str(target), _config_key(), stagewise


def in_stagewise_kernel(func: relay.Function) -> bool:
    """Whether TVM-only computes the table op ``func`` in a stagewise conv's kernel (stagewise.py)."""
    from .stagewise import STAGEWISE_TABLE_ATTR  # stagewise imports the ops package, which imports this module

    return bool(func.attrs and func.attrs.get(STAGEWISE_TABLE_ATTR))


# the 256 values as a (1, 1, 16, 16) NHWC tensor: what a depthwise conv reads
_KERNEL_SHAPE = (1, 1, 16, 16)


def _through_stagewise_kernel(values: relay.Var) -> relay.Expr:
    """``values`` through an identity depthwise 1x1 NHWC conv and requantize: TVM's x86 strategy builds the
    table op reading it into that conv's kernel, whose generic schedule rounds every stage apart
    (stagewise.py) and computes the op's float stages as the kernel of any such conv does (constant
    divisors become reciprocal multiplies there, not in a kernel of the op alone)."""
    dtype = str(values.type_annotation.dtype)
    one, zero = relay.const(1.0), relay.const(0, "int32")
    channels = _KERNEL_SHAPE[-1]
    conv = relay.qnn.op.conv2d(values, relay.const(np.ones((1, 1, channels, 1), "int8")), zero, zero, one, one,
                               kernel_size=(1, 1), channels=channels, groups=channels, data_layout="NHWC",
                               kernel_layout="HWOI")
    return relay.qnn.op.requantize(conv, one, zero, one, zero, axis=3, out_dtype=dtype, rounding="UPWARD")


def compute_tables(funcs: list, target) -> None:
    """Build and run the tables of ``funcs`` not computed yet, one ``relay.build`` per table target."""
    pending: dict = {}
    for func in funcs:
        where = table_target(_op_name(func), target)
        reason = cannot_run(where)
        if reason:
            raise RefcgError(_op_name(func) or "unary op", "target",
                             reason + "; pass target= to partition_for_refcg to keep the op in TVM")
        standalone = _standalone(func)
        key = _key(standalone, where, in_stagewise_kernel(func))
        if key not in _TABLES:
            pending.setdefault(str(where), {})[key] = (standalone, _scale_input(standalone, func))
    for where, todo in pending.items():
        inputs, bodies = {}, []
        for i, (key, (part, scale)) in enumerate(todo.items()):
            stagewise = key[-1]
            shape = _KERNEL_SHAPE if stagewise else (256,)
            x = relay.var(f"x{i}", shape=shape, dtype=part.params[0].type_annotation.dtype)
            inputs[x] = np.arange(256, dtype="uint8").view(x.type_annotation.dtype).reshape(shape)
            binds = {part.params[0]: _through_stagewise_kernel(x) if stagewise else x}
            if scale is not None:
                binds[part.params[1]] = relay.var(f"scale{i}", shape=(), dtype="float32")
                inputs[binds[part.params[1]]] = scale
            bodies.append(relay.bind(part.body, binds))
        params = list(inputs)
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, relay.Tuple(bodies))))
        # the build in progress's PassContext and requantize_config stay active here
        lib = relay.build(mod, target=where)
        runner = graph_executor.GraphModule(lib["default"](tvm.cpu(0)))
        for v, value in inputs.items():
            runner.set_input(v.name_hint, tvm.nd.array(value))
        runner.run()
        for i, key in enumerate(todo):
            _remember(key, runner.get_output(i).numpy().reshape(256))


def prepare(func: relay.Function, target) -> None:
    """Compute the tables of every refcg.lut composite of a partition in one go."""
    funcs = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, relay.Function) and node.op.attrs \
                and str(node.op.attrs.get("Composite", "")) == "refcg.lut":
            funcs.append(node.op)

    relay.analysis.post_order_visit(func.body, visit)
    compute_tables(funcs, target)


def lookup_table(func: relay.Function, target) -> np.ndarray:
    """What TVM-only computes for ``func`` (one 8-bit parameter, elementwise) on each bit pattern 0..255."""
    key = _key(_standalone(func), table_target(_op_name(func), target), in_stagewise_kernel(func))
    table = _recall(key)
    if table is None:
        compute_tables([func], target)
        table = _recall(key)
    return table
