#!/usr/bin/env bash
# Set up the emulated aarch64 test host (qemu-user, no chroot, no binfmt_misc), idempotently.
#
#   tools/arm/setup.sh [ROOT]        ROOT defaults to $REFCG_ARM_ROOT or ~/.cache/refcg-arm
#
# 1. host tools from Debian: the aarch64 cross compilers and qemu-user (needs root and apt);
# 2. ROOT: an aarch64 "sysroot" of python3.11 and its libraries, unpacked from arm64 .debs with
#    dpkg-deb -x (apt only downloads them; nothing is installed for arm64 or run emulated);
# 3. ROOT/opt/site: the aarch64 TVM wheel (runtime only) and its pure dependencies, unpacked by
#    the host pip, then byte-compiled by the host python3.11 (.pyc is architecture independent;
#    the emulated `import tvm` drops from ~10 s to ~3 s);
# 4. ROOT/usr/bin/python3-aarch64: the launcher (qemu -0 makes sys.executable the launcher, so
#    the RPC server's re-exec'd worker also goes through qemu).
# A stamp holding the hash of this script makes a second run cost milliseconds.
# Exit status: 0 ready, 3 the tools cannot be installed here (no apt or not root), else failure.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${1:-${REFCG_ARM_ROOT:-$HOME/.cache/refcg-arm}}"
PYTHON="${PYTHON:-python3.11}"
TVM_WHEEL="xtc-tvm-python-bindings==0.19.0.12"
# What `import tvm` with TVM_USE_RUNTIME_LIB=1 and the RPC server need; not scipy/tornado/LLVM.
SITE_PACKAGES="$TVM_WHEEL numpy psutil cloudpickle decorator attrs ml_dtypes packaging typing_extensions"
# Roots of the arm64 sysroot; their Depends/Pre-Depends are added by resolve_debs.
DEB_ROOTS="libc6 libstdc++6 libgcc-s1 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib"
HOST_PACKAGES="gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user"

STAMP="$ROOT/.refcg-setup"
WANT="$(cat "$HERE/setup.sh" "$HERE/launcher.sh" | sha256sum | cut -c1-16)"

have_host_tools() {
  command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null
}

if have_host_tools && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi

log() { echo "[arm-setup] $*" >&2; }
started=$SECONDS

if ! have_host_tools; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "aarch64 cross compiler / qemu-user missing and cannot apt-get install them here"
    exit 3
  fi
  log "installing $HOST_PACKAGES"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $HOST_PACKAGES >/dev/null
fi

if [ "$(id -u)" != 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  log "need root once to enable the arm64 package lists (dpkg --add-architecture arm64)"
  exit 3
fi

# All arm64 packages the roots depend on, transitively (Multi-Arch: foreign ones such as
# debconf are satisfied by the host architecture and are not needed in a sysroot).
resolve_debs() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances $(printf '%s:arm64 ' $DEB_ROOTS) 2>/dev/null |
    grep -E '^[a-z0-9][^ ]*:arm64$' | sed 's/:arm64$//' | sort -u
}

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
if ! apt-cache show libc6:arm64 >/dev/null 2>&1; then
  log "apt-get update (arm64 lists)"
  apt-get update -qq
fi

rm -rf "$ROOT.tmp"
mkdir -p "$ROOT.tmp"
debs_dir="$(mktemp -d)"
trap 'rm -rf "$debs_dir"' EXIT
chmod 777 "$debs_dir"  # apt downloads as the _apt user
debs="$(resolve_debs)"
log "downloading $(echo "$debs" | wc -w) arm64 .debs"
(cd "$debs_dir" && apt-get download -qq $(printf '%s:arm64 ' $debs) >/dev/null)
for deb in "$debs_dir"/*.deb; do
  dpkg-deb -x "$deb" "$ROOT.tmp"
done

log "unpacking aarch64 wheels with the host pip"
"$PYTHON" -m pip install -q --disable-pip-version-check --target "$ROOT.tmp/opt/site" \
  --platform manylinux_2_28_aarch64 --only-binary=:all: --python-version 3.11 \
  --implementation cp --no-deps $SITE_PACKAGES
# The host interpreter writes the .pyc files: it must be 3.11 like the guest.
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'
"$PYTHON" -m compileall -q -j 0 "$ROOT.tmp/opt/site" "$ROOT.tmp/usr/lib/python3.11" >/dev/null || true

mkdir -p "$ROOT.tmp/usr/bin"
sed "s|@ROOT@|$ROOT|g" "$HERE/launcher.sh" >"$ROOT.tmp/usr/bin/python3-aarch64"
chmod 755 "$ROOT.tmp/usr/bin/python3-aarch64"

rm -rf "$ROOT"
mv "$ROOT.tmp" "$ROOT"
echo "$WANT" >"$STAMP"
log "ready in $((SECONDS - started)) s: $ROOT ($(du -sh "$ROOT" | cut -f1))"
