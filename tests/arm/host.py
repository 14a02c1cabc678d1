"""The emulated aarch64 host: set it up, run one TVM RPC server per QEMU CPU, run models on it.

Artifacts are always built on x86 (TVM and refcg cross-compile for aarch64); only running them
is emulated. One long-lived server per CPU model serves every test: an emulated ``import tvm``
costs seconds, a model run milliseconds.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay, rpc
from tvm.contrib import graph_executor

from refcodegen import objcache

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "arm" / "setup.sh"
ROOT = Path(os.environ.get("REFCG_ARM_ROOT", Path.home() / ".cache" / "refcg-arm"))
LAUNCHER = ROOT / "usr" / "bin" / "python3-aarch64"
CROSS_CXX = "aarch64-linux-gnu-g++"
UNAVAILABLE = 3  # setup.sh: the tools cannot be installed on this machine

TRIPLE = "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu"
TARGET_DOTPROD = f"{TRIPLE} -mattr=+neon,+dotprod"
TARGET_NEON = f"{TRIPLE} -mattr=+neon"


def ensure_host() -> None:
    """Run the idempotent setup (milliseconds when done); skip when this machine cannot have it."""
    env = dict(os.environ, PYTHON=sys.executable)  # the host pip that unpacks the aarch64 wheels
    done = subprocess.run(["bash", str(SETUP), str(ROOT)], capture_output=True, text=True, env=env)
    if done.returncode == UNAVAILABLE:
        pytest.skip(f"emulated aarch64 host unavailable: {done.stderr.strip()}")
    assert done.returncode == 0, f"{SETUP} failed:\n{done.stdout}\n{done.stderr}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """PR_SET_PDEATHSIG: a killed or timed-out pytest takes its emulated server along."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


class Server:
    """``python3-aarch64 -m tvm.exec.rpc_server`` under qemu with a given QEMU_CPU."""

    def __init__(self, cpu: str, log_dir: Path):
        self.cpu, self.log_dir = cpu, log_dir
        self.uploads = 0
        self.restarts = 0  # servers started again after a lost connection (run())
        self.log = None
        self._start()

    def _start(self):
        self.port = _free_port()
        self.log = open(self.log_dir / f"rpc-{self.cpu}.log", "a")
        env = dict(os.environ, QEMU_CPU=self.cpu)
        env.pop("REFCG_ISA", None)  # the dispatcher must pick the variant from the CPU itself
        # Own session: the server re-execs a worker; the whole group is ended at close().
        self.proc = subprocess.Popen(
            [str(LAUNCHER), "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
             "--port", str(self.port), "--port-end", str(self.port + 1)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        try:
            self.session = self._connect(timeout=120)
        except Exception:
            self.close()
            raise

    def _connect(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                # no session_timeout: it bounds the whole session, not a call (a 600 s limit ended
                # every fuzz-arm campaign after ten minutes with "Broken pipe")
                return rpc.connect("127.0.0.1", self.port)
            except (tvm.TVMError, RuntimeError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"RPC server ({self.cpu}) did not start; see {self.log.name}")
                time.sleep(0.5)

    def run(self, lib_path: Path, inputs: dict) -> list[np.ndarray]:
        """Upload an exported aarch64 library, run it through the graph executor, fetch outputs.
        A lost connection (the emulated server died) starts a new server and runs once more."""
        try:
            return self._run(lib_path, inputs)
        except (tvm.TVMError, OSError) as error:
            if self.proc.poll() is None and "Socket" not in str(error) and "closed" not in str(error):
                raise  # the server is alive: an error of the model itself
            self.close()
            self.restarts += 1
            self._start()
            return self._run(lib_path, inputs)

    def _run(self, lib_path: Path, inputs: dict) -> list[np.ndarray]:
        # A fresh remote name per upload: dlopen would hand back a still-open library of the same path.
        self.uploads += 1
        name = f"{self.uploads}_{lib_path.name}"
        self.session.upload(str(lib_path), target=name)
        lib = self.session.load_module(name)
        module = graph_executor.GraphModule(lib["default"](self.session.cpu()))
        for key, value in inputs.items():
            module.set_input(key, value)
        module.run()
        return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]

    def close(self):
        self.session = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def export_aarch64(mod, target: str, path: Path, params=None) -> Path:
    """relay.build for an aarch64 target and export with the cross compiler (C sources too; the
    core's object is reused across exports, see refcodegen.objcache)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    lib.export_library(str(path), fcompile=objcache.create_shared, cc=CROSS_CXX)
    return path
