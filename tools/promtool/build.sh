#!/usr/bin/env bash
# Build promtool from the Prometheus module pinned in go.mod into BINDIR/promtool.
# Usage: build.sh BINDIR; env GO (go command), GO_BUILD_P. -tags remove_all_sd is
# Prometheus's own build switch that leaves out every cloud service discovery (promtool's
# rule checks need none of them), which roughly halves the cold build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BINDIR=${1:?usage: build.sh BINDIR}
mkdir -p "$BINDIR.tmp"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
cd "$here"
GO=${GO:-go}
"$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false -tags remove_all_sd \
  -ldflags "-s -w" -o "$BINDIR.tmp/promtool" github.com/prometheus/prometheus/cmd/promtool
# Published whole or not at all, as the cluster's binaries are.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
