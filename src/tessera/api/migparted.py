"""Import NVIDIA mig-parted configs as static PartitionPolicies.

mig-parted's file (``version: v1``, ``mig-configs: {NAME: [{devices, device-filter,
mig-enabled, mig-devices}]}``) is what admins already keep; Tessera reads it strictly, as
mig-parted does (unknown fields and versions are refused), and adds what mig-parted lacks:
placements, computed per card when the policy is applied. Counts are checked here against
every catalogue model the entry's device filter names, so a layout that cannot fit is refused
at import, naming the config, the entry and the profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api.v1alpha1 import (
    LabelSelector,
    ObjectMeta,
    PartitionPolicy,
    PartitionPolicySpec,
    StaticDeviceConfig,
)
from tessera.core import catalogue, layout
from tessera.core.errors import InvalidInputError

__all__ = ["Imported", "policy_from_mig_parted"]

_ENTRY_FIELDS = {"devices", "device-filter", "mig-enabled", "mig-devices"}


def _pci_ids(value: Any, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InvalidInputError(where, "expected a PCI id (0xDEVVEND) or a list of them")
    ids = []
    for item in items:
        text = item.split(":")[0].strip()
        try:
            ids.append(f"0x{int(text, 16):08X}")
        except ValueError as exc:
            raise InvalidInputError(where, f"{item!r} is not a PCI id like 0x20B010DE") from exc
    return ids


def _known_filters(filters: list[str], where: str, strict: bool) -> tuple[list[str], list[str]]:
    """Split a device filter into the ids the catalogue knows and those it lacks; ``strict``
    refuses the lacking ones, as mig-parted itself would on such a card."""
    known = [f for f in filters if catalogue.find_model("", int(f, 16)) is not None]
    lacking = [f for f in filters if f not in known]
    if lacking and strict:
        raise InvalidInputError(
            f"{where}.device-filter", f"{', '.join(lacking)}: no MIG-capable GPU in the "
            "catalogue has this PCI device id (tessera catalogue lists them); without "
            "--strict the entries for known cards are imported and these are skipped")
    return known, lacking


def _entry(raw: Any, where: str, strict: bool) -> tuple[StaticDeviceConfig | None, list[str]]:
    """One device entry and the device ids it skips; None when it names only unknown cards
    (keeping it without its filter would widen it to every card)."""
    if not isinstance(raw, Mapping):
        raise InvalidInputError(where, "expected a mapping with devices and mig-enabled")
    unknown = sorted(set(raw) - _ENTRY_FIELDS)
    if unknown:
        raise InvalidInputError(f"{where}.{unknown[0]}", "unknown field", sorted(_ENTRY_FIELDS))
    devices = raw.get("devices", "all")
    if devices == "all":
        indices: list[int] = []
    elif isinstance(devices, list) and all(isinstance(d, int) and d >= 0 for d in devices):
        indices = list(devices)
    else:
        raise InvalidInputError(f"{where}.devices", f"{devices!r}: expected 'all' or a list "
                                "of GPU indices")
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise InvalidInputError(f"{where}.mig-enabled", "required: true or false")
    counts = raw.get("mig-devices") or {}
    if not isinstance(counts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in counts.items()):
        raise InvalidInputError(f"{where}.mig-devices", "expected {profile: count}")
    if counts and not enabled:
        raise InvalidInputError(f"{where}.mig-devices", "mig-devices needs mig-enabled: true")
    lacking: list[str] = []
    filters: list[str] = []
    if "device-filter" in raw:
        named = _pci_ids(raw["device-filter"], f"{where}.device-filter")
        filters, lacking = _known_filters(named, where, strict)
        if not filters:
            return None, lacking
    known = {name for m in catalogue.models() for p in m.profiles
             for name in (p.name, *p.aliases)}
    for name in counts:
        if name not in known:
            raise InvalidInputError(f"{where}.mig-devices.{name}", "no supported GPU has "
                                    "this profile", sorted(known))
    models = {m for f in filters if (m := catalogue.find_model("", int(f, 16))) is not None}
    for model in sorted(models, key=lambda m: m.name):
        layout.layout_for_counts(model, counts, field=f"{where}.mig-devices")
    return StaticDeviceConfig(devices=indices, device_filter=filters, mig_enabled=enabled,
                              mig_devices=dict(counts)), lacking


@dataclass(frozen=True)
class Imported:
    """A config imported as a policy, and the device ids whose entries it left out."""

    policy: PartitionPolicy
    skipped_device_ids: tuple[str, ...]
    """PCI ids (``0xDEVVEND``) the catalogue lacks, in the order the file names them."""


def policy_from_mig_parted(document: Any, config: str | None, name: str | None = None,
                           node_selector: Mapping[str, str] | None = None,
                           strict: bool = False) -> Imported:
    """The static PartitionPolicy for one named config of a mig-parted file.

    Entries for cards the catalogue lacks are skipped and reported (``strict`` refuses them):
    NVIDIA's default file holds every card it knows in one config, and one unknown card must
    not keep an admin's A100s from importing. A config left with no entry is refused."""
    if not isinstance(document, Mapping):
        raise InvalidInputError("(file)", "expected a mig-parted config: version and "
                                "mig-configs")
    unknown = sorted(set(document) - {"version", "mig-configs"})
    if unknown:
        raise InvalidInputError(unknown[0], "unknown field", ["version", "mig-configs"])
    if document.get("version") != "v1":
        raise InvalidInputError("version", f"{document.get('version')!r} is not supported",
                                ["v1"])
    configs = document.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise InvalidInputError("mig-configs", "expected at least one named config")
    if config is None:
        if len(configs) != 1:
            raise InvalidInputError("--config", "the file has several configs; name one",
                                    sorted(configs))
        config = next(iter(configs))
    if config not in configs:
        raise InvalidInputError("--config", f"no config {config!r}", sorted(configs))
    entries = configs[config]
    if not isinstance(entries, list) or not entries:
        raise InvalidInputError(f"mig-configs.{config}", "expected a list of device entries")
    static: list[StaticDeviceConfig] = []
    skipped: list[str] = []
    for index, raw in enumerate(entries):
        entry, lacking = _entry(raw, f"mig-configs.{config}[{index}]", strict)
        skipped += [pci for pci in lacking if pci not in skipped]
        if entry is not None:
            static.append(entry)
    if not static:
        raise InvalidInputError(
            f"mig-configs.{config}", f"every entry is for a card the catalogue lacks "
            f"({', '.join(skipped)}); nothing to import")
    policy_name = name or config.replace(".", "-").replace("_", "-").lower()
    policy = PartitionPolicy(
        metadata=ObjectMeta(name=policy_name, annotations={
            "tessera.dev/imported-from": f"mig-parted config {config}"}),
        spec=PartitionPolicySpec(
            node_selector=LabelSelector(match_labels=dict(node_selector or {})),
            mode="static", static=static),
    )
    return Imported(policy, tuple(skipped))
