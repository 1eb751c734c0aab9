"""``tessera catalogue [MODEL] [--json]``: what every supported card can be split into."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tessera.core import catalogue


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "catalogue",
        help="print the MIG profile catalogue",
        description="Print every supported GPU model's MIG profiles, placements and resource "
        "names. Rows marked '*' hold values not yet verified on a real card.",
    )
    parser.add_argument("model", nargs="?", help="a model or product name (default: all)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON (shape: see README)")
    output.add_argument("--markdown", action="store_true",
                        help="print the README's supported-models table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cards: list[catalogue.Card] = (
        [catalogue.card(args.model)] if args.model
        else [*catalogue.models(), *catalogue.whole_gpus()])
    chosen = [c for c in cards if isinstance(c, catalogue.GpuModel)]
    whole = [c for c in cards if isinstance(c, catalogue.WholeGpu)]
    if args.json:
        print(json.dumps(catalogue.describe(chosen, whole), indent=2))
        return 0
    if args.markdown:
        print(render_markdown(chosen, whole), end="")
        return 0
    blocks = [render_model(model) for model in chosen]
    if whole:
        blocks.append(render_whole(whole))
    print("\n\n".join(blocks))
    return 0


def render_whole(cards: list[catalogue.WholeGpu]) -> str:
    """Cards without MIG: shared whole, by MPS or time-slicing."""
    rows = [["card", "NVML product names", "PCI ids", "arch", "MiB", "MPS clients"]]
    for whole in cards:
        rows.append([
            whole.name + ("" if not whole.unverified else "*"),
            ", ".join(whole.product_names),
            ", ".join(f"0x{pci >> 16:04X}" for pci in whole.pci_device_ids),
            whole.architecture, str(whole.total_memory_mib),
            str(catalogue.MPS_MAX_CLIENTS) if whole.mps_supported else "-",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["Without MIG (whole: nvidia.com/gpu; MPS shares: nvidia.com/gpu.shared):"]
    lines += ["  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
              for row in rows]
    return "\n".join(lines)


_COLUMNS = ("profile", "id", "const", "CxM", "MiB", "max", "SMs", "CE/DEC/ENC/JPG/OFA",
            "placements", "resource")


def render_model(model: catalogue.GpuModel) -> str:
    caveat = f"; unverified: {', '.join(sorted(model.unverified))}" if model.unverified else ""
    header = (
        f"{model.name} ({', '.join(model.product_names)}): {model.total_memory_mib} MiB, "
        f"{model.memory_slices} memory / {model.compute_slices} compute slices, "
        f"{model.architecture}{caveat}"
    )
    rows = [list(_COLUMNS)]
    for p in model.profiles:
        e = p.engines
        rows.append([
            p.name + ("" if p.verified else "*"),
            str(p.profile_id),
            str(p.nvml_constant),
            f"{p.compute_slices}x{p.memory_slices}",
            str(p.memory_mib),
            str(p.max_count),
            str(p.sm_count),
            f"{e.copy}/{e.decoders}/{e.encoders}/{e.jpeg}/{e.ofa}",
            "{" + ",".join(str(s) for s in p.starts) + f"}}:{p.memory_slices}",
            p.resource_name,
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [header]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    unverified = [p for p in model.profiles if not p.verified]
    if unverified:
        fields = sorted({f for p in unverified for f in p.unverified})
        lines.append(f"  * not verified on a real card: {', '.join(fields)}")
    return "\n".join(lines)


def _memory(mib: int) -> str:
    return f"{mib} MiB"


def render_markdown(models: list[catalogue.GpuModel],
                    whole: list[catalogue.WholeGpu] | None = None) -> str:
    """The README's supported-models table and the values still unverified, per model.

    The README embeds this output between markers and a test compares the two, so the table
    cannot drift from the catalogue it describes."""
    lines = [
        "| model | NVML product names | PCI device ids | arch | memory | MIG profiles |",
        "|---|---|---|---|---|---|",
    ]
    for model in models:
        ids = ", ".join(f"0x{pci >> 16:04X}" for pci in model.pci_device_ids)
        names = ", ".join(model.product_names)
        profiles = ", ".join(f"`{p.name}`" for p in model.profiles)
        lines.append(f"| {model.name} | {names} | {ids} | {model.architecture} | "
                     f"{_memory(model.total_memory_mib)} | {profiles} |")
    if whole:
        lines += ["", "Without MIG (shared whole: MPS shares `nvidia.com/gpu.shared`, or the "
                  "card as `nvidia.com/gpu`):", "",
                  "| card | NVML product names | PCI device ids | arch | memory |",
                  "|---|---|---|---|---|"]
        for card in whole:
            ids = ", ".join(f"0x{pci >> 16:04X}" for pci in card.pci_device_ids)
            lines.append(f"| {card.name} | {', '.join(card.product_names)} | {ids} | "
                         f"{card.architecture} | {_memory(card.total_memory_mib)} |")
    lines += ["", "Values not yet read off a real card (`*` in `tessera catalogue`):", ""]
    for model in models:
        if model.verified:
            lines.append(f"- **{model.name}**: none.")
            continue
        parts = []
        if model.unverified:
            parts.append(f"card-wide: {', '.join(sorted(model.unverified))}")
        by_fields: dict[tuple[str, ...], list[str]] = {}
        for profile in model.profiles:
            own = tuple(sorted(profile.unverified - model.unverified))
            if own:
                by_fields.setdefault(own, []).append(profile.name)
        for fields, marked in by_fields.items():
            which = "every profile" if len(marked) == len(model.profiles) else ", ".join(marked)
            parts.append(f"{', '.join(fields)} of {which}")
        lines.append(f"- **{model.name}**: {'; '.join(parts)}.")
    for card in whole or []:
        lines.append(f"- **{card.name}**: " + (", ".join(sorted(card.unverified)) + "."
                                                if card.unverified else "none."))
    return "\n".join(lines) + "\n"
