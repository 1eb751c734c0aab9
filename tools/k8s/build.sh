#!/usr/bin/env bash
# Build the test cluster's binaries from their pinned Go modules into BINDIR (default
# bin/<kubernetes version>). Usage: build.sh [BINDIR]; env GO (go command), GO_BUILD_P.
# The -X flags stamp the versions the binaries report: without them kube-apiserver says
# v0.0.0 and Helm's kubeVersion checks fail (and helm calls itself v4.3). -p limits parallel
# compiles (default 2) so a shared 2-core machine stays usable; -buildvcs=false because the
# binaries need no git stamp and a checkout git refuses to read (ownership) must not fail it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$here/go.mod")
BINDIR=${1:-$here/bin/$K8S_VERSION}
mkdir -p "$(dirname "$BINDIR")"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
cd "$here"
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" { print $2; exit }' go.mod)
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
GO=${GO:-go}
mkdir -p "$BINDIR.tmp"
"$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  -o "$BINDIR.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  ./cmd/etcd ./cmd/fakecri \
  helm.sh/helm/v4/cmd/helm
# Publish all seven at once, so a build killed halfway never leaves a half-filled cache dir.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
