//go:build tools

// Package tools pins the upstream commands this module builds, so `go mod tidy` keeps their
// dependencies in go.sum. It is never compiled into anything (build tag `tools`).
package tools

import (
	_ "github.com/rhysd/actionlint/cmd/actionlint"
)
