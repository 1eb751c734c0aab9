"""Which Xid errors make a device unhealthy: NVIDIA's rule, made configurable.

NVIDIA's device plugin marks a device unhealthy on any critical Xid except a fixed list of
Xids that are caused by the application rather than the GPU (a page fault in user code, a
graphics exception...). We keep that default so a node behaves the same under Tessera, and
accept the same two settings as NVIDIA's ``DP_DISABLE_HEALTHCHECKS`` /
``DP_ENABLE_HEALTHCHECKS`` environment variables. Unlike NVIDIA's plugin, recovery exists:
the agent clears the mark with :meth:`Inventory.set_health` once the GPU is healthy again.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Final

from tessera.core.errors import InvalidInputError
from tessera.kubelet.inventory import Inventory

NVIDIA_IGNORED_XIDS: Final = MappingProxyType({
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    68: "Video processor exception",
    109: "Context Switch Timeout Error",
})
"""Xids NVIDIA's k8s-device-plugin ignores (application faults, not GPU faults)."""


@dataclasses.dataclass(frozen=True)
class XidFilter:
    """Decides whether an Xid event should mark its device unhealthy."""

    ignored: frozenset[int] = frozenset(NVIDIA_IGNORED_XIDS)
    """Xids that never mark a device unhealthy."""
    forced: frozenset[int] = frozenset()
    """Xids that always do, even if ignored or if checks are disabled."""
    disabled: bool = False
    """No Xid marks a device unhealthy except the forced ones."""

    def is_critical(self, xid: int) -> bool:
        """True if this Xid should mark the device it hit unhealthy."""
        if xid in self.forced:
            return True
        return not self.disabled and xid not in self.ignored

    @classmethod
    def from_settings(cls, disable: str | None = None, enable: str | None = None) -> XidFilter:
        """Build from NVIDIA-style settings.

        ``disable``: ``"all"`` or ``"xids"`` turns Xid checks off; otherwise a comma list of
        extra Xids to ignore. ``enable``: a comma list of Xids that always count, overriding
        both the default list and ``disable``.
        """
        disabled = False
        extra: frozenset[int] = frozenset()
        if disable and disable.strip().lower() in {"all", "xids"}:
            disabled = True
        elif disable:
            extra = _parse_xids("disable_healthchecks", disable)
        forced = _parse_xids("enable_healthchecks", enable) if enable else frozenset()
        return cls(ignored=frozenset(NVIDIA_IGNORED_XIDS) | extra, forced=forced,
                   disabled=disabled)


def _parse_xids(field: str, text: str) -> frozenset[int]:
    xids = set()
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            continue
        if not token.isdigit():
            raise InvalidInputError(field, f"{token!r} is not an Xid number",
                                    choices=("all", "xids", "comma list of Xid numbers"))
        xids.add(int(token))
    return frozenset(xids)


def record_xid(inventory: Inventory, uuid: str, xid: int, xid_filter: XidFilter) -> bool:
    """Apply one Xid event to the inventory; True if it marked something unhealthy.

    ``uuid`` is the MIG UUID when the event is attributable to one MIG device, else the GPU
    UUID (which then covers every MIG device and MPS share on that GPU).
    """
    if not xid_filter.is_critical(xid):
        return False
    inventory.set_health(uuid, healthy=False, reason=f"Xid {xid}")
    return True
