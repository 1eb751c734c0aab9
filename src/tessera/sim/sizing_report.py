"""What ``--size-for`` shows besides its headline: every class's waits at each policy's answer
(a text table for the terminal, an HTML one for the report), and the curve: each policy's p95
wait per class and its compute served, against cluster size, drawn as inline SVG so that a size
where waits grow with the cluster, or a class traded for another, shows at a glance.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence

from tessera.sim.engine import RunResult, percentile
from tessera.sim.report import PALETTE
from tessera.sim.sizing import ALL, Goal, SizeAnswer, duration

__all__ = ["ALL_PODS", "class_table_html", "class_table_text", "curve_html"]

ALL_PODS = "all pods"
"""The row (and panel) of every pod pooled, beside the classes."""


def _rows(goal: Goal, answers: Sequence[SizeAnswer]) -> list[str]:
    """The classes with pods in some answer's run, in the card's order, then all pods."""
    present = [c for c in goal.classes if any(a.result.class_waits.get(c) for a in answers)]
    return [*present, ALL_PODS]


def _waits(result: RunResult, row: str) -> list[float]:
    return result.waits if row == ALL_PODS else result.class_waits.get(row, [])


def _scope(row: str) -> str:
    """The row's name as :class:`Goal` names it (:data:`ALL` for every pod pooled)."""
    return ALL if row == ALL_PODS else row


def _cell(answer: SizeAnswer, row: str) -> str:
    waits = _waits(answer.result, row)
    if not waits:
        return "-"
    return f"{duration(percentile(waits, 95))} / {duration(sum(waits) / len(waits))}"


@dataclasses.dataclass(frozen=True)
class _Row:
    """One row of the class table, as both renderings show it."""

    name: str
    pods: int
    target: str
    cells: tuple[tuple[str, bool], ...]
    """Per answer: ``p95 / mean``, and whether the class misses its target there."""


def _table(answers: Sequence[SizeAnswer], goal: Goal) -> list[_Row]:
    """The class table's rows: each answer's misses found once, not once per cell."""
    missed = [{m.class_name for m in goal.misses(a.result)} for a in answers]
    rows = []
    for row in _rows(goal, answers):
        bounds = ", ".join(f"{t.metric.split('-')[0]} <= {duration(t.seconds)}"
                           for t in goal.targets_on(_scope(row))) or "-"
        rows.append(_Row(row, max(len(_waits(a.result, row)) for a in answers), bounds,
                         tuple((_cell(a, row), _scope(row) in misses)
                               for a, misses in zip(answers, missed, strict=True))))
    return rows


def _heading(answer: SizeAnswer) -> str:
    at = (f"{answer.gpus} GPUs" if answer.gpus is not None
          else f"{answer.curve[-1][0]} GPUs, not met")
    return f"{answer.policy} @ {at}"


def class_table_text(answers: Sequence[SizeAnswer], goal: Goal) -> str:
    """Rows: classes (and all pods); columns: each policy at its answer; cells ``p95 / mean``,
    a ``*`` where the class misses its target there."""
    header = ("class", "pods", "target", *(_heading(a) for a in answers))
    rows = [header, *((r.name, str(r.pods), r.target,
                       *(text + ("*" if miss else "") for text, miss in r.cells))
                      for r in _table(answers, goal))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return ("waits by class at each policy's answer, p95 / mean (* misses its target)\n"
            + "\n".join(lines))


def class_table_html(answers: Sequence[SizeAnswer], goal: Goal) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in
                   ("class", "pods", "target", *(_heading(a) for a in answers)))
    body = []
    for row in _table(answers, goal):
        cells = "".join(f"<td class='miss' style='color:#c00;font-weight:bold'>"
                        f"{html.escape(text)}</td>" if miss else f"<td>{html.escape(text)}</td>"
                        for text, miss in row.cells)
        body.append(f"<tr style='white-space:nowrap'><td>{html.escape(row.name)}</td>"
                    f"<td>{row.pods}</td><td>{html.escape(row.target)}</td>{cells}</tr>")
    return ("<table class='classes' border='1' cellpadding='2' style='border-collapse:collapse;"
            "font-size:0.85em'><caption style='text-align:left'>Waits by class at each "
            "policy's answer, p95 / mean (red: misses its target)</caption>"
            f"<tr>{head}</tr>{''.join(body)}</table>")


_W, _H = 250, 128
_LEFT, _TOP, _RIGHT, _BOTTOM = 40, 18, 8, 20
_TICKS = ((1.0, "1 s"), (60.0, "1 min"), (3600.0, "1 h"), (86400.0, "1 d"))


def _panel(title: str, answers: Sequence[SizeAnswer], value: str, *, log: bool,
           bound: float | None) -> str:
    """One small multiple: x the cluster's GPUs, y ``value`` of each run (p95 wait of a class
    on a log scale from 1 s, or compute served in GPU-hours from 0); a dot at each policy's
    answer; the target dashed."""
    points = [[(g, _measure(r, g, value)) for g, r in a.curve] for a in answers]
    xs = [g for line in points for g, _ in line]
    ys = [y for line in points for _, y in line if y is not None]
    if not xs or not ys:
        return ""
    x0, x1 = min(xs), max(xs)
    top = max([*ys, bound or 0.0, 1.0])
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    if log:
        y_max = 10 ** math.ceil(math.log10(max(top, 10.0)))

        def y_of(v: float) -> float:
            return _TOP + plot_h * (1 - math.log10(max(v, 1.0)) / math.log10(y_max))
        ticks = [(s, label) for s, label in _TICKS if s <= y_max]
    else:
        y_max = top * 1.05

        def y_of(v: float) -> float:
            return _TOP + plot_h * (1 - v / y_max)
        ticks = [(0.0, "0"), (top, f"{top:.0f}")]

    def x_of(g: int) -> float:
        return _LEFT + plot_w * ((g - x0) / (x1 - x0) if x1 > x0 else 0.5)

    parts = [f'<svg class="curve-panel" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
             f'height="{_H}"><text x="{_LEFT}" y="13" font-size="12" font-weight="bold">'
             f'{html.escape(title)}</text><rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" '
             f'height="{plot_h}" fill="none" stroke="#999"/>']
    for v, label in ticks:
        y = y_of(v)
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#eee"/><text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" '
                     f'text-anchor="end">{label}</text>')
    for g, anchor in ((x0, "start"), (x1, "end")):
        parts.append(f'<text x="{x_of(g):.1f}" y="{_H - 6}" font-size="10" '
                     f'text-anchor="{anchor}">{g} GPUs</text>')
    if bound is not None:
        y = y_of(bound)
        parts.append(f'<line class="target" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" stroke="#c00" stroke-dasharray="4 3"><title>target '
                     f'{duration(bound)}</title></line>')
    for k, (a, line) in enumerate(zip(answers, points, strict=True)):
        colour = PALETTE[k % len(PALETTE)]
        shown = [(x_of(g), y_of(v)) for g, v in line if v is not None]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in shown) + '"/>')
        at = dict(line).get(a.gpus) if a.gpus is not None else None
        if at is not None:
            parts.append(f'<circle cx="{x_of(a.gpus or 0):.1f}" cy="{y_of(at):.1f}" r="3.5" '
                         f'fill="{colour}"><title>{html.escape(a.policy)}: {a.gpus} GPUs'
                         '</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _measure(result: RunResult, gpus: int, value: str) -> float | None:
    """``served``: GPU-hours of compute served; otherwise the p95 wait of class ``value``
    (None where the run has no such pod)."""
    if value == "served":
        per_gpu = result.capacity / gpus if gpus else 1.0
        return result.served / per_gpu / 3600.0
    waits = _waits(result, value)
    return percentile(waits, 95) if waits else None


def curve_html(answers: Sequence[SizeAnswer], goal: Goal) -> str:
    """The legend of policies, then one panel per class (p95 wait against GPUs, its p95 bound
    dashed) and one of compute served; a dot marks each policy's answer."""
    legend = "".join(
        f"<span style='margin-right:14px'><svg width='12' height='12'><rect width='12' "
        f"height='12' fill='{PALETTE[k % len(PALETTE)]}'/></svg> {html.escape(a.policy)}"
        "</span>" for k, a in enumerate(answers))
    panels = []
    for row in _rows(goal, answers):
        bounds = [t.seconds for t in goal.targets_on(_scope(row)) if t.metric == "p95-wait"]
        panels.append(_panel(f"{row}: p95 wait", answers, row, log=True,
                             bound=min(bounds) if bounds else None))
    panels.append(_panel("compute served, GPU-hours", answers, "served", log=False,
                         bound=None))
    return ("<div class='curve'><div class='curve-legend' style='font-size:0.85em'>"
            f"Against cluster size (dot: each policy's answer; dashed: the target): {legend}"
            "</div><div style='display:flex;flex-wrap:wrap'>" + "".join(panels)
            + "</div></div>")
