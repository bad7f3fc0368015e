#!/usr/bin/env bash
# Installs the Debian packages that building and running real test-bed nodes needs, and nothing else:
#   gcc, libc6-dev   cgo for runc; the statically linked pod sandbox program (images/pause.c)
#   libseccomp-dev   runc's seccomp support (containerd gives every pod sandbox a seccomp profile)
#   pkg-config       how runc's build finds libseccomp
#   iproute2         `ip`, which creates each node's bridge
# and the two that build images/Dockerfile as users do (the dockerfile tier, testbed/dockerfile_images.py),
# which runs as root only: without root they are left out, with a note.
#   buildah          the container builder, without a daemon (RUN steps in a chroot: no runtime needed)
#   mmdebstrap       the Debian 12 base image, from Debian's packages (no registry is needed)
# and the browser the web view's end-to-end test drives (testbed/browser.py; that test runs on real
# nodes, so as root, too):
#   chromium, chromium-driver   Debian's Chromium and its WebDriver, driven by Selenium
# Everything else (kubelet, containerd, runc, crictl, CNI plugins) is built by build-binaries.sh from
# the Go module proxy. Does nothing when every package is already installed; needs root otherwise.
set -euo pipefail

packages=(gcc libc6-dev libseccomp-dev pkg-config iproute2)
root_only=(buildah mmdebstrap chromium chromium-driver)

missing_of() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

mapfile -t missing < <(missing_of "${packages[@]}")
mapfile -t missing_root_only < <(missing_of "${root_only[@]}")
if [[ $EUID -ne 0 ]]; then
  if [[ ${#missing_root_only[@]} -gt 0 ]]; then
    echo "install-host-packages.sh: not root, so the dockerfile tier and the web view's browser test will be skipped; they need ${missing_root_only[*]}" >&2
  fi
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "install-host-packages.sh: missing Debian packages: ${missing[*]}" >&2
    echo "  install them as root: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  exit 0
fi
missing+=("${missing_root_only[@]}")
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
echo "install-host-packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
