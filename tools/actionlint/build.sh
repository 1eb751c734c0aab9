#!/usr/bin/env bash
# Build actionlint from the module pinned in go.mod into BINDIR/actionlint: it checks the
# release workflow (.github/workflows/) in make test. Usage: build.sh BINDIR; env GO,
# GO_BUILD_P. The build cache (~/.cache/go-build) is the one every tools/ build shares.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BINDIR=${1:?usage: build.sh BINDIR}
mkdir -p "$BINDIR.tmp"
BINDIR=$(cd "$(dirname "$BINDIR")" && pwd)/$(basename "$BINDIR")
cd "$here"
GO=${GO:-go}
VERSION=$(awk '$1 == "github.com/rhysd/actionlint" { print $2; exit }' go.mod)
"$GO" build -p "${GO_BUILD_P:-2}" -trimpath -buildvcs=false \
  -ldflags "-s -w -X github.com/rhysd/actionlint.version=$VERSION" \
  -o "$BINDIR.tmp/actionlint" github.com/rhysd/actionlint/cmd/actionlint
# Published whole or not at all, as the cluster's binaries are.
rm -rf "$BINDIR"
mv "$BINDIR.tmp" "$BINDIR"
