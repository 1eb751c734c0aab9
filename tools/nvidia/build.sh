#!/usr/bin/env bash
# Build NVIDIA's MIG partition editor (nvidia-mig-parted) and Kubernetes device plugin
# (nvidia-device-plugin) into BINDIR, each from its own module (mig-parted/, device-plugin/),
# so each links the go-nvml and go-nvlib its release names, as NVIDIA ships it.
# Usage: build.sh BINDIR; env GO (go command), GO_BUILD_P. Both need cgo: go-nvml links with
# its NVML calls left unresolved and dlopens libnvidia-ml.so.1 (RTLD_LAZY|RTLD_GLOBAL) at
# nvml.Init, so the binaries start without a driver; -z lazy (as mig-parted's own Makefile
# links) keeps those calls bound on first use, so a library that lacks one fails only there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BINDIR=${1:?usage: build.sh BINDIR}
mkdir -p "$BINDIR.tmp"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
GO=${GO:-go}
build() {  # build MODULE_DIR UPSTREAM_MODULE COMMAND
  local version
  version=$(awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit }' "$here/$1/go.mod")
  (cd "$here/$1" && CGO_ENABLED=1 "$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false \
    -ldflags "-s -w -extldflags=-Wl,-z,lazy -X $2/internal/info.version=$version" \
    -o "$BINDIR.tmp/" "$2/cmd/$3")
}
build mig-parted github.com/NVIDIA/mig-parted nvidia-mig-parted
build device-plugin github.com/NVIDIA/k8s-device-plugin nvidia-device-plugin
# Published whole or not at all, as the cluster's binaries are.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
