"""The reservation flags of every command that plans as the controller does.

How much capacity the planner holds back for pods that wait is a trade, and the right choice
depends on the workload. A reservation lets a large pod (a ``7g.80gb``, eight GPUs of a node)
start behind a stream of small ones, at the cost of GPUs held idle while they drain, which the
small pods pay in waits. bench/README.md measures both sides on the simulation grid:

- gpushare40, 64 GPUs, 100% load: with no reservation the multi-GPU pods waited 41 hours on
  average against 17 with one, and the cluster served 8 points less compute;
- gpushare40, 256 GPUs, 100% load: no reservation kept the p95 wait at 19 s (first fit: 21 s)
  against 108 s with one.

So an admin chooses, after measuring the choice on their own trace with ``tessera simulate``.
``tessera controller`` plans with these flags; ``tessera plan`` and ``tessera status`` preview
its plans with them. Defining them once here gives the what-if, the preview and the live
controller one meaning and one validation.
"""

from __future__ import annotations

import argparse
import math
from typing import TypedDict

from tessera.controller.loop import ControllerSettings
from tessera.core.errors import InvalidInputError

__all__ = ["Reservations", "add", "given", "settings"]


class Reservations(TypedDict):
    """The :class:`ControllerSettings` fields the flags set."""

    reservations: int
    reserve_after_waits: float


def add(parser: argparse.ArgumentParser, *, same_as: str = "") -> None:
    """Add ``--reservations`` and ``--reserve-after-waits``; ``same_as`` tells a preview's
    user to give the controller's values (e.g. "as the controller's")."""
    suffix = f" ({same_as})" if same_as else ""
    parser.add_argument(
        "--reservations", type=int, metavar="N", default=None,
        help="waiting pods per plan that may hold GPUs back from later pods, so that the "
        f"GPUs drain for them (default {ControllerSettings.reservations}); 0: none (no GPU "
        "is held idle, and a large pod starts only when enough capacity happens to free at "
        f"once){suffix}")
    parser.add_argument(
        "--reserve-after-waits", type=float, metavar="K", default=None,
        help="a waiting pod may reserve only after waiting K times the median wait of the "
        f"pods lately placed (default {ControllerSettings.reserve_after_waits:g}); 0: at "
        f"once{suffix}")


def settings(args: argparse.Namespace) -> Reservations:
    """The flags' values, checked: each refusal names its flag and the values it accepts."""
    count: int = ControllerSettings.reservations if args.reservations is None \
        else args.reservations
    if count < 0:
        raise InvalidInputError("--reservations", f"{count}: give 0 or more (0: no pod "
                                f"reserves GPUs; {ControllerSettings.reservations}: the "
                                "default)")
    given: float | None = args.reserve_after_waits
    factor = ControllerSettings.reserve_after_waits if given is None else given
    if not math.isfinite(factor) or factor < 0:
        raise InvalidInputError("--reserve-after-waits", f"{factor}: give a number of 0 or "
                                "more (0: a pod reserves as soon as it finds no room; "
                                f"{ControllerSettings.reserve_after_waits:g}: the default)")
    return Reservations(reservations=count, reserve_after_waits=factor)


def given(args: argparse.Namespace) -> bool:
    """Whether either flag was given: a command that cannot honour them refuses them."""
    return args.reservations is not None or args.reserve_after_waits is not None
