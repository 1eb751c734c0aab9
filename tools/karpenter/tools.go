//go:build tools

// Package tools pins Karpenter (its kwok cloud provider binary) for the scale-up e2e test.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
