"""The README's table of modelled NVML calls ("Testing on a real GPU"), read for the tests that
check each client's column against the calls the simulator saw it make."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- nvml-calls:begin -->", "<!-- nvml-calls:end -->"
COLUMNS = ("tessera", "mig-parted", "device-plugin", "gpu")
"""The table's columns after the call's name: Tessera's agent, nvidia-mig-parted, NVIDIA's
device plugin, and ``pytest -m gpu`` on a real card."""


def rows() -> dict[str, set[str]]:
    """Each call in the table, with the columns ticked for it."""
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text, f"README lacks {BEGIN}"
    assert END in text, f"README lacks {END}"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    found: dict[str, set[str]] = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        found[name] = {column for column, cell in zip(COLUMNS, cells[1:], strict=True) if cell}
    return found


def documented(client: str) -> set[str]:
    """The calls the table says ``client`` makes."""
    return {name for name, clients in rows().items() if client in clients}
