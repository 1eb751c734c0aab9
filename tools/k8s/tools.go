//go:build tools

// Package tools pins the upstream commands this module builds, so `go mod tidy` keeps their
// dependencies in go.sum. It is never compiled into anything (build tag `tools`).
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
