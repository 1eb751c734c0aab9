"""NodePartition reads, writes and watches, as :mod:`tessera.api.v1alpha1` models.

Status is written through the ``status`` subresource (the agent's RBAC allows only that), as a
merge patch carrying the whole status, so a concurrent spec change by the controller is never
overwritten and the API server's ``observedGeneration`` check stays meaningful.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, cast

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tessera.api.v1alpha1 import (
    GROUP,
    VERSION,
    NodePartition,
    NodePartitionSpec,
    NodePartitionStatus,
    ObjectMeta,
)

__all__ = ["NodePartitions"]

PLURAL = "nodepartitions"
log = logging.getLogger(__name__)


class NodePartitions:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = client.CustomObjectsApi(api)

    def get(self, name: str) -> NodePartition | None:
        try:
            raw = self._api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return NodePartition.model_validate(raw)

    def list(self) -> list[NodePartition]:
        raw = cast(dict[str, Any], self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL))
        return [NodePartition.model_validate(item) for item in raw.get("items", [])]

    def ensure(self, name: str) -> NodePartition:
        """The node's NodePartition, created empty (leave every GPU as it is) if missing."""
        found = self.get(name)
        if found is not None:
            return found
        body = NodePartition(metadata=ObjectMeta(name=name), spec=NodePartitionSpec())
        try:
            raw = self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body.to_wire())
        except ApiException as exc:
            if exc.status != 409:  # someone (the controller) created it first
                raise
            again = self.get(name)
            assert again is not None
            return again
        log.info("created NodePartition %s", name)
        return NodePartition.model_validate(raw)

    def write_spec(self, partition: NodePartition) -> NodePartition:
        """Replace the spec, guarded by resourceVersion (optimistic concurrency)."""
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": partition.metadata.resource_version},
            "spec": partition.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }
        raw = self._api.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, partition.metadata.name, patch)
        return NodePartition.model_validate(raw)

    def create(self, partition: NodePartition) -> NodePartition:
        raw = self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, partition.to_wire())
        return NodePartition.model_validate(raw)

    def write_status(self, name: str, status: NodePartitionStatus) -> NodePartition:
        body = {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
        raw = self._api.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, body)
        return NodePartition.model_validate(raw)

    def watch_all(self, resource_version: str | None, timeout_s: int = 60
                  ) -> Iterator[tuple[str, str, NodePartition | None]]:
        """(event type, resourceVersion, object or None if deleted) for every NodePartition,
        until the server closes the watch (then call again from the last resourceVersion)."""
        stream = watch.Watch()
        kwargs: dict[str, Any] = {"timeout_seconds": timeout_s}
        if resource_version:
            kwargs["resource_version"] = resource_version
        try:
            for event in stream.stream(self._api.list_cluster_custom_object, GROUP, VERSION,
                                       PLURAL, **kwargs):
                kind, raw = event["type"], event["object"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield (kind, raw["metadata"]["resourceVersion"],
                           None if kind == "DELETED" else NodePartition.model_validate(raw))
        finally:
            stream.stop()

    def watch(self, name: str, resource_version: str | None,
              timeout_s: int = 60) -> Iterator[tuple[str, NodePartition]]:
        """Events for one NodePartition until the server closes the watch (then call again)."""
        stream = watch.Watch()
        kwargs: dict[str, Any] = {"field_selector": f"metadata.name={name}",
                                  "timeout_seconds": timeout_s}
        if resource_version:
            kwargs["resource_version"] = resource_version
        try:
            for event in stream.stream(self._api.list_cluster_custom_object, GROUP, VERSION,
                                       PLURAL, **kwargs):
                kind = event["type"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, NodePartition.model_validate(event["object"])
        finally:
            stream.stop()
