"""The pure core: MIG catalogue, layout model and planner. No I/O lives here.

Adapters (NVML, kubelet gRPC, Kubernetes API) and processes (agent, controller, CLI) build on
this package; nothing here imports them, which ``lint-imports`` enforces.
"""
