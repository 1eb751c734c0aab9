"""The controller process: kopf watches fill a cache, one thread ticks the decision loop.

kopf delivers every Pod, Node, NodePartition and PartitionPolicy event to :class:`ClusterCache`;
the decision loop (:class:`~tessera.controller.loop.Controller`) runs only on the replica that
holds the leader Lease, so two replicas never write plans at once, and a new leader rebuilds
what it needs from the cluster itself.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tessera.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    VERSION,
    NodePartition,
    NodePartitionSpec,
    ObjectMeta,
    PartitionPolicyStatus,
)
from tessera.controller import scaleup
from tessera.controller.demand import GATE
from tessera.controller.loop import ClusterCache, Controller, ControllerSettings
from tessera.core.dra import REQUEUED_ANNOTATION
from tessera.kube.events import EventRecorder
from tessera.kube.health import HealthServer
from tessera.kube.leases import LeaderElector
from tessera.kube.partitions import NodePartitions
from tessera.kube.pods import Pods

__all__ = ["ApiWriter", "ControllerMetrics", "api_listers", "build_registry", "prime",
           "prime_until_done", "run"]

log = logging.getLogger(__name__)

RELEASE_WORKERS = 16
"""Pod releases in flight at once (each a GET and a PATCH of one pod)."""


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pending = Gauge("tessera_controller_pending_gpu_pods",
                             "GPU pods waiting for capacity", registry=r)
        self.leader = Gauge("tessera_controller_leader", "1 on the replica that plans",
                            registry=r)
        self.plans = Counter("tessera_controller_plans_total", "Planner runs", registry=r)
        self.planning = Histogram("tessera_controller_planning_seconds", "Planner run time",
                                  buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
                                  registry=r)
        self.created = Counter("tessera_controller_slices_created_total",
                               "Slices the plans create", registry=r)
        self.destroyed = Counter("tessera_controller_slices_destroyed_total",
                                 "Free slices the plans destroy", registry=r)
        self.placed = Counter("tessera_controller_pods_placed_total",
                              "Pods the planner placed", registry=r)
        self.unplaced = Gauge("tessera_controller_pods_unplaced",
                              "Pods the last plan could not place", registry=r)
        self.released = Counter("tessera_controller_pods_released_total",
                                "Pods pinned and released to the scheduler", registry=r)
        self.oldest = Gauge("tessera_controller_oldest_pending_gpu_pod_age_seconds",
                            "Age of the oldest GPU pod waiting for capacity (0 when none)",
                            registry=r)
        self.waited = Histogram("tessera_controller_pod_wait_seconds",
                                "From a GPU pod's creation to its release to the scheduler "
                                "(a pod the gate missed: to the room made for it)",
                                buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
                                registry=r)
        self.scale_up = Gauge("tessera_controller_scaleup_gpus_requested",
                              "Whole GPUs the controller's placeholder pods ask the cluster "
                              "autoscaler for now", registry=r)
        self.errors = Counter("tessera_controller_loop_errors_total",
                              "Decision-loop ticks that failed, by kind (api, internal)",
                              ["kind"], registry=r)
        for kind in ("api", "internal"):
            self.errors.labels(kind)  # shown at 0 so a rate() has a series from the start

    def record_tick(self, pending: int, leader: bool, oldest_s: float = 0.0) -> None:
        self.pending.set(pending)
        self.leader.set(1 if leader else 0)
        self.oldest.set(oldest_s if leader else 0.0)

    def record_plan(self, seconds: float, placed: int, unplaced: int, created: int,
                    destroyed: int) -> None:
        self.plans.inc()
        self.planning.observe(seconds)
        self.placed.inc(placed)
        self.unplaced.set(unplaced)
        self.created.inc(created)
        self.destroyed.inc(destroyed)

    def record_release(self, waited_s: float | None = None, pinned: bool = True) -> None:
        if pinned:
            self.released.inc()
        if waited_s is not None:
            self.waited.observe(waited_s)

    def record_scale_up(self, gpus: int) -> None:
        self.scale_up.set(gpus)

    def record_error(self, kind: str) -> None:
        self.errors.labels(kind).inc()


class ApiWriter:
    """The controller's writes, through the API server."""

    def __init__(self, api: client.ApiClient, events: EventRecorder) -> None:
        self._partitions = NodePartitions(api)
        self._pods = Pods(api)
        self._custom = client.CustomObjectsApi(api)
        self._api = api
        self._events = events
        self._releases = ThreadPoolExecutor(RELEASE_WORKERS, thread_name_prefix="release")

    def write_spec(self, node: str, spec: NodePartitionSpec,
                   current: NodePartition | None) -> bool:
        try:
            if current is None:
                self._partitions.create(NodePartition(metadata=ObjectMeta(name=node),
                                                      spec=spec))
            else:
                # The agent's status writes move resourceVersion all the time; what must not
                # have moved is the spec this plan was based on.
                fresh = self._partitions.get(node)
                if fresh is None or fresh.spec != current.spec:
                    log.info("NodePartition %s spec changed under the plan; planning again",
                             node)
                    return False
                self._partitions.write_spec(fresh.model_copy(update={"spec": spec}))
        except ApiException as exc:
            if exc.status in (404, 409):
                log.info("NodePartition %s changed under the plan (%s); planning again", node,
                         exc.status)
                return False
            raise
        return True

    def release_pod(self, pod: str, node: str, hostname: str, gated: bool,
                    seen: Mapping[str, Any] | None = None) -> None:
        """Pinned and ungated from a pool of its own: each release is a round trip (two when
        the pod changed since the cache saw it), and a burst of a thousand released one by
        one took minutes (bench/scale_bench.py). The
        loop's bookkeeping does not wait: a release the API server refuses (the pod went,
        or changed) leaves the pod gated, and it is planned again.

        A pod that never carried the gate cannot be pinned (Kubernetes lets a pod's node
        selector change only while it is gated): nothing is written, and its Event says so
        instead of claiming a pin. It was created before the chart's admission policy took
        effect, or in a namespace the policy skips; the scheduler places it where a slice
        shows, which may not be the node the plan made room on."""
        if not gated:
            namespace, name = pod.split("/", 1)
            self._events.record(
                kind="Pod", name=name, namespace=namespace, api_version="v1",
                reason="NotGated", message=f"room made on {node}, but the pod is not "
                f"gated ({GATE}), so it cannot be pinned there: the scheduler places it "
                "where a slice shows (created before the admission policy took effect, or "
                "in a namespace it skips)", dedupe_s=0)
            return
        self._releases.submit(self._release, pod, node, hostname, seen)

    def _release(self, pod: str, node: str, hostname: str,
                 seen: Mapping[str, Any] | None) -> None:
        namespace, name = pod.split("/", 1)
        try:
            released = self._pods.release(namespace, name, GATE,
                                          {"kubernetes.io/hostname": hostname}, seen=seen)
        except Exception:
            log.exception("releasing %s onto %s failed", pod, node)
            return
        if released:
            self._events.record(kind="Pod", name=name, namespace=namespace, api_version="v1",
                                reason="Released", message=f"pinned to {node}; its GPU "
                                "capacity is there", dedupe_s=0)

    def requeue_dra(self, device_class: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self._custom.patch_cluster_custom_object(
                "resource.k8s.io", "v1", "deviceclasses", device_class,
                {"metadata": {"annotations": {REQUEUED_ANNOTATION: stamp}}})
        except ApiException as exc:
            log.warning("touching DeviceClass %s to have the scheduler retry pods failed: "
                        "%s %s", device_class, exc.status, exc.reason)

    def release_to_dra(self, pod: str, selector: Mapping[str, str]) -> bool:
        namespace, name = pod.split("/", 1)
        released = self._pods.release(namespace, name, GATE, selector)
        if released:
            where = (" on nodes " + ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
                     if selector else "")
            self._events.record(
                kind="Pod", name=name, namespace=namespace, api_version="v1",
                reason="ReleasedToDra", message=f"handed to the scheduler through DRA{where}: "
                "it allocates a MIG placement, and the node makes the slice as the pod starts",
                dedupe_s=0)
        return released

    def pod_event(self, pod: str, reason: str, message: str, warning: bool) -> None:
        namespace, name = pod.split("/", 1)
        self._events.record(kind="Pod", name=name, namespace=namespace, api_version="v1",
                            reason=reason, message=message, warning=warning)

    def partition_event(self, node: str, reason: str, message: str, warning: bool) -> None:
        self._events.record(kind="NodePartition", name=node, api_version=API_VERSION,
                            reason=reason, message=message, warning=warning)

    def create_placeholder(self, body: Mapping[str, Any]) -> str | None:
        meta = body["metadata"]
        try:
            if body["kind"] == scaleup.PROVISIONING_REQUEST:
                key = self._provisioning_request(body)
            else:
                key = self._pods.create(body)
                self._pods.mark_unschedulable(
                    meta["namespace"], key.split("/", 1)[1],
                    "a Tessera scale-up placeholder: it stands for GPU capacity no node has, "
                    "and no scheduler binds it")
        except ApiException as exc:
            log.warning("could not create a scale-up %s: %s %s", body["kind"], exc.status,
                        exc.reason)
            return None
        ask = meta["annotations"].get(scaleup.ASK_ANNOTATION, "")
        log.info("scale-up: created %s %s asking %s", body["kind"], key, ask)
        if body["kind"] == scaleup.POD:
            self._events.record(kind="Pod", name=key.split("/", 1)[1],
                                namespace=meta["namespace"], api_version="v1",
                                reason="ScaleUpRequested", message="stands for GPU pods that "
                                f"fit on no node: {ask}", dedupe_s=0)
        return key

    def _provisioning_request(self, body: Mapping[str, Any]) -> str:
        """The request first, then its PodTemplate owned by it (deleted with it by the garbage
        collector): a crash between the two leaves a request the autoscaler fails, which the
        TTL removes, never a template nothing owns."""
        meta = body["metadata"]
        namespace = meta["namespace"]
        name = f"tessera-scaleup-{secrets.token_hex(4)}"
        request = {k: v for k, v in body.items() if k != "podTemplate"}
        request["metadata"] = {**meta, "name": name}
        request["spec"] = {**body["spec"], "podSets": [
            {**body["spec"]["podSets"][0], "podTemplateRef": {"name": name}}]}
        created = cast(dict[str, Any], self._custom.create_namespaced_custom_object(
            scaleup.PROVREQ_GROUP, scaleup.PROVREQ_VERSION, namespace, scaleup.PROVREQ_PLURAL,
            request))
        template = dict(body["podTemplate"])
        template["metadata"] = {**template["metadata"], "name": name, "ownerReferences": [{
            "apiVersion": request["apiVersion"], "kind": scaleup.PROVISIONING_REQUEST,
            "name": name, "uid": created["metadata"]["uid"]}]}
        raw: Any = template  # the client posts a plain dict as it is
        client.CoreV1Api(self._api).create_namespaced_pod_template(namespace, raw)
        return f"{namespace}/{name}"

    def delete_placeholder(self, kind: str, key: str, reason: str) -> None:
        namespace, name = key.split("/", 1)
        if kind == scaleup.POD:
            gone = self._pods.delete(namespace, name)
        else:
            try:
                self._custom.delete_namespaced_custom_object(
                    scaleup.PROVREQ_GROUP, scaleup.PROVREQ_VERSION, namespace,
                    scaleup.PROVREQ_PLURAL, name)
                gone = True
            except ApiException as exc:
                if exc.status != 404:
                    raise
                gone = False
        if gone:
            log.info("scale-up: deleted %s %s: %s", kind, key, reason)

    def policy_status(self, name: str, status: PartitionPolicyStatus) -> None:
        body = {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
        try:
            self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "partitionpolicies", name, body)
        except ApiException as exc:
            log.warning("could not write PartitionPolicy %s status: %s", name, exc.reason)


def serves_provisioning_requests(api: client.ApiClient) -> bool:
    """Whether the API server serves autoscaling.x-k8s.io/v1 ProvisioningRequests (Cluster
    Autoscaler's CRD), by discovery."""
    try:
        found = client.CustomObjectsApi(api).get_api_resources(scaleup.PROVREQ_GROUP,
                                                              scaleup.PROVREQ_VERSION)
    except ApiException:
        return False  # 404: the group is not served
    return any(r.name == scaleup.PROVREQ_PLURAL for r in (found.resources or []))


def build_registry(cache: ClusterCache, provisioning_requests: bool = False
                   ) -> kopf.OperatorRegistry:
    """kopf handlers that only feed the cache; every decision is the loop's."""
    registry = kopf.OperatorRegistry()

    def feeder(kind: str) -> Any:
        def handler(event: dict[str, Any], **_: Any) -> None:
            cache.put(kind, event.get("type") or "ADDED", event["object"])
        return handler

    kopf.on.event("", "v1", "pods", registry=registry)(feeder("pod"))
    kopf.on.event("", "v1", "nodes", registry=registry)(feeder("node"))
    kopf.on.event(GROUP, VERSION, "nodepartitions", registry=registry)(feeder("nodepartition"))
    kopf.on.event(GROUP, VERSION, "partitionpolicies", registry=registry)(
        feeder("partitionpolicy"))
    if provisioning_requests:
        kopf.on.event(scaleup.PROVREQ_GROUP, scaleup.PROVREQ_VERSION, scaleup.PROVREQ_PLURAL,
                      registry=registry)(feeder("provisioningrequest"))
    return registry


Lister = Callable[[], list[dict[str, Any]]]


def api_listers(api: client.ApiClient, provisioning_requests: bool = False
                ) -> tuple[tuple[str, Lister], ...]:
    """A full list of every kind the decision loop reads, as raw objects (as watches give)."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    raw: Any = api  # the client's serialiser is untyped

    def items(listed: Any) -> list[dict[str, Any]]:
        return list(cast(dict[str, Any], listed).get("items") or [])

    extra: tuple[tuple[str, Lister], ...] = ()
    if provisioning_requests:
        extra = (("provisioningrequest", lambda: items(custom.list_cluster_custom_object(
            scaleup.PROVREQ_GROUP, scaleup.PROVREQ_VERSION, scaleup.PROVREQ_PLURAL))),)
    return (
        *extra,
        ("pod", lambda: items(raw.sanitize_for_serialization(
            core.list_pod_for_all_namespaces()))),
        ("node", lambda: items(raw.sanitize_for_serialization(core.list_node()))),
        ("nodepartition", lambda: items(custom.list_cluster_custom_object(
            GROUP, VERSION, "nodepartitions"))),
        ("partitionpolicy", lambda: items(custom.list_cluster_custom_object(
            GROUP, VERSION, "partitionpolicies"))),
    )


def prime(cache: ClusterCache, listers: Sequence[tuple[str, Lister]]) -> None:
    """Fill the cache with a full list of every kind the loop reads, before it first ticks.

    The watches deliver their initial lists one kind at a time and in no promised order; a
    loop that ticked meanwhile could see waiting pods before the pods bound beside them, take
    their slices for free and hand one to a waiting pod that then can never be released (what
    a controller restart on a busy cluster did). The watches deliver the same objects again
    afterwards, which the cache takes as updates.
    """
    for kind, listing in listers:
        for item in listing():
            cache.put(kind, "ADDED", item)
    log.info("cache primed: %d pods, %d nodes, %d NodePartitions, %d PartitionPolicies",
             *(len(found) for found in cache.view()))


def prime_until_done(cache: ClusterCache, listers: Sequence[tuple[str, Lister]],
                     stop: threading.Event, synced: threading.Event,
                     first_delay: float = 1.0) -> None:
    """:func:`prime`, retried with backoff while the API server refuses; then ``synced``."""
    delay = first_delay
    while not stop.is_set():
        try:
            prime(cache, listers)
        except ApiException as exc:
            log.error("listing the cluster failed (%s %s); retrying in %.0f s", exc.status,
                      exc.reason, delay)
            stop.wait(delay)
            delay = min(delay * 2, 30.0)
            continue
        synced.set()
        return


def _loop(controller: Controller, elector: LeaderElector, metrics: ControllerMetrics,
          stop: threading.Event, tick_s: float) -> None:
    leading = False
    while not stop.is_set():
        if elector.is_leader():
            leading = True
            try:
                controller.tick()
            except ApiException as exc:
                metrics.record_error("api")
                log.error("API error in the decision loop: %s %s", exc.status, exc.reason)
            except Exception:
                metrics.record_error("internal")
                log.exception("decision loop failed")
        else:
            if leading:
                log.warning("no longer the leader: forgetting in-memory decisions")
                controller.reset()
            leading = False
            metrics.record_tick(0, False)
        controller.cache.changed.wait(tick_s)
        controller.cache.changed.clear()


def _connection(api: client.ApiClient) -> kopf.ConnectionInfo:
    cfg = api.configuration
    bearer = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    token = bearer.removeprefix("Bearer ").strip() if bearer else None
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        scheme="Bearer" if token else None, token=token,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file)


def run(api: client.ApiClient, *, namespace: str, settings: ControllerSettings,
        metrics_port: int = 0, tick_s: float = 0.2, identity: str | None = None,
        lease_name: str = "tessera-controller", kubeconfig: str | None = None) -> None:
    cache = ClusterCache()
    metrics = ControllerMetrics()
    provreqs = serves_provisioning_requests(api)
    if provreqs:
        log.info("the API server serves ProvisioningRequests: scale-up policies with method "
                 "auto ask through them")
    settings = replace(settings, provisioning_requests=provreqs)
    writer = ApiWriter(api, EventRecorder(api, "controller", workers=4))
    logging.getLogger("kopf").setLevel(logging.WARNING)  # one line per watch event otherwise
    controller = Controller(cache, writer, settings, metrics=metrics)
    me = identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(api, namespace, lease_name, me)
    stop = threading.Event()
    registry = build_registry(cache, provreqs)

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> Any:
        # A registry of our own gets none of kopf's default login handlers; log in with the
        # same credentials as our own client (kubeconfig or service account).
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
            return kopf.login_via_client(**kwargs)  # refreshes the projected token
        return _connection(api)

    @kopf.on.startup(registry=registry)
    def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.enabled = False
        settings.watching.server_timeout = 120

    synced = threading.Event()

    def decide() -> None:
        prime_until_done(cache, api_listers(api, provreqs), stop, synced)
        _loop(controller, elector, metrics, stop, tick_s)

    worker = threading.Thread(target=decide, name="decision-loop", daemon=True)
    if metrics_port:
        # Ready once the cache holds the whole cluster; live while the decision loop runs.
        HealthServer(metrics_port, metrics.registry, live=worker.is_alive,
                     ready=synced.is_set)
    elector.start()
    worker.start()
    try:
        kopf.run(registry=registry, clusterwide=True, standalone=True)
    finally:
        stop.set()
        worker.join(5)
        elector.stop()
