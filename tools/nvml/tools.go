//go:build tools

// Package tools pins go-nvml, whose pkg/nvml/nvml.h is the NVIDIA header the simulated
// libnvidia-ml.so.1 is compiled against (see build.sh); no Go is built from it.
package tools

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
)
