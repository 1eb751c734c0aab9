"""``tessera dev sim``: create, inspect and drive a simulated node's GPUs from outside.

The state file is what ``--nvml sim:FILE`` points the agent and the device plugin at. These
commands do to it what happens to real cards without any NVML call: CUDA jobs start and stop,
the driver reports an Xid, a card falls off the bus, a card is reset.
"""

from __future__ import annotations

import argparse
import re
import signal
import threading
from pathlib import Path
from typing import Any

from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.nvml.sim import operations
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, load_state_file, write_new_state_file

_GPUS = re.compile(r"^(?:(\d+)x)?(.+)$")


def parse_gpus(text: str) -> list[str]:
    """``8xA100-SXM4-80GB,2xH100-80GB`` -> one catalogue model name per card."""
    models: list[str] = []
    for part in text.split(","):
        match = _GPUS.match(part.strip())
        if not match or not match.group(2):
            raise InvalidInputError("--gpus", f"{part!r} is not COUNTxMODEL, e.g. 8xA100-SXM4-80GB")
        count = int(match.group(1) or 1)
        if count < 1:
            raise InvalidInputError("--gpus", f"{part!r}: the count must be at least 1")
        models += [catalogue.card(match.group(2), field_name="--gpus").name] * count
    return models


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "sim", help="simulated GPU node state files",
        description="Create, inspect and drive a simulated node's GPUs (an NVML simulator state "
        "file, shared by every process given --nvml sim:FILE).")
    tools = parser.add_subparsers(dest="sim_command", required=True, metavar="ACTION")

    init = tools.add_parser("init", help="create a state file with idle, empty cards")
    init.add_argument("file")
    init.add_argument("--gpus", required=True, help="COUNTxMODEL[,COUNTxMODEL...]")
    init.add_argument("--node", default="sim-node", help="node name (makes UUIDs unique)")
    init.add_argument("--no-mig", action="store_true", help="start with MIG mode disabled")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(run=run_init)

    show = tools.add_parser("show", help="print the cards as nvidia-smi -L does")
    show.add_argument("file")
    show.add_argument("--details", action="store_true",
                      help="also MIG mode, placements and processes")
    show.set_defaults(run=run_show)

    process = tools.add_parser("process", help="start or stop a CUDA job on a device")
    process.add_argument("action", choices=["add", "remove"])
    process.add_argument("file")
    process.add_argument("--device", required=True, help="GPU-... or MIG-... UUID")
    process.add_argument("--pid", required=True, type=int)
    process.add_argument("--used-mib", type=int, default=0)
    process.add_argument("--mps", action="store_true", help="an MPS client")
    process.set_defaults(run=run_process)

    xid = tools.add_parser("xid", help="inject an Xid event on a device")
    xid.add_argument("file")
    xid.add_argument("--device", required=True, help="GPU-... or MIG-... UUID")
    xid.add_argument("--code", required=True, type=int)
    xid.set_defaults(run=run_xid)

    lose = tools.add_parser("lose", help="make a GPU fall off the bus (Xid 79)")
    lose.add_argument("file")
    lose.add_argument("--gpu", required=True, type=int)
    lose.set_defaults(run=run_lose)

    reset = tools.add_parser("reset", help="reset a GPU: instances and processes are gone")
    reset.add_argument("file")
    reset.add_argument("--gpu", required=True, type=int)
    reset.set_defaults(run=run_reset)

    serve = tools.add_parser(
        "serve", help="serve the cards to the simulated libnvidia-ml.so.1 (make nvml-lib)",
        description="Answer NVML calls from programs that load the simulated libnvidia-ml.so.1 "
        "(the agent in its image, nvidia-smi-like tools, NVIDIA's mig-parted and device "
        "plugin), on a Unix socket, until interrupted. The library finds the socket at "
        "$TESSERA_NVML_SIM_SOCKET, else /var/lib/tessera-sim/nvml.sock.")
    serve.add_argument("file")
    serve.add_argument("--socket", default="/var/lib/tessera-sim/nvml.sock",
                       help="where to listen (default: %(default)s)")
    serve.set_defaults(run=run_serve)


def run_init(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if path.exists() and not args.force:
        raise InvalidInputError("FILE", f"{path} exists; pass --force to replace it")
    state = new_node_state(args.node, parse_gpus(args.gpus), mig=not args.no_mig)
    write_new_state_file(path, state)
    print(operations.nvidia_smi_list(state))
    return 0


def run_show(args: argparse.Namespace) -> int:
    state = load_state_file(args.file)
    print(operations.nvidia_smi_list(state))
    if args.details:
        print(operations.describe_details(state))
    return 0


def run_process(args: argparse.Namespace) -> int:
    with FileStore(args.file).mutate() as state:
        if args.action == "add":
            operations.add_process(state, args.device, args.pid, args.used_mib, args.mps)
        else:
            operations.remove_process(state, args.device, args.pid)
    return 0


def run_xid(args: argparse.Namespace) -> int:
    with FileStore(args.file).mutate() as state:
        operations.inject_xid(state, args.device, args.code)
    return 0


def run_lose(args: argparse.Namespace) -> int:
    with FileStore(args.file).mutate() as state:
        operations.lose_gpu(state, args.gpu)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    load_state_file(args.file)  # a missing or bad file is refused here, naming the fix
    stop = threading.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda *_: stop.set())
    with NvmlServer(args.file, args.socket):
        print(f"serving {args.file} on {args.socket}", flush=True)
        stop.wait()
    return 0


def run_reset(args: argparse.Namespace) -> int:
    with FileStore(args.file).mutate() as state:
        operations.reset_gpu(state, args.gpu)
    return 0
