"""The simulator's HTML report as a reader sees it: opened in a real browser (Debian's
Chromium, ``make browser``, driven by Playwright), not only as text.

The screenshot is written to the test's temporary directory (printed on failure), never into
the repository.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from tessera.cli.main import main

CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")

# Without the background-networking flags Chromium tries to reach Google's hosts at start,
# which this machine's closed network refuses many times over.
_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    if shutil.which(CHROMIUM) or Path(CHROMIUM).is_file():
        return CHROMIUM
    message = f"Chromium is missing at {CHROMIUM}: run `make browser` (as root)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def sizing_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``--size-for`` run as ``make demo`` makes one (a target per class), on a small
    synthetic workload."""
    path = tmp_path_factory.mktemp("report") / "sizing.html"
    assert main(["simulate", "--cluster", "2x8xA100-SXM4-80GB", "--trace", "synthetic",
                 "--pods", "200", "--size-for", "small:p95-wait=2m,multi-gpu:p95-wait=6h",
                 "--policies",
                 "dynamic,greedy,static:all-balanced", "--report", str(path),
                 "--no-progress"]) == 0
    return path


@pytest.fixture(scope="module")
def page(sizing_report: Path) -> Iterator[Page]:
    executable = _chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=_FLAGS,
                                             headless=True)
        try:
            opened = browser.new_page(viewport={"width": 1280, "height": 900})
            opened.goto(sizing_report.as_uri())
            yield opened
        finally:
            browser.close()


def test_the_answer_leads_the_page_above_the_table(page: Page, sizing_report: Path) -> None:
    headline = page.locator(".headline")
    assert headline.is_visible()
    text = headline.inner_text()
    assert text.startswith("To keep small pods' p95 wait <= 2 min and multi-GPU pods' p95 wait "
                           "<= 6 h: dynamic needs ")
    for policy in ("dynamic", "greedy", "static:all-balanced"):
        assert re.search(rf"{re.escape(policy)} needs [^,]*GPUs \((met from|[^)]* binds?\))",
                         text), f"the headline names what binds {policy}'s answer: {text}"
    box, table = headline.bounding_box(), page.locator("table").first.bounding_box()
    assert box is not None
    assert table is not None
    assert box["y"] + box["height"] <= table["y"], "the answer comes before the table"
    assert box["y"] < 900, "and is on the first screen"
    assert "classes" in (page.locator("table").first.get_attribute("class") or "")
    assert table["y"] + table["height"] <= 900, "the class table is on the first screen"
    rows = page.locator("table.classes tr").all_inner_texts()
    for name in ("1g", "7g", "all pods"):
        assert any(r.startswith(name) for r in rows), (name, rows)
    panels = page.locator(".curve-panel")
    assert panels.count() >= 4
    for i in range(panels.count()):
        panel = panels.nth(i).bounding_box()
        assert panel is not None
        assert panel["y"] + panel["height"] <= 900, f"curve panel {i} is on the first screen"
    assert page.locator(".curve-panel polyline").count() >= 3 * panels.count()
    assert page.locator(".curve-panel line.target").count() >= 1, "the target is drawn"
    shot = sizing_report.parent / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000, f"screenshot at {shot}"


def test_the_layout_strips_have_a_legend_a_reader_can_see(page: Page) -> None:
    legend = page.locator(".legend")
    assert legend.is_visible()
    swatches = legend.locator("svg")
    names = legend.inner_text()
    for words in ("1g (one compute slice), held", "1g (one compute slice), free", "7g, held"):
        assert words in names
    assert swatches.count() >= 10
    for i in range(swatches.count()):
        box = swatches.nth(i).bounding_box()
        assert box is not None
        assert min(box["width"], box["height"]) >= 10, "every swatch is drawn"
    legend_box = legend.bounding_box()
    first_strip = page.locator("h3 ~ svg").first.bounding_box()
    assert legend_box is not None
    assert first_strip is not None
    assert legend_box["y"] < first_strip["y"], "the legend comes before the strips it explains"
