"""Prometheus metrics of the node agent, on ``/metrics`` (``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tessera.agent.reconciler import ReconcileResult

__all__ = ["AgentMetrics"]


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.slices = Gauge("tessera_agent_slices", "MIG slices on this node by state",
                            ["gpu", "profile", "state"], registry=r)
        self.reconcile_seconds = Histogram(
            "tessera_agent_reconcile_seconds", "Time of one reconcile (observe, plan, apply)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.reconciles = Counter("tessera_agent_reconciles_total",
                                  "Reconciles by outcome (the Applied condition's reason)",
                                  ["outcome"], registry=r)
        self.steps = Counter("tessera_agent_steps_total", "Steps carried out, by kind and result",
                             ["kind", "result"], registry=r)
        self.nvml_errors = Counter("tessera_agent_nvml_errors_total",
                                   "NVML errors met while applying, by return code", ["code"],
                                   registry=r)
        self.unhealthy_gpus = Gauge("tessera_agent_unhealthy_gpus",
                                    "GPUs with a critical Xid or off the bus", registry=r)
        self.allocated_devices = Gauge("tessera_agent_allocated_devices",
                                       "Devices the kubelet has allocated to pods", registry=r)
        self.mps_daemons_up = Gauge("tessera_agent_mps_daemons_up",
                                    "MPS control daemons running", registry=r)
        self.dra_claims = Counter(
            "tessera_agent_dra_claims_total", "DRA claims the kubelet asked this node to "
            "prepare or unprepare, by result", ["operation", "result"], registry=r)
        self.dra_prepare_seconds = Histogram(
            "tessera_agent_dra_prepare_seconds", "One DRA claim's prepare (read the claim, make "
            "the slice or start MPS, write the CDI spec)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.dra_pool_writes = Counter(
            "tessera_agent_dra_pool_writes_total", "Times this DRA node rewrote its "
            "ResourceSlices (a new pool generation)", registry=r)

    def record(self, result: ReconcileResult) -> None:
        self.reconcile_seconds.observe(result.seconds)
        applied = next((c for c in result.status.conditions if c.type == "Applied"), None)
        self.reconciles.labels(applied.reason if applied else "Unknown").inc()
        for outcome in result.outcomes:
            self.steps.labels(type(outcome.step).__name__, outcome.status).inc()
            if outcome.code is not None and outcome.status == "failed":
                self.nvml_errors.labels(str(outcome.code)).inc()
        self.slices.clear()
        allocated = 0
        unhealthy = 0
        for gpu in result.status.gpus:
            unhealthy += 0 if gpu.healthy else 1
            for item in gpu.slices:
                state = ("allocated" if item.allocated else "busy" if item.processes else
                         "incomplete" if item.uuid is None else "free")
                allocated += 1 if item.allocated else 0
                self.slices.labels(str(gpu.index), item.profile, state).inc()
        self.allocated_devices.set(allocated)
        self.unhealthy_gpus.set(unhealthy)
        self.mps_daemons_up.set(sum(1 for g in result.status.gpus
                                    if g.mps is not None and g.mps.daemon == "Running"))
