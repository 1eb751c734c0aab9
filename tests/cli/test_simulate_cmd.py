"""``tessera simulate`` as a user runs it: the bundled trace, the table, JSON, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli.main import main
from tessera.core import catalogue


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_run_prints_the_table_and_writes_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.html"
    code, out, _ = _run(capsys, "--report", str(report))
    assert code == 0
    assert "bundled openb default sample" in out
    assert f"report: {report}" in out
    for policy in ("dynamic", "greedy", "static:all-balanced", "static:all-7g", "fluid:gpu"):
        assert any(line.startswith(policy) for line in out.splitlines())
    page = report.read_text()
    assert page.startswith("<!doctype html>")
    assert "<svg" in page
    legend = page.split("<p class='legend'>", 1)[1].split("</p>", 1)[0]
    assert "1g (one compute slice), held" in legend
    assert "7g, free" in legend
    assert len(page) > 10_000


def test_json_is_deterministic_for_a_seed(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--json", "--report", str(tmp_path / "r.html"), "--trace", "synthetic",
            "--pods", "300", "--seed", "9", "--policies", "dynamic,greedy,static:best")

    def figures() -> list[dict[str, object]]:
        code, out, _ = _run(capsys, *args)
        assert code == 0
        rows: list[dict[str, object]] = json.loads(out)["policies"]
        for row in rows:
            row.pop("wall_s")
        return rows

    first = figures()
    assert [r["policy"] for r in first][:2] == ["dynamic", "greedy"]
    assert str(first[2]["policy"]).startswith("static:best(")
    assert first == figures()


def test_replay_with_compression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--arrivals", "replay", "--compress", "50", "--policies",
                        "greedy,fluid:cluster", "--report", str(tmp_path / "r.html"))
    assert code == 0
    assert "replayed" in out


@pytest.mark.parametrize(("args", "field"), [
    (("--policies", "dynamic,bogus"), "--policies"),
    (("--policies", "static:all-5g"), "--policies"),
    (("--cluster", "0x8xA100-80GB"), "--cluster"),
    (("--cluster", "2x8xV100"), "--cluster"),
    (("--trace", "/nonexistent.csv"), "--trace"),
])
def test_bad_input_exits_2_naming_the_option(args: tuple[str, ...], field: str,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, *args, "--report", str(tmp_path / "r.html"))
    assert code == 2
    assert field in err


@pytest.mark.parametrize("model", [m.name for m in catalogue.models()])
def test_every_catalogued_card_simulates_with_the_default_policies(
        model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--cluster", f"1x2x{model}", "--trace", "synthetic",
                          "--pods", "60", "--seed", "3", "--json",
                          "--report", str(tmp_path / "r.html"))
    assert code == 0, err
    results = {p["policy"]: p for p in json.loads(out)["policies"]}
    whole = f"static:all-{catalogue.model(model).full_profile.compute_slices}g"
    assert set(results) == {"dynamic", "greedy", "static:all-balanced", whole, "fluid:gpu"}
    assert results["dynamic"]["placed"] > 0
