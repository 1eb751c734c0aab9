"""``tessera``: sub-commands are small modules; this one parses, dispatches and reports errors.

Every deliberate failure is a :class:`~tessera.core.errors.TesseraError` whose message names the
field and the fix; it is printed as one line and the exit status is 2, like argparse's own usage
errors, so scripts can tell "you asked for something wrong" from a crash.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tessera import __version__
from tessera.cli import (
    agent_cmd,
    catalogue_cmd,
    controller_cmd,
    dev_cmd,
    plan_cmd,
    policy_cmd,
    simulate_cmd,
    status_cmd,
)
from tessera.core.errors import TesseraError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Fractional-GPU sharing for Kubernetes: dynamic MIG and MPS partitioning.",
    )
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    catalogue_cmd.register(commands)
    plan_cmd.register(commands)
    status_cmd.register(commands)
    simulate_cmd.register(commands)
    agent_cmd.register(commands)
    controller_cmd.register(commands)
    policy_cmd.register(commands)
    dev_cmd.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
    except TesseraError as exc:
        print(f"tessera: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    return result


def kubectl_main() -> int:
    """``kubectl tessera ...``: kubectl runs ``kubectl-tessera`` from PATH as a plugin."""
    return main(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
