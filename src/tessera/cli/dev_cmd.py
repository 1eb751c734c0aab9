"""``tessera dev``: tools for tests and demos (simulated GPUs, the local test cluster)."""

from __future__ import annotations

from typing import Any

from tessera.cli import dev_cluster_cmd, dev_sim_cmd


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "dev", help="tools for tests and demos",
        description="Tools for tests and demos: simulated GPU nodes and the local test cluster.")
    dev_commands = parser.add_subparsers(dest="dev_command", required=True, metavar="TOOL")
    dev_sim_cmd.register(dev_commands)
    dev_cluster_cmd.register(dev_commands)
