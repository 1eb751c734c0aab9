//go:build tools

// Package tools pins promtool, Prometheus's rule checker, to a published release: CI runs
// `promtool check rules` and `promtool test rules` on the chart's alert rules
// (tests/chart/test_monitoring.py). build.sh builds it with -tags remove_all_sd, Prometheus's
// own switch that leaves out the cloud service discoveries promtool never needs here.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
