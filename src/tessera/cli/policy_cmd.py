"""``tessera policy import-mig-parted FILE``: a mig-parted config as a static PartitionPolicy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tessera.api.migparted import policy_from_mig_parted
from tessera.core.errors import InvalidInputError


def register(commands: Any) -> None:
    parser = commands.add_parser("policy", help="PartitionPolicy tools")
    tools = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    imported = tools.add_parser(
        "import-mig-parted", help="print a static PartitionPolicy from a mig-parted config",
        description="Read an NVIDIA mig-parted config file and print the PartitionPolicy "
        "(mode static) for one of its configs; apply it with kubectl apply -f -.")
    imported.add_argument("file")
    imported.add_argument("--config", help="which mig-configs entry (default: the only one)")
    imported.add_argument("--name", help="the policy's name (default: from the config)")
    imported.add_argument("--node-selector", default="",
                          help="label=value[,label=value]: the nodes it applies to")
    imported.add_argument("--strict", action="store_true",
                          help="refuse entries for GPUs the catalogue lacks (default: skip "
                          "them and name their device ids on stderr)")
    imported.set_defaults(run=run_import)


def _selector(text: str) -> dict[str, str]:
    labels = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise InvalidInputError("--node-selector", f"{part!r} is not label=value")
        labels[key] = value
    return labels


def run_import(args: argparse.Namespace) -> int:
    try:
        document = yaml.safe_load(Path(args.file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInputError("FILE", f"cannot read {args.file}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InvalidInputError("FILE", f"{args.file} is not YAML: {exc}") from exc
    if isinstance(document, Mapping) and "data" in document and "config.yaml" in (
            document.get("data") or {}):
        document = _from_config_map(document, args.file)
    imported = policy_from_mig_parted(document, args.config, args.name,
                                      _selector(args.node_selector), strict=args.strict)
    if imported.skipped_device_ids:
        print(f"tessera: skipped the entries for {', '.join(imported.skipped_device_ids)}: "
              "no MIG-capable GPU in the catalogue has these PCI device ids "
              "(--strict refuses them)", file=sys.stderr)
    print(yaml.safe_dump(imported.policy.to_wire(), sort_keys=False), end="")
    return 0


def _from_config_map(document: Mapping[str, Any], path: str) -> Any:
    """The mig-parted file inside a ConfigMap, as the GPU Operator ships it
    (``data: {config.yaml: ...}``), so ``kubectl get cm -o yaml`` output imports directly."""
    try:
        return yaml.safe_load(document["data"]["config.yaml"])
    except yaml.YAMLError as exc:
        raise InvalidInputError("data.config.yaml", f"{path}: not YAML: {exc}") from exc
