"""The README's generated parts match what they describe."""

from __future__ import annotations

from pathlib import Path

from tessera.cli.catalogue_cmd import render_markdown
from tessera.core import catalogue
from tessera.nvml.sim import abi
from tests._nvml_calls import rows

README = Path(__file__).resolve().parents[1] / "README.md"


def _between(text: str, begin: str, end: str) -> str:
    assert begin in text, f"README lacks the marker {begin}"
    assert end in text, f"README lacks the marker {end}"
    return text.split(begin, 1)[1].split(end, 1)[0].lstrip("\n")


def test_the_supported_models_table_is_the_catalogue_s() -> None:
    embedded = _between(README.read_text(encoding="utf-8"), "<!-- catalogue:begin -->",
                        "<!-- catalogue:end -->")
    expected = render_markdown(list(catalogue.models()), list(catalogue.whole_gpus()))
    assert embedded == expected, (
        "README's supported-models table is stale: paste the output of "
        "`tessera catalogue --markdown` between its catalogue markers")


def test_every_model_and_every_unverified_model_is_listed() -> None:
    table = render_markdown(list(catalogue.models()), list(catalogue.whole_gpus()))
    for model in catalogue.models():
        assert f"| {model.name} |" in table
        assert f"- **{model.name}**: " + ("none." if model.verified else "") in table
    for card in catalogue.whole_gpus():
        assert f"| {card.name} |" in table
        assert f"- **{card.name}**: " in table


def test_the_nvml_calls_table_lists_every_modelled_call_and_no_other() -> None:
    """One row per entry point the simulated ``libnvidia-ml.so.1`` exports; the clients'
    columns are checked where each client runs (tests/nvml/sim, tests/e2e)."""
    assert set(rows()) == set(abi.SYMBOLS)
    assert all(clients for name, clients in rows().items()
               if name not in _NO_CLIENT), "a modelled call no client makes is named below"
    assert not any(rows()[name] for name in _NO_CLIENT)


_NO_CLIENT = {"nvmlDeviceGetGpuInstanceProfileInfoByIdV",
              "nvmlDeviceGetGpuInstanceRemainingCapacity", "nvmlDeviceGetIndex",
              "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
              "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetDriverVersion"}
