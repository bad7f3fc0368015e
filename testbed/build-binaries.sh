#!/usr/bin/env bash
# Builds the third-party programs the test bed runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet, etcd, helm; containerd, ctr, runc, crictl and CNI plugins for real
# nodes; prometheus and promtool for the metrics tests; kueue and its manifests for queue admission) from the Go module proxy, at the versions
# pinned in versions.env, into a cache outside the repository keyed by version:
#     ${TESSERA_CACHE:-~/.cache/tessera}/bin/<component>-<version>/<binary>
# A component whose binaries are all present is not rebuilt. Each component is built in a scratch
# folder and moved into place only when every binary exists, so an interrupted build never leaves a
# half-filled cache entry behind.
#
# Usage: build-binaries.sh [kubernetes] [etcd] [helm] [containerd] [runc] [cri-tools] [cni-plugins]
#                          [prometheus] [kueue]   (default: all)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${TESSERA_CACHE:-$HOME/.cache/tessera}
bin_root=$cache/bin
src_root=$cache/src
mkdir -p "$bin_root" "$src_root"

# Static binaries, no VCS stamping (the wrapper module has no repository), toolchain as installed.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '[build-binaries %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# complete DIR BIN... : true when DIR holds every named executable.
complete() {
  local dir=$1; shift
  local b
  for b in "$@"; do [[ -x $dir/$b ]] || return 1; done
}

# make_scratch NAME-VERSION : set the caller's `scratch` to a new build folder inside the cache, removed
# at exit unless publish() moved it into place (an interrupted build leaves nothing behind).
scratches=()
trap 'rm -rf "${scratches[@]}"' EXIT
make_scratch() {
  scratch=$(mktemp -d "$bin_root/.$1.XXXXXX")
  scratches+=("$scratch")
}

# publish NAME-VERSION SCRATCH : atomically publish a finished scratch folder.
publish() {
  local final=$bin_root/$1 scratch=$2
  rm -rf "$final"
  mv "$scratch" "$final"
}

build_kubernetes() {
  local v=$KUBERNETES_VERSION
  local staging=v0.${v#v1.}
  local minor=${v#v1.}; minor=${minor%%.*}
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
  local dest=$bin_root/kubernetes-$v
  if complete "$dest" "${bins[@]}"; then log "kubernetes $v: cached in $dest"; return; fi

  # k8s.io/kubernetes points its staging modules at ./staging with replace lines, which Go refuses
  # for `go install pkg@version`. A private wrapper module that requires it and replaces every
  # staging module by its published v0.x.y twin builds the same code.
  local mod=$src_root/kubernetes-$v
  mkdir -p "$mod"
  local staging_modules=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers
    controller-manager cri-api cri-client cri-streaming csi-translation-lib
    dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
    kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils
    pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)
  {
    echo "module tessera.local/kubernetes-binaries"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    echo "replace ("
    local m
    for m in "${staging_modules[@]}"; do echo "	k8s.io/$m => k8s.io/$m $staging"; done
    echo ")"
  } > "$mod/go.mod"

  # Stamp the real version: without it /version says v0.0.0-master and Helm's kubeVersion checks fail.
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"

  local scratch
  make_scratch "kubernetes-$v"
  log "kubernetes $v: building ${bins[*]} (cold: tens of minutes on 2 cores)"
  local targets=()
  local b
  for b in "${bins[@]}"; do targets+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$mod" && go build -mod=mod -trimpath -ldflags "$ldflags" -o "$scratch/" "${targets[@]}")
  complete "$scratch" "${bins[@]}"
  publish "kubernetes-$v" "$scratch"
  log "kubernetes $v: done"
}

build_etcd() {
  local v=$ETCD_VERSION
  local dest=$bin_root/etcd-$v
  if complete "$dest" etcd; then log "etcd $v: cached in $dest"; return; fi
  # etcd's server module has relative replace lines too; its published siblings are real versions,
  # so a wrapper that only requires it needs no replace lines.
  local mod=$src_root/etcd-$v
  mkdir -p "$mod"
  printf 'module tessera.local/etcd-binary\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$v" > "$mod/go.mod"
  local scratch
  make_scratch "etcd-$v"
  log "etcd $v: building"
  (cd "$mod" && go build -mod=mod -trimpath -ldflags "-s -w" -o "$scratch/etcd" go.etcd.io/etcd/server/v3)
  publish "etcd-$v" "$scratch"
  log "etcd $v: done"
}

# go_install_component NAME VERSION "BINARY..." LDFLAGS PACKAGE@VERSION... : build a component whose
# go.mod has no replace lines, so `go install pkg@version` works, and publish its binaries.
go_install_component() {
  local name=$1 v=$2 ldflags=$4
  local bins
  read -r -a bins <<< "$3"
  shift 4
  local dest=$bin_root/$name-$v
  if complete "$dest" "${bins[@]}"; then log "$name $v: cached in $dest"; return; fi
  local scratch
  make_scratch "$name-$v"
  log "$name $v: building ${bins[*]}"
  GOBIN=$scratch go install -trimpath -ldflags "-s -w $ldflags" "$@"
  complete "$scratch" "${bins[@]}"
  publish "$name-$v" "$scratch"
  log "$name $v: done"
}

build_helm() {
  local v=$HELM_VERSION
  go_install_component helm "$v" helm "-X helm.sh/helm/v3/internal/version.version=$v" \
    "helm.sh/helm/v3/cmd/helm@$v"
}

build_containerd() {
  local v=$CONTAINERD_VERSION
  # No cgo: the btrfs snapshotter (the only cgo part) drops out by its build constraint; the node
  # uses overlayfs. The version stamp is what `containerd --version` and the CRI Version call report.
  local cmd=github.com/containerd/containerd/v2/cmd
  go_install_component containerd "$v" "containerd containerd-shim-runc-v2 ctr" \
    "-X github.com/containerd/containerd/v2/version.Version=$v" \
    "$cmd/containerd@$v" "$cmd/containerd-shim-runc-v2@$v" "$cmd/ctr@$v"
}

build_runc() {
  local v=$RUNC_VERSION
  local dest=$bin_root/runc-$v
  # A runc cached by an earlier version of this script may lack seccomp; such a cache entry is stale.
  if complete "$dest" runc && "$dest/runc" --version | grep -q '^libseccomp:'; then
    log "runc $v: cached in $dest"; return
  fi
  local scratch
  make_scratch "runc-$v"
  # runc's nsenter is C, so cgo is required; the `seccomp` tag links libseccomp, because containerd
  # gives every pod sandbox the runtime/default seccomp profile and a runc without seccomp refuses
  # it ("config provided but seccomp not supported"). libpathrs (a Rust library) stays out: runc
  # falls back to its Go implementation.
  if ! pkg-config --exists libseccomp; then
    echo "build-binaries.sh: runc needs gcc and libseccomp-dev: run testbed/install-host-packages.sh" >&2
    exit 1
  fi
  log "runc $v: building (cgo, gcc, libseccomp)"
  CGO_ENABLED=1 GOBIN=$scratch go install -trimpath -tags "seccomp urfave_cli_no_docs" \
    -ldflags "-s -w -X main.version=${v#v}" "github.com/opencontainers/runc@$v"
  publish "runc-$v" "$scratch"
  log "runc $v: done"
}

build_cri_tools() {
  local v=$CRI_TOOLS_VERSION
  go_install_component cri-tools "$v" crictl "-X sigs.k8s.io/cri-tools/pkg/version.Version=$v" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$v"
}

build_prometheus() {
  local v=$PROMETHEUS_VERSION
  # Prometheus v3.x is published as module v0.3xx.y; stamp the release number the binaries report.
  local release=${v#v0.}; release="3.${release:1:2}.${release##*.}"
  release=$(echo "$release" | sed -E 's/\.0([0-9])/.\1/')
  local cmd=github.com/prometheus/prometheus/cmd
  # No `builtinassets` tag: the web UI is left out; the HTTP API the tests query is all there.
  go_install_component prometheus "$v" "prometheus promtool" \
    "-X github.com/prometheus/common/version.Version=$release" \
    "$cmd/prometheus@$v" "$cmd/promtool@$v"
}

build_kueue() {
  local v=$KUEUE_VERSION
  local dest=$bin_root/kueue-$v
  if complete "$dest" kueue && [[ -s $dest/manifests/webhook.yaml ]]; then
    log "kueue $v: cached in $dest"; return
  fi
  local scratch
  make_scratch "kueue-$v"
  log "kueue $v: building (cold: several minutes on 2 cores)"
  GOBIN=$scratch go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$v" \
    "sigs.k8s.io/kueue/cmd/kueue@$v"
  # The CRDs and the webhook manifest ship in the module zip; keep a copy beside the binary so the
  # cache entry is self-contained (the module cache may be cleaned independently).
  local src
  src=$(go env GOMODCACHE)/sigs.k8s.io/kueue@$v/config/components
  mkdir -p "$scratch/manifests/crds"
  cp "$src"/crd/bases/*.yaml "$scratch/manifests/crds/"
  cp "$src/webhook/manifests.yaml" "$scratch/manifests/webhook.yaml"
  chmod -R u+w "$scratch/manifests"
  publish "kueue-$v" "$scratch"
  log "kueue $v: done"
}

build_cni_plugins() {
  local v=$CNI_PLUGINS_VERSION
  local p=github.com/containernetworking/plugins/plugins
  go_install_component cni-plugins "$v" "bridge host-local" "" "$p/main/bridge@$v" "$p/ipam/host-local@$v"
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd helm kubernetes containerd runc cri-tools cni-plugins prometheus kueue)
known=(kubernetes etcd helm containerd runc cri-tools cni-plugins prometheus kueue)
for c in "${components[@]}"; do
  if [[ " ${known[*]} " != *" $c "* ]]; then
    echo "build-binaries.sh: unknown component '$c' (known: ${known[*]})" >&2
    exit 2
  fi
done

build() {
  case $1 in
    kubernetes) build_kubernetes ;;
    etcd) build_etcd ;;
    helm) build_helm ;;
    containerd) build_containerd ;;
    runc) build_runc ;;
    cri-tools) build_cri_tools ;;
    cni-plugins) build_cni_plugins ;;
    prometheus) build_prometheus ;;
    kueue) build_kueue ;;
  esac
}

# Kubernetes, the longest build (about 7 of a cold demo's 14 minutes of Go builds on 2 cores), runs
# in a lane of its own beside the others: its serial stretches (downloads, single-threaded links)
# leave a core idle that the other components' builds then use. A failure or a signal in the main
# lane must not leave Kubernetes building: its lane is stopped (its own trap removes its scratch
# folder), then the main lane's scratch folders go.
lane=""
stop_lane() {
  if [[ -n $lane ]]; then
    kill -TERM -- "-$lane" 2>/dev/null || true
    wait "$lane" 2>/dev/null || true
  fi
  rm -rf "${scratches[@]}"
}
trap stop_lane EXIT
trap 'exit 143' TERM INT
rest=()
for c in "${components[@]}"; do
  if [[ $c == kubernetes ]]; then
    set -m  # the lane in a process group of its own, so stopping it stops its go build too
    (
      scratches=()
      trap 'rm -rf "${scratches[@]}"' EXIT
      trap 'exit 143' TERM
      build_kubernetes
    ) &
    lane=$!
    set +m
  else
    rest+=("$c")
  fi
done
for c in "${rest[@]}"; do build "$c"; done
if [[ -n $lane ]]; then
  wait "$lane"
  lane=""
fi
