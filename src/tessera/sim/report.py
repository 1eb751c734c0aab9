"""The simulation's outputs: a text table per policy and a self-contained HTML report.

The report draws its plots as inline SVG (no plotting library, nothing fetched when it is
opened): compute running over time per policy, and a few GPUs' layouts over time per policy
(one strip per GPU, a band per slice over its memory slices, solid while held, pale while
free).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from tessera.sim.engine import RunResult
from tessera.sim.policies import Layout

__all__ = ["PALETTE", "comparison", "render_class_table", "render_table", "write_report"]

_COLUMNS = ("policy", "placed", "on arrival", "served", "mean wait", "p95 wait", "frag",
            "reparts", "+slices", "-slices")
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_PROFILE_COLOUR = {"1": "#4e79a7", "2": "#f28e2b", "3": "#59a14f", "4": "#e15759",
                   "7": "#76b7b2", "share": "#edc948", "whole": "#76b7b2"}
"""By compute slices for MIG profiles; GPUs without MIG draw their shares (or the whole GPU)."""


def _cells(r: RunResult) -> tuple[str, ...]:
    return (r.policy, f"{r.placed}/{r.jobs}", str(r.placed_on_arrival),
            f"{r.served_share:.1%}", f"{r.mean_wait:.0f} s", f"{r.p95_wait:.0f} s",
            f"{r.fragmentation:.1%}", str(r.repartitions), str(r.created), str(r.destroyed))


def render_table(results: Sequence[RunResult]) -> str:
    """One row per policy: pods placed, waits (unplaced pods count until the end), compute
    served and fragmentation as shares of the cluster, repartitions, slices made/destroyed."""
    rows = [_COLUMNS, *(_cells(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def render_class_table(results: Sequence[RunResult]) -> str:
    """Waits by requested size class (1g ... 7g, multi-GPU): one row per class, one column
    per policy, each cell ``mean / p95 / max`` in seconds. A policy that starves large pods
    shows it here even when its overall mean wait looks fine."""
    classes: list[str] = []
    for r in results:
        classes.extend(c for c in r.by_class() if c not in classes)
    order = {c: i for i, c in enumerate(sorted(
        classes, key=lambda c: (c == "multi-GPU", int(c.rstrip("g")) if c[:-1].isdigit() else 0)))}
    header = ("class", "pods", *(r.policy for r in results))
    rows = [header]
    for name in sorted(classes, key=order.__getitem__):
        cells = []
        pods = 0
        for r in results:
            found = r.by_class().get(name)
            if found is None:
                cells.append("-")
                continue
            pods = max(pods, int(found["pods"]))
            cells.append(f"{found['mean_wait_s']:.0f} / {found['p95_wait_s']:.0f} / "
                         f"{found['max_wait_s']:.0f}")
        rows.append((name, str(pods), *cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "waits by size class, s (mean / p95 / max)\n" + "\n".join(lines)


def _utilisation_svg(results: Sequence[RunResult], width: int = 760, height: int = 260) -> str:
    left, top, plot_w, plot_h = 50, 10, width - 200, height - 40
    horizon = max((r.horizon for r in results), default=1.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
             'stroke="#999"/>']
    for frac in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - frac)
        parts.append(f'<text x="{left - 6}" y="{y + 4:.0f}" font-size="11" '
                     f'text-anchor="end">{frac:.0%}</text>')
    parts.append(f'<text x="{left + plot_w}" y="{height - 8}" font-size="11" '
                 f'text-anchor="end">{horizon / 3600:.1f} h</text>')
    for k, r in enumerate(results):
        colour = PALETTE[k % len(PALETTE)]
        points = " ".join(f"{left + plot_w * t / horizon:.1f},{top + plot_h * (1 - u):.1f}"
                          for t, u in r.utilisation)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{points}"/>')
        parts.append(f'<rect x="{left + plot_w + 12}" y="{top + 16 * k}" width="10" '
                     f'height="10" fill="{colour}"/><text x="{left + plot_w + 26}" '
                     f'y="{top + 16 * k + 9}" font-size="11">{html.escape(r.policy)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _layout_svg(samples: Sequence[tuple[float, Layout]], horizon: float,
                width: int = 760, height: int = 64) -> str:
    """One GPU over time: x is time, y the 8 memory slices; a band per slice run."""
    plot_w, row = width - 60, height / 8
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    runs: list[tuple[float, float, Layout]] = []
    for i, (t, shown) in enumerate(samples):
        end = samples[i + 1][0] if i + 1 < len(samples) else horizon
        if runs and runs[-1][2] == shown:
            runs[-1] = (runs[-1][0], end, shown)
        else:
            runs.append((t, end, shown))
    for begin, end, shown in runs:
        x = plot_w * begin / (horizon or 1.0)
        w = max(0.5, plot_w * (end - begin) / (horizon or 1.0))
        for profile, start, size, held in shown:
            colour = _PROFILE_COLOUR.get(profile, _PROFILE_COLOUR.get(
                profile.split("g", 1)[0], "#bab0ac"))
            parts.append(f'<rect x="{x:.1f}" y="{start * row:.1f}" width="{w:.1f}" '
                         f'height="{size * row - 1:.1f}" fill="{colour}" '
                         f'fill-opacity="{1.0 if held else 0.3}"><title>'
                         f'{html.escape(profile)}@{start}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


_LEGEND_NAMES = {"1": "1g (one compute slice)", "2": "2g", "3": "3g", "4": "4g", "7": "7g",
                 "share": "share of a GPU without MIG", "whole": "whole GPU without MIG"}


def _legend() -> str:
    """What the strips' colours and shades mean, as a row of swatches."""
    items = []
    for key, colour in _PROFILE_COLOUR.items():
        for opacity, state in ((1.0, "held"), (0.3, "free")):
            items.append(
                f'<span style="display:inline-block;margin-right:12px">'
                f'<svg width="14" height="14"><rect width="14" height="14" fill="{colour}" '
                f'fill-opacity="{opacity}"/></svg> {html.escape(_LEGEND_NAMES[key])}, '
                f"{state}</span>")
    return "<p class='legend'>" + "".join(items) + "</p>"


def comparison(results: Sequence[RunResult]) -> list[str]:
    """The answer a reader looks for first, on a cluster of fixed size: how much of the
    cluster's compute each real policy served (the fluid bounds are ideals, not choices),
    best first."""
    real = sorted((r for r in results if not r.policy.startswith("fluid")),
                  key=lambda r: -r.served_share)
    if not real:
        return []
    best, *rest = real
    line = (f"{best.policy} served the most: {best.served_share:.1%} of the cluster's compute,"
            f" {best.placed}/{best.jobs} pods placed, p95 wait {best.p95_wait:.0f} s.")
    if rest:
        line += " Then " + ", ".join(f"{r.policy} {r.served_share:.1%}" for r in rest) + "."
    return [line]


def write_report(path: Path, results: Sequence[RunResult], *, title: str,
                 details: Sequence[str], headline: Sequence[str] = (),
                 lead_html: Sequence[str] = ()) -> Path:
    """Write the HTML report to ``path`` (parents created) and return it: the headline answer
    first (``headline``, or :func:`comparison` of the results), then ``lead_html`` (sections
    that belong on the first screen with it), the run's settings, the table, then the plots
    with their legend."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lead = list(headline) or comparison(results)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>"
                   for r in results)
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        "<div class='headline' style='font-size:1.05em;margin:0.5em 0 0.8em'>"
        + "".join(f"<p style='margin:0.2em 0'>{'<strong>' if i == 0 else ''}"
                  f"{html.escape(line.strip())}{'</strong>' if i == 0 else ''}</p>"
                  for i, line in enumerate(lead)) + "</div>",
        *lead_html,
        "<ul>" + "".join(f"<li>{html.escape(d)}</li>" for d in details) + "</ul>",
        f"<table border='1' cellpadding='3'><tr>{head}</tr>{body}</table>",
        "<h2>Compute running over time (share of the cluster)</h2>",
        _utilisation_svg(results),
        "<h2>GPU layouts over time</h2><p>Each strip is one GPU: time to the right, memory "
        "slices 0-7 downwards (on a GPU without MIG: the whole GPU, or its shares); solid "
        "while a pod holds the slice or share, pale while free.</p>",
        _legend(),
    ]
    for r in results:
        if not r.layouts:
            continue
        sections.append(f"<h3>{html.escape(r.policy)}</h3>")
        for gpu, samples in sorted(r.layouts.items()):
            sections.append(f"<div>GPU {gpu}</div>{_layout_svg(samples, r.horizon)}")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title></head><body style='font-family:sans-serif'>"
            + "\n".join(sections) + "</body></html>\n")
    path.write_text(page)
    return path
