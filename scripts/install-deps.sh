#!/usr/bin/env bash
# Installs the Debian packages nook and its tests need. Idempotent.
set -euo pipefail
need=()
# python3-ipykernel, python3-matplotlib-inline and nodejs: the code
# interpreter's kernel unit tests run them on the host.
for pkg in runc mmdebstrap iproute2 uidmap curl ca-certificates busybox-static \
  python3-ipykernel python3-matplotlib-inline nodejs; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
# gVisor's runsc (pause with memory) comes from bookworm-backports.
if [ ! -e /etc/apt/sources.list.d/bookworm-backports.list ]; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/bookworm-backports.list
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# runsc (gVisor) from bookworm-backports: sandboxes of templates with runtime
# gvisor, the only way to pause with memory on this host (CRIU 3.17 fails).
if ! command -v runsc >/dev/null 2>&1; then
  echo "installing: runsc (bookworm-backports)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports runsc >/dev/null
fi
