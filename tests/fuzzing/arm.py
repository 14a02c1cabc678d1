"""The emulated aarch64 host for ``python -m fuzzing --arm`` (make fuzz-arm): one long-lived RPC
server per QEMU CPU the ARM numerics run on (``chains.ARM_CPU``: max for +neon,+dotprod, cortex-a53
for +neon), started on first use; libraries are cross-built on x86 (``fuzzing.check``)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from arm.host import Server
from fuzzing.chains import ARM_CPU


class EmulatedHost:
    def __init__(self):
        self.logs = Path(tempfile.mkdtemp(prefix="refcg-fuzz-arm-"))
        self.servers: dict[str, Server] = {}

    def runner(self, numerics: str):
        """``runner(library path, inputs)`` for check_batch: runs on the CPU ``numerics`` is built for."""
        cpu = ARM_CPU[numerics]
        if cpu not in self.servers:
            self.servers[cpu] = Server(cpu, self.logs)
        return self.servers[cpu].run

    def close(self):
        for server in self.servers.values():
            server.close()
        self.servers.clear()
