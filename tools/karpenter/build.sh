#!/usr/bin/env bash
# Build Karpenter with its kwok cloud provider (sigs.k8s.io/karpenter/kwok, the module pinned
# in go.mod) into BINDIR/karpenter, and copy the release's CRDs (NodePool, NodeClaim,
# KWOKNodeClass, ...) into BINDIR/crds, for the scale-up e2e test. Usage: build.sh BINDIR; env GO
# (go command), GO_BUILD_P. Karpenter's go.mod asks for a newer Go than some machines carry:
# GOTOOLCHAIN=auto lets the go command fetch the toolchain go.mod names from the module proxy
# (a machine whose Go is new enough uses its own).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BINDIR=${1:?usage: build.sh BINDIR}
mkdir -p "$BINDIR.tmp"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
cd "$here"
GO=${GO:-go}
export GOTOOLCHAIN=auto
"$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false -ldflags "-s -w" \
  -o "$BINDIR.tmp/karpenter" sigs.k8s.io/karpenter/kwok
module=$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
mkdir -p "$BINDIR.tmp/crds"
cp "$module"/pkg/apis/crds/*.yaml "$module"/kwok/apis/crds/*.yaml "$BINDIR.tmp/crds/"
chmod u+w "$BINDIR.tmp/crds/"*.yaml
# Published whole or not at all, as the cluster's binaries are.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
