"""A failed end-to-end test's report carries what the components logged meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.testing.cluster import log_excerpts


def _log(path: Path, text: str, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_problem_lines_of_logs_written_during_the_test_are_shown(tmp_path: Path) -> None:
    _log(tmp_path / "logs" / "kube-scheduler.log",
         "I1205 09:05:05.1 fine\nE1205 09:05:06.2 scheduling failed: no nodes\n", 2000)
    _log(tmp_path / "node-a" / "logs" / "kubelet.1.log", "I1205 all good\n", 2000)
    _log(tmp_path / "logs" / "etcd.log", "E1205 an old error\n", 500)
    text = log_excerpts(tmp_path, since=1000)
    assert "--- logs/kube-scheduler.log\nE1205 09:05:06.2 scheduling failed: no nodes" in text
    assert "fine" not in text
    assert "kubelet" not in text, "a log with no problem line is left out"
    assert "an old error" not in text, "a log untouched during the test is left out"


def test_tesseras_own_logs_show_their_last_lines_and_a_traceback(tmp_path: Path) -> None:
    body = [f"INFO tick {i}" for i in range(20)]
    body[5:5] = ["ERROR decision loop failed", "Traceback (most recent call last):"]
    _log(tmp_path / "logs" / "controller-c1.log", "\n".join(body), 2000)
    lines = log_excerpts(tmp_path, since=1000, tail=3).splitlines()
    assert lines == ["--- logs/controller-c1.log", "ERROR decision loop failed",
                     "Traceback (most recent call last):", "INFO tick 17", "INFO tick 18",
                     "INFO tick 19"]


def test_the_excerpt_is_bounded_and_says_how_much_it_left_out(tmp_path: Path) -> None:
    _log(tmp_path / "logs" / "agent.log", "\n".join(f"ERROR {'x' * 500} {i}" for i in range(50)),
         2000)
    lines = log_excerpts(tmp_path, since=1000, problems=40, tail=0, width=80, total=10)
    assert len(lines.splitlines()) == 11
    assert all(len(line) <= 80 for line in lines.splitlines())
    assert lines.splitlines()[-1] == "... 31 more lines"


def test_nothing_written_gives_an_empty_excerpt(tmp_path: Path) -> None:
    _log(tmp_path / "logs" / "etcd.log", "E1205 old\n", 10)
    assert log_excerpts(tmp_path, since=1000) == ""


def test_tesseras_logs_come_first_and_lines_keep_their_order(tmp_path: Path) -> None:
    _log(tmp_path / "logs" / "etcd.log", "E1205 etcd trouble\n", 2000)
    _log(tmp_path / "node-a" / "logs" / "agent.log", "INFO start\nERROR card gone\nINFO retry\n",
         2000)
    lines = log_excerpts(tmp_path, since=1000, tail=1).splitlines()
    assert lines == ["--- node-a/logs/agent.log", "ERROR card gone", "INFO retry",
                     "--- logs/etcd.log", "E1205 etcd trouble"]
