#!/bin/sh
# aarch64 python3.11 under qemu-user (installed by tools/arm/setup.sh with @ROOT@ filled in).
# QEMU_CPU may be set by the caller (cortex-a53: no dotprod); the default is "max".
ROOT="@ROOT@"
export QEMU_LD_PREFIX="$ROOT"
export QEMU_CPU="${QEMU_CPU:-max}"
# libtvm_runtime.so only: no libtvm.so/libLLVM on the guest, models are built on the host.
export TVM_USE_RUNTIME_LIB=1
export PYTHONPATH="$ROOT/opt/site"
export PYTHONHOME="$ROOT/usr"
export TOPHUB_LOCATION=NONE
# Die with the parent (setpriv from util-linux): an RPC server's re-exec'd worker must not
# outlive a killed server or test run.
exec setpriv --pdeathsig KILL qemu-aarch64 -0 "$0" "$ROOT/usr/bin/python3.11" "$@"
