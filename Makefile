# One entry point for everything a developer or CI runs.
#   make test   create .venv if needed, install with dev extras, lint, type-check, layer-check, test
#   make demo   the main job on its embedded default
#   make cluster-bins  build the e2e test cluster's binaries (tools/k8s) unless already built
#   make promtool      build promtool (tools/promtool) for the alert-rule checks unless built
#   make karpenter     build Karpenter's kwok provider (tools/karpenter) for the scale-up e2e
#   make browser       install Debian's Chromium (as root) for the report's browser test
#   make grafana-schema  install Grafana's dashboard schema and tsc (npm, pinned) for its check
#   make container-tools install Debian's buildah, mmdebstrap, umoci, libseccomp-dev (root)
#   make containerd    build containerd, its runc shim, ctr, runc and three CNI plugins
#                      (tools/containerd) for the e2e nodes that run real containers
#   make nvidia-tools  build nvidia-mig-parted and nvidia-device-plugin (tools/nvidia, cgo)
#   make nvml-lib      build libnvidia-ml.so.1 for simulated GPUs (tools/nvml) into build/nvml
#   make image         build the image from daemonset/Dockerfile into build/image (buildah)
#   make chart         package the chart (helm package) into build/chart at the one version
#   make version       print that version (tessera.__version__)
#   make workflows     lint .github/workflows with actionlint (tools/actionlint)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The e2e cluster's binaries, built from tools/k8s/ into a cache dir named after the pinned
# Kubernetes version; rebuilt only when the module or its commands change (under 1.5 minutes
# with a warm Go build cache; 22 minutes measured on 2 shared cores when cold, see README).
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2; exit }' tools/k8s/go.mod)
# Keyed by the content of tools/k8s and kept outside the checkout, so a fresh clone on the same
# machine (CI) reuses binaries built by an earlier checkout instead of building them again.
K8S_SOURCES := tools/k8s/go.mod tools/k8s/go.sum tools/k8s/build.sh tools/k8s/tools.go \
	$(sort $(wildcard tools/k8s/cmd/*/*.go))
K8S_KEY := $(shell cat $(K8S_SOURCES) | sha256sum | cut -c1-12)
CLUSTER_CACHE ?= $(HOME)/.cache/tessera/k8s
CLUSTER_BINS := $(CLUSTER_CACHE)/$(K8S_VERSION)-$(K8S_KEY)
CLUSTER_STAMP := $(CLUSTER_BINS)/.built
# promtool, from the Prometheus release pinned in tools/promtool/go.mod, cached the same way.
PROM_VERSION := $(shell awk '{ for (i = 1; i < NF; i++) if ($$i == "github.com/prometheus/prometheus") { print $$(i + 1); exit } }' tools/promtool/go.mod)
PROM_SOURCES := tools/promtool/go.mod tools/promtool/go.sum tools/promtool/build.sh tools/promtool/tools.go
PROM_KEY := $(shell cat $(PROM_SOURCES) | sha256sum | cut -c1-12)
PROMTOOL_DIR := $(HOME)/.cache/tessera/promtool/$(PROM_VERSION)-$(PROM_KEY)
PROMTOOL := $(PROMTOOL_DIR)/promtool
# Karpenter with its kwok cloud provider, from the release pinned in tools/karpenter/go.mod,
# cached the same way (about 4 minutes on 2 cores the first time, with its Go toolchain).
KARPENTER_VERSION := $(shell awk '$$1 == "require" && $$2 == "sigs.k8s.io/karpenter" { print $$3; exit }' tools/karpenter/go.mod)
KARPENTER_SOURCES := tools/karpenter/go.mod tools/karpenter/go.sum tools/karpenter/build.sh tools/karpenter/tools.go
KARPENTER_KEY := $(shell cat $(KARPENTER_SOURCES) | sha256sum | cut -c1-12)
KARPENTER_DIR := $(HOME)/.cache/tessera/karpenter/$(KARPENTER_VERSION)-$(KARPENTER_KEY)
KARPENTER := $(KARPENTER_DIR)/karpenter

# containerd (with ctr, the runc shim, runc and CNI plugins), cached the same way.
CONTAINERD_VERSION := $(shell awk '$$1 == "github.com/containerd/containerd/v2" { print $$2; exit }' tools/containerd/go.mod)
CONTAINERD_SOURCES := tools/containerd/go.mod tools/containerd/go.sum tools/containerd/build.sh tools/containerd/tools.go
CONTAINERD_KEY := $(shell cat $(CONTAINERD_SOURCES) | sha256sum | cut -c1-12)
CONTAINERD_DIR := $(HOME)/.cache/tessera/containerd/$(CONTAINERD_VERSION)-$(CONTAINERD_KEY)
CONTAINERD := $(CONTAINERD_DIR)/containerd
# NVIDIA's nvidia-mig-parted and nvidia-device-plugin (cgo, go-nvml), each from its own module
# in tools/nvidia, cached the same way; they check the simulated libnvidia-ml.so.1 below.
NVIDIA_TOOLS_VERSION := mig-parted-$(shell awk '$$1 == "require" { print $$3 }' \
	tools/nvidia/mig-parted/go.mod)-dp-$(shell awk '$$1 == "require" { print $$3 }' \
	tools/nvidia/device-plugin/go.mod)
NVIDIA_TOOLS_SOURCES := tools/nvidia/build.sh $(foreach m,mig-parted device-plugin,\
	tools/nvidia/$(m)/go.mod tools/nvidia/$(m)/go.sum tools/nvidia/$(m)/tools.go)
NVIDIA_TOOLS_KEY := $(shell cat $(NVIDIA_TOOLS_SOURCES) | sha256sum | cut -c1-12)
NVIDIA_TOOLS_DIR := $(HOME)/.cache/tessera/nvidia-tools/$(NVIDIA_TOOLS_VERSION)-$(NVIDIA_TOOLS_KEY)
NVIDIA_TOOLS := $(NVIDIA_TOOLS_DIR)/nvidia-device-plugin
# The image, built by buildah from the Dockerfile on a locally made Debian base (no registry
# is reachable here); rebuilt every run (about a minute; the base is cached in ~/.cache).
IMAGE_DIR := build/image
CONTAINER_TOOLS := buildah mmdebstrap umoci libseccomp-dev
# The one version: tessera.__version__ (pyproject reads it; the chart's is checked against it).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' src/tessera/__init__.py)
HELM ?= $(CLUSTER_BINS)/helm
# actionlint, from the release pinned in tools/actionlint/go.mod, cached the same way.
ACTIONLINT_VERSION := $(shell awk '$$1 == "require" && $$2 == "github.com/rhysd/actionlint" { print $$3; exit }' tools/actionlint/go.mod)
ACTIONLINT_SOURCES := tools/actionlint/go.mod tools/actionlint/go.sum tools/actionlint/build.sh tools/actionlint/tools.go
ACTIONLINT_KEY := $(shell cat $(ACTIONLINT_SOURCES) | sha256sum | cut -c1-12)
ACTIONLINT_DIR := $(HOME)/.cache/tessera/actionlint/$(ACTIONLINT_VERSION)-$(ACTIONLINT_KEY)
ACTIONLINT := $(ACTIONLINT_DIR)/actionlint

.PHONY: test lint typecheck layers proto-check crd-check pytest demo proto clean cluster-bins \
	promtool karpenter browser grafana-schema container-tools containerd nvidia-tools nvml-lib \
	image chart version workflows

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP) lint typecheck layers proto-check crd-check workflows cluster-bins promtool \
	karpenter browser grafana-schema containerd nvidia-tools nvml-lib image pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

proto-check: $(STAMP)
	@if [ -f tools/gen_proto.py ]; then $(BIN)/python tools/gen_proto.py --check; fi

crd-check: $(STAMP)
	$(BIN)/python tools/gen_crds.py --check

proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

pytest: $(STAMP) cluster-bins promtool karpenter browser grafana-schema containerd nvidia-tools \
	nvml-lib image
	TESSERA_K8S_BIN=$(CLUSTER_BINS) TESSERA_PROMTOOL=$(PROMTOOL) TESSERA_KARPENTER=$(KARPENTER) \
	    TESSERA_CONTAINERD_BIN=$(CONTAINERD_DIR) TESSERA_IMAGES=$(CURDIR)/$(IMAGE_DIR) \
	    TESSERA_NVIDIA_TOOLS_BIN=$(NVIDIA_TOOLS_DIR) TESSERA_NVML_LIB=$(CURDIR)/$(NVML_LIB) \
	    $(BIN)/pytest -q

cluster-bins: $(CLUSTER_STAMP)

promtool: $(PROMTOOL)
	@echo "TESSERA_PROMTOOL=$(PROMTOOL)"

$(PROMTOOL):
	GO=$(GO) tools/promtool/build.sh $(PROMTOOL_DIR)

karpenter: $(KARPENTER)
	@echo "TESSERA_KARPENTER=$(KARPENTER)"

$(KARPENTER):
	GO=$(GO) tools/karpenter/build.sh $(KARPENTER_DIR)

containerd: $(CONTAINERD)
	@echo "TESSERA_CONTAINERD_BIN=$(CONTAINERD_DIR)"

$(CONTAINERD): | container-tools
	GO=$(GO) tools/containerd/build.sh $(CONTAINERD_DIR)

# libnvidia-ml.so.1 for simulated GPUs: generated from tessera.nvml.sim.abi, compiled against
# go-nvml's nvml.h (a few seconds; rebuilt when its sources change).
NVML_LIB := build/nvml/libnvidia-ml.so.1
$(NVML_LIB): $(STAMP) tools/nvml/build.sh tools/nvml/gen_shim.py tools/nvml/runtime.c \
		tools/nvml/runtime.h tools/nvml/go.mod tools/nvml/go.sum src/tessera/nvml/sim/abi.py
	PYTHON=$(CURDIR)/$(BIN)/python GO=$(GO) tools/nvml/build.sh build/nvml

nvml-lib: $(NVML_LIB)

nvidia-tools: $(NVIDIA_TOOLS)
	@echo "TESSERA_NVIDIA_TOOLS_BIN=$(NVIDIA_TOOLS_DIR)"

$(NVIDIA_TOOLS):
	GO=$(GO) tools/nvidia/build.sh $(NVIDIA_TOOLS_DIR)

# Debian's daemonless image tools, and libseccomp's headers for runc's build; as root this
# installs what is missing, otherwise it says how and the tests that need them skip.
container-tools:
	@missing=""; for p in $(CONTAINER_TOOLS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || \
	    missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    >/dev/null || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	else echo "missing:$$missing: sudo apt-get install$$missing (the image and real-container tests skip)"; fi

image: $(STAMP) cluster-bins | container-tools
	PYTHON=$(CURDIR)/$(BIN)/python GO=$(GO) tools/image/build.sh $(IMAGE_DIR)

version:
	@echo $(VERSION)

chart: cluster-bins
	$(HELM) package charts/tessera --version $(VERSION) --app-version $(VERSION) -d build/chart

workflows: $(ACTIONLINT)
	$(ACTIONLINT) .github/workflows/*.yml

$(ACTIONLINT):
	GO=$(GO) tools/actionlint/build.sh $(ACTIONLINT_DIR)

# Grafana's published dashboard schema (@grafana/schema) and tsc, at the versions in
# tools/grafana-schema/package-lock.json; the dashboard test type-checks the JSON against it.
GRAFANA_SCHEMA := tools/grafana-schema/node_modules/.installed
grafana-schema: $(GRAFANA_SCHEMA)

$(GRAFANA_SCHEMA): tools/grafana-schema/package.json tools/grafana-schema/package-lock.json
	npm ci --prefix tools/grafana-schema --no-audit --no-fund --loglevel=error
	touch $@

# The report's browser test opens the page in Debian's Chromium (/usr/bin/chromium); as root
# this installs it when missing (about 20 s), otherwise it says how and the test skips.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium \
	    >/dev/null || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	else echo "Chromium missing: sudo apt-get install chromium (the browser test skips)"; fi

$(CLUSTER_STAMP):
	GO=$(GO) tools/k8s/build.sh $(CLUSTER_BINS)
	touch $@

# The demo's sizing question, as an admin sets it: inference (one GPU or less) within minutes,
# training (multi-GPU) within hours; the reservation trade shown beside the default. The
# README quotes its answer, and tests/sim/test_sizing.py checks that quote against these.
DEMO_CLUSTER := 4x8xA100-SXM4-80GB
DEMO_GOAL := small:p95-wait=2m,multi-gpu:p95-wait=6h
DEMO_POLICIES := dynamic,dynamic:reservations-0,greedy,static:all-balanced,static:all-7g

demo: $(STAMP)
	$(BIN)/tessera simulate --cluster $(DEMO_CLUSTER) --report simulation-report.html
	$(BIN)/tessera simulate --cluster $(DEMO_CLUSTER) --size-for $(DEMO_GOAL) \
	    --policies $(DEMO_POLICIES) --no-progress --report simulation-sizing.html

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
