"""Render a kernel plan to one C source through the Jinja2 templates in ``templates/``.

Python decides (what to call, with which constants); templates hold the C. A partition's
source declares the core (``runtime/include/refcg.h``); the core's definitions are one more C file,
``core_source()``, that every partition module imports (``codegen.core_module``), so a
library compiles the core once however many partitions it holds.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import jinja2
import numpy as np

from .errors import RefcgError
from .resources import core_header, core_include_dir, core_sources, templates_dir

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DL_CODE = {"int": "kDLInt", "uint": "kDLUInt", "float": "kDLFloat"}


def c_identifier(name: str, what: str) -> str:
    """Names from the model end up in C only after this check: nothing is pasted unescaped."""
    if not _IDENT.fullmatch(name) or len(name) > 200:  # fullmatch: "$" would accept a trailing newline
        raise RefcgError(what, "name", f"{name!r} is not a valid C identifier")
    return name


def c_comment(text) -> str:
    """Text for inside a /* */ comment (the target string is user input): printable ASCII, no terminator."""
    return re.sub(r"[^ -~]", "?", str(text)).replace("*/", "* /")


def c_bytes(array: np.ndarray, per_line: int = 32) -> str:
    """Constant data as adjacent string literals: compiles far faster than brace lists.

    Built with numpy (one ``\\xNN`` escape per byte, ``per_line`` bytes per literal): a
    ResNet-50-sized weight set is ~100 MB of text, too much for a per-byte Python loop.
    """
    raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    if raw.size == 0:
        return '""'
    rows = -(-raw.size // per_line)
    text = np.full((rows, per_line * 4 + 3), ord(" "), np.uint8)  # '"' + escapes + '"' + '\n'
    escapes = text[:, 1 : 1 + per_line * 4].reshape(rows, per_line, 4)
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    padded = np.zeros(rows * per_line, np.uint8)
    padded[: raw.size] = raw
    padded = padded.reshape(rows, per_line)
    escapes[..., 0], escapes[..., 1] = ord("\\"), ord("x")
    escapes[..., 2], escapes[..., 3] = digits[padded >> 4], digits[padded & 15]
    text[:, 0], text[:, -1] = ord('"'), ord("\n")
    text[:, -2] = ord('"')
    lines = text.tobytes().decode("ascii")
    tail = raw.size - (rows - 1) * per_line  # the last literal holds only the remaining bytes
    cut = len(lines) - (per_line * 4 + 3) + 1 + tail * 4
    return lines[:cut] + '"'


def c_int(value) -> str:
    value = int(value)
    return "(-2147483647 - 1)" if value == -(2**31) else str(value)


def c_ints(values) -> str:
    return ", ".join(c_int(v) for v in values)


def c_floats(values) -> str:
    return ", ".join(f"{float(np.float32(v))!r}f" if np.isfinite(v) else "0.0f" for v in values)


def c_doubles(values) -> str:
    return ", ".join(repr(float(v)) for v in values)


def c_ref(name: str, prefix: str, present) -> str:
    """The C name ``<prefix>_<name>`` of optional data the template declared, or NULL when ``present`` is None."""
    return "NULL" if present is None else f"{prefix}_{name}"


def dl_code(dtype: str) -> str:
    return _DL_CODE[re.match(r"[a-z]+", dtype).group(0)]


def dl_bits(dtype: str) -> int:
    return int(re.search(r"\d+", dtype).group(0))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        c_bytes=c_bytes, c_comment=c_comment, c_int=c_int, c_ref=c_ref, c_ints=c_ints, c_floats=c_floats,
        c_doubles=c_doubles,
        dl_code=dl_code, dl_bits=dl_bits,
    )
    return env


_LOCAL_INCLUDE = re.compile(r'(?m)^#include "([^"]+)"[^\n]*\n')


def _inline(path: Path, seen: set) -> str:
    """``path`` with each ``#include "..."`` replaced by the runtime header's text, expanded once
    per bundle (as its include guard would): the files compile alone and bundle alike."""

    def expand(match) -> str:
        name = match.group(1)
        header = next((d / name for d in (path.parent, core_include_dir()) if (d / name).is_file()), None)
        if header is None:
            raise RefcgError("core", "include", f'{path.name}: #include "{name}" is not a runtime header')
        if header in seen:
            return ""
        seen.add(header)
        return f"/* {name} */\n" + _inline(header, seen)

    return _LOCAL_INCLUDE.sub(expand, path.read_text())


@lru_cache(maxsize=1)
def bundled_core() -> str:
    """The whole core as one text (core module, cffi build, probes): every runtime .c file,
    its runtime headers inlined at their first include."""
    seen: set = set()
    return "\n".join(f"/* {path.name} */\n" + _inline(path, seen) for path in core_sources())


@lru_cache(maxsize=1)
def core_declarations() -> str:
    """The core's API (runtime/include/refcg.h), which every partition's C starts with."""
    return _inline(core_header(), set())


@lru_cache(maxsize=1)
def core_source() -> str:
    """The core module's C: the whole core with hidden-visibility entry points."""
    return environment().get_template("core.c.j2").render(core=bundled_core())


def render(plan) -> str:
    c_identifier(plan.symbol, "partition")
    return environment().get_template("module.c.j2").render(plan=plan, core_declarations=core_declarations())
