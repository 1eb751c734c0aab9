//go:build tools

// Package tools pins the upstream command this module builds (github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin), so
// `go mod tidy` keeps its dependencies in go.sum, at the versions its own go.mod names (this
// module requires nothing else). It is never compiled into anything (build tag `tools`).
package tools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)
