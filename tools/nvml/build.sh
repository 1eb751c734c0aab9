#!/usr/bin/env bash
# Build libnvidia-ml.so.1 for simulated GPUs into OUTDIR: the C source is generated from
# tessera.nvml.sim.abi (gen_shim.py) and compiled with the system's C compiler against the
# nvml.h NVIDIA publishes, which ships in the go-nvml module pinned in go.mod. The compiler
# checks every signature against that header, and every struct's layout against pynvml's.
# Usage: build.sh OUTDIR; env PYTHON (one that imports tessera), GO, CC.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${1:?usage: build.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
header_dir=$(cd "$here" && "${GO:-go}" mod download github.com/NVIDIA/go-nvml >/dev/null && \
  "${GO:-go}" list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)/pkg/nvml
"${PYTHON:-python3}" "$here/gen_shim.py" "$OUTDIR/shim.c"
"${CC:-cc}" -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
  -I"$header_dir" -I"$here" -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined \
  -o "$OUTDIR/libnvidia-ml.so.1.tmp" "$OUTDIR/shim.c" "$here/runtime.c" -lpthread
mv "$OUTDIR/libnvidia-ml.so.1.tmp" "$OUTDIR/libnvidia-ml.so.1"
ln -sf libnvidia-ml.so.1 "$OUTDIR/libnvidia-ml.so"
