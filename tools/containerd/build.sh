#!/usr/bin/env bash
# Build the e2e nodes' container runtime from the containerd module pinned in go.mod into
# BINDIR: containerd, its runc shim (containerd-shim-runc-v2), ctr (to import the images the
# tests build), and three CNI plugins: loopback, bridge and host-local. A test pod's eth0 is
# a veth on a bridge of its node's that has no address, no gateway and no route out (an
# address from host-local): containerd wants an eth0 with an address, and nothing a pod runs
# can reach beyond the pods of its own node. And runc, from its module too (Debian's 1.1 fails
# to start containerd 2's sandboxes here: "can't get final child's PID from pipe"), with cgo
# for its nsenter and seccomp from Debian's libseccomp-dev.
# Usage: build.sh BINDIR; env GO (go command), GO_BUILD_P. no_btrfs leaves out the btrfs
# snapshotter (it needs btrfs headers; the nodes use the native snapshotter); CGO off gives
# static binaries, as containerd's own release of the shim is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BINDIR=${1:?usage: build.sh BINDIR}
mkdir -p "$BINDIR.tmp"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
cd "$here"
GO=${GO:-go}
VERSION=$(awk '$1 == "github.com/containerd/containerd/v2" { print $2; exit }' go.mod)
CGO_ENABLED=0 "$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false -tags no_btrfs \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$VERSION" \
  -o "$BINDIR.tmp/" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/ipam/host-local
RUNC_VERSION=$(awk '$1 == "github.com/opencontainers/runc" { print $2; exit }' go.mod)
CGO_ENABLED=1 "$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false -tags seccomp \
  -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$BINDIR.tmp/runc" \
  github.com/opencontainers/runc
# Published whole or not at all, as the cluster's binaries are.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
