"""The C core as a plain C library: every runtime file compiles alone (C and C++, x86 and aarch64,
-Wall -Wextra -Werror: `make -C runtime check`), librefcg_core.a links into a C program that runs,
and the one-text bundle the generated libraries embed holds every file once."""
import re
import shutil
import subprocess

import pytest

from refcodegen.emit import bundled_core, core_declarations
from refcodegen.resources import core_header, core_sources, runtime_dir

CROSS = {"aarch64": ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")}


def make(*args, **env):
    done = subprocess.run(["make", "-s", "-C", str(runtime_dir()), *args, *(f"{k}={v}" for k, v in env.items())],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# host: 100 s of g++ on 2 cores (x86 intrinsics, C and C++), so make test-slow (CI runs it); in make
# test, test_cli's emitted build compiles the bundled core (host, C) with -Wall -Wextra -Werror
@pytest.mark.parametrize("arch", [pytest.param("host", marks=pytest.mark.slow), "aarch64"])
def test_every_file_compiles_alone(arch):
    if arch == "host":
        make("-j2", "check")
        return
    cc, cxx = CROSS[arch]
    if not (shutil.which(cc) and shutil.which(cxx)):
        pytest.skip(f"no {cc} / {cxx} (tools/arm/setup.sh installs them)")
    make("-j2", "check", CC=cc, CXX=cxx)


PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "refcg.h"

int main(void) {
  /* 1x1 conv, 2 output channels over a 2x2 int8 image, int32 out: the dispatcher on every variant */
  static const int8_t x[4] = {1, -2, 3, 127}, w[2] = {3, -128};
  static const int32_t zero[1] = {0};
  static const float f0[1] = {0.0f};
  static const double d0[1] = {0.0};
  const refcg_conv2d_params p = {.batch = 1, .in_h = 2, .in_w = 2, .in_c = 1, .out_h = 2, .out_w = 2, .out_c = 2,
                                 .kernel_h = 1, .kernel_w = 1, .stride_h = 1, .stride_w = 1, .dilation_h = 1,
                                 .dilation_w = 1, .groups = 1, .in_dtype = REFCG_S8, .w_dtype = REFCG_S8,
                                 .out_dtype = REFCG_S32, .input_zp = 2, .in_stride = {4, 2, 1, 1},
                                 .out_stride = {8, 4, 2, 1}};
  const refcg_conv2d_consts k = {.weight = w, .requant = {.mode = REFCG_RQ_INT64_UPWARD, .identity = 1,
                                 .out_min = -2147483647 - 1, .out_max = 2147483647, .multiplier = zero,
                                 .shift = zero, .scale_f32 = f0, .scale_f64 = d0}};
  const int32_t want[8] = {-3, 128, -12, 512, 3, -128, 375, -16000};
  const char* features;
  int bad = 0;
  for (int32_t i = 0; refcg_isa_variant(i, &features); ++i) {
    const char* name = refcg_isa_variant(i, NULL);
    if (!refcg_isa_supported(name)) continue;
    int32_t out[8];
    bad |= refcg_set_isa(name) != 0 || strcmp(refcg_isa_name(), name) != 0;
    bad |= refcg_conv2d(&p, &k, NULL, x, out) != 0 || memcmp(out, want, sizeof(want)) != 0;
    printf("%s ", name);
  }
  bad |= refcg_set_isa("no-such-isa") != -1;
  printf("bad=%d\n", bad);
  return bad;
}
"""


def test_static_library_links_and_runs(tmp_path):
    build = tmp_path / "build"
    make("-j2", BUILD=build, CFLAGS="-O1")  # linking is the point here: the kernels are tested through cffi
    (tmp_path / "main.c").write_text(PROGRAM)
    exe = tmp_path / "main"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{runtime_dir() / 'include'}",
                    str(tmp_path / "main.c"), str(build / "librefcg_core.a"), "-lm", "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().endswith("scalar bad=0"), out


def test_bundle_holds_every_file_once_and_compiles(tmp_path):
    """The bundle emit.py builds: each runtime .c once, each runtime header inlined once (where first
    included), no local include left; one text that compiles as C and C++ (static names do not clash)."""
    text = bundled_core()
    headers = sorted(runtime_dir().glob("*.h")) + [core_header()]
    for path in core_sources() + headers:
        assert len(re.findall(rf"(?m)^/\* {re.escape(path.name)} \*/$", text)) == 1, path.name
    assert not re.search(r'(?m)^#include "', text)
    assert core_declarations() == core_header().read_text()  # the API header includes only system headers
    (tmp_path / "bundle.c").write_text(text)
    for compiler in (["cc", "-std=c11"], ["c++", "-x", "c++"]):
        subprocess.run([*compiler, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(tmp_path / "bundle.c")],
                       check=True)


def test_python_requantize_modes_are_the_header_enum():
    """numerics.MODES mirrors REFCG_RQ_* by value: checked against the header (cffi reads the enum)."""
    from core_cffi import ENUMS
    from refcodegen.numerics import MODES

    for (rounding, compute), value in MODES.items():
        kind, _, neon = compute.partition("-")
        name = f"REFCG_RQ_{kind.upper()}_{rounding}" + ("_NEON" if neon else "")
        assert getattr(ENUMS, name) == value, name
