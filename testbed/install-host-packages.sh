#!/usr/bin/env bash
# Installs the Debian packages that building and running real test-bed nodes needs, and nothing else:
#   gcc, libc6-dev   cgo for runc; the statically linked pod sandbox program (images/pause.c)
#   libseccomp-dev   runc's seccomp support (containerd gives every pod sandbox a seccomp profile)
#   pkg-config       how runc's build finds libseccomp
#   iproute2         `ip`, which creates each node's bridge
# Everything else (kubelet, containerd, runc, crictl, CNI plugins) is built by build-binaries.sh from
# the Go module proxy. Does nothing when every package is already installed; needs root otherwise.
set -euo pipefail

packages=(gcc libc6-dev libseccomp-dev pkg-config iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $EUID -ne 0 ]]; then
  echo "install-host-packages.sh: missing Debian packages: ${missing[*]}" >&2
  echo "  install them as root: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "install-host-packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
