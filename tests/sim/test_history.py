"""A user's own pod history as a workload: the CSV's forms, its times, its errors (each naming
the line, the column and the fix), how requests become the simulated cluster's, and a round
trip from the exporter's rows back through the parser."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from tessera.core import catalogue
from tessera.core.errors import InvalidInputError
from tessera.sim.history import (
    Gpus,
    HistoryPod,
    Share,
    Slices,
    format_time,
    history_jobs,
    load_history,
    mig_requests,
    parse_history,
    parse_request,
    parse_time,
    request_from_resources,
    shared_requests,
    write_history,
)

A100 = catalogue.model("A100-80GB")
L4 = catalogue.card("L4")
HEADER = "name,created,started,finished,request\n"


def _csv(*rows: str) -> str:
    return HEADER + "".join(f"{r}\n" for r in rows)


class TestRequests:
    @pytest.mark.parametrize(("text", "expected"), [
        ("1g.10gb", Slices((("1g.10gb", 1),))),
        ("2x3g.40gb", Slices((("3g.40gb", 2),))),
        ("1g.10gb+me", Slices((("1g.10gb+me", 1),))),
        ("2g.20gb 1g.10gb 1g.10gb", Slices((("1g.10gb", 2), ("2g.20gb", 1)))),
        ("gpu:2", Gpus(2)),
        ("shared:10gb", Share(1, gib=10)),
        ("2xshared:10gb", Share(2, gib=10)),
        ("shared", Share(1)),
        ("3xshared", Share(3)),
        ("shared:250m", Share(milli=250)),
    ])
    def test_every_form_parses_and_prints_back_as_written(self, text: str,
                                                          expected: object) -> None:
        parsed = parse_request(text)
        assert parsed == expected
        assert parse_request(str(parsed)) == parsed

    def test_an_old_profile_name_is_kept_and_resolved_on_its_card(self) -> None:
        current = {p.name for m in catalogue.models() for p in m.profiles}
        aliased = [(m, p.name, a) for m in catalogue.models() for p in m.profiles
                   for a in p.aliases if a not in current]
        assert aliased, "the catalogue has no aliases to test with"
        card, name, alias = aliased[0]
        assert parse_request(alias) == Slices(((alias, 1),))
        assert mig_requests(card)(parse_request(alias))[0] == ((name, 1),)

    @pytest.mark.parametrize(("text", "says"), [
        ("", "is empty"),
        ("1g.11gb", "neither a MIG profile"),
        ("2xgpu", "gpu:K"),
        ("gpu:0", "gpu:K"),
        ("gpu:1 1g.10gb", "gpu:K"),
        ("shared:10gb 1g.10gb", "one kind"),
        ("0x1g.10gb", "at least 1"),
        ("2xshared:250m", "shared:500m"),
        ("shared:0gb", "at least 1"),
    ])
    def test_a_bad_request_says_what_is_wrong(self, text: str, says: str) -> None:
        with pytest.raises(InvalidInputError, match=says):
            parse_request(text)

    @pytest.mark.parametrize(("resources", "expected"), [
        ({"nvidia.com/mig-1g.10gb": 1}, Slices((("1g.10gb", 1),))),
        ({"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 1},
         Slices((("1g.10gb", 1), ("3g.40gb", 2)))),
        ({"nvidia.com/mig-1g.10gb.me": 1}, Slices((("1g.10gb+me", 1),))),
        ({"nvidia.com/gpu": 2}, Gpus(2)),
        ({"nvidia.com/gpu.shared": 1}, Share(1)),
        ({"nvidia.com/gpu.shared-10gb": 2}, Share(2, gib=10)),
    ])
    def test_resource_names_translate_through_the_catalogue(
            self, resources: dict[str, int], expected: object) -> None:
        assert request_from_resources(resources) == expected

    @pytest.mark.parametrize(("resources", "says"), [
        ({"nvidia.com/mig-3g.40gb.shared": 1}, "inside a MIG slice"),
        ({"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}, "several kinds"),
        ({"nvidia.com/gpu.shared": 1, "nvidia.com/gpu": 1}, "several kinds"),
        ({"nvidia.com/mig-9g.99gb": 1}, "no catalogued card"),
        ({"nvidia.com/gpu.memory": 1}, "not a GPU resource"),
        ({}, "asks no"),
    ])
    def test_what_the_simulator_does_not_model_is_refused(
            self, resources: dict[str, int], says: str) -> None:
        with pytest.raises(InvalidInputError, match=says):
            request_from_resources(resources)


class TestTimes:
    def test_rfc3339_with_and_without_offset_and_fraction(self) -> None:
        assert parse_time("1970-01-01T00:01:00Z") == (60.0, "timestamp")
        assert parse_time("1970-01-01T01:01:00+01:00") == (60.0, "timestamp")
        assert parse_time("1970-01-01T00:01:00.5") == (60.5, "timestamp")  # no offset: UTC
        assert parse_time("1970-01-01 00:01:00Z") == (60.0, "timestamp")

    def test_seconds(self) -> None:
        assert parse_time("90") == (90.0, "seconds")
        assert parse_time(" 1.5 ") == (1.5, "seconds")

    def test_the_exporter_writes_rfc3339_in_utc(self) -> None:
        assert format_time(60.0) == "1970-01-01T00:01:00Z"
        assert parse_time(format_time(1_746_000_000.0))[0] == 1_746_000_000.0

    def test_anything_else_names_both_accepted_forms(self) -> None:
        with pytest.raises(InvalidInputError, match=r"RFC 3339.*seconds"):
            parse_time("yesterday")


class TestParsing:
    def test_rows_become_pods_in_creation_order(self) -> None:
        history = parse_history(_csv("b,20,25,85,gpu:1", "a,10,12,,1g.10gb", "c,30,,,shared"))
        assert [p.name for p in history.pods] == ["a", "b", "c"]
        a, b, c = history.pods
        assert (a.created, a.started, a.finished) == (10.0, 12.0, None)
        assert (b.started, b.finished, b.request) == (25.0, 85.0, Gpus(1))
        assert (c.started, c.finished) == (None, None)
        assert history.end == 85.0
        assert a.line == 3

    def test_other_columns_are_ignored(self) -> None:
        history = parse_history("node,name,created,started,finished,request,ns\n"
                                "n1,a,10,12,20,1g.10gb,x\n")
        assert history.pods[0].request == Slices((("1g.10gb", 1),))

    def test_the_same_pod_in_two_exports_keeps_its_most_complete_row(self) -> None:
        history = parse_history(_csv("a,10,12,,1g.10gb", "a,10,12,50,1g.10gb",
                                     "a,10,12,,1g.10gb", "a,70,71,90,1g.10gb"))
        assert [(p.created, p.finished) for p in history.pods] == [(10.0, 50.0), (70.0, 90.0)]

    @pytest.mark.parametrize(("row", "column", "fix"), [
        (",10,12,20,gpu:1", "column name", "name the pod"),
        ("a,,12,20,gpu:1", "column created", "when the pod was created"),
        ("a,10,soon,20,gpu:1", "column started", "RFC 3339"),
        ("a,10,,20,gpu:1", "column started", "leave both empty"),
        ("a,10,30,20,gpu:1", "column finished", "before started"),
        ("a,10,12,20,1g.11gb", "column request", "tessera catalogue"),
        ("a,10,12,20,", "column request", "what the pod asked for"),
        ("a,10,2025-05-01T09:00:00Z,,gpu:1", "column started", "write every time the same"),
    ])
    def test_a_bad_row_names_its_line_its_column_and_the_fix(self, row: str, column: str,
                                                              fix: str) -> None:
        with pytest.raises(InvalidInputError) as error:
            parse_history(_csv("ok,1,2,3,gpu:1", row), "pods.csv")
        message = str(error.value)
        assert "--workload pods.csv line 3" in message
        assert column in message
        assert fix in message

    def test_a_missing_column_is_named_with_the_header_to_write(self) -> None:
        with pytest.raises(InvalidInputError, match=r"lacks finished, request.*"
                           r"name,created,started,finished,request"):
            parse_history("name,created,started\na,1,2\n")

    def test_a_file_without_pods_is_refused(self) -> None:
        with pytest.raises(InvalidInputError, match="no pods"):
            parse_history(HEADER)

    def test_an_unreadable_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidInputError, match="--workload: cannot read"):
            load_history(tmp_path / "missing.csv")


class TestJobs:
    def test_arrival_is_created_since_the_first_row_and_duration_finished_minus_started(
            self) -> None:
        history = parse_history(_csv("a,100,110,410,1g.10gb", "b,160,200,260,2x3g.40gb"))
        replayed = history_jobs(history, mig_requests(A100))
        a, b = replayed.jobs
        assert (a.arrival, a.duration, a.requests, a.compute) == (0.0, 300.0,
                                                                  (("1g.10gb", 1),), 1)
        assert (b.arrival, b.duration, b.requests, b.compute) == (60.0, 60.0,
                                                                  (("3g.40gb", 2),), 6)
        assert replayed.window == 310.0

    def test_a_running_pod_is_censored_at_the_latest_time_the_file_records(self) -> None:
        history = parse_history(_csv("a,0,10,,1g.10gb", "b,5,6,500,1g.10gb"))
        assert history_jobs(history, mig_requests(A100)).jobs[0].duration == 490.0

    def test_a_pod_that_never_started_lasts_the_median_of_finished_pods_like_it(self) -> None:
        history = parse_history(_csv("a,0,0,100,gpu:1", "b,0,0,300,gpu:1", "c,0,0,900,gpu:1",
                                     "d,0,0,50,1g.10gb", "w,10,,,gpu:1", "x,20,,,2g.20gb"))
        replayed = history_jobs(history, mig_requests(A100))
        durations = {j.name: j.duration for j in replayed.jobs}
        assert durations["w"] == 300.0  # the gpu:1 pods' median
        assert durations["x"] == 200.0  # no 2g.20gb finished: every finished pod's median
        assert (replayed.estimated, replayed.skipped) == (2, 0)

    def test_without_any_finished_pod_never_started_ones_are_skipped_and_counted(
            self) -> None:
        history = parse_history(_csv("a,0,1,,gpu:1", "w,10,,,gpu:1"))
        replayed = history_jobs(history, mig_requests(A100))
        assert [j.name for j in replayed.jobs] == ["a"]
        assert replayed.skipped == 1

    def test_pods_sharing_a_name_become_distinct_jobs(self) -> None:
        history = parse_history(_csv("web-0,0,1,5,gpu:1", "web-0,10,11,15,gpu:1"))
        assert [j.name for j in history_jobs(history, mig_requests(A100)).jobs] == [
            "web-0", "web-0#2"]

    def test_compress_and_rate_scale_as_for_a_trace(self) -> None:
        history = parse_history(_csv("a,0,0,100,gpu:1", "b,100,100,200,gpu:1"))
        (_, b) = history_jobs(history, mig_requests(A100), compress=2, rate_scale=5).jobs
        assert (b.arrival, b.duration) == (10.0, 50.0)

    @pytest.mark.parametrize(("text", "requests", "compute"), [
        ("gpu:2", (("7g.80gb", 2),), 14),
        ("shared:10gb", (("1g.10gb", 1),), 1),
        ("shared:20gb", (("2g.20gb", 1),), 2),
        ("shared", (("2g.20gb", 1),), 2),  # a quarter of the card
        ("shared:125m", (("1g.10gb", 1),), 1),
        ("shared:100gb", (("7g.80gb", 2),), 14),
    ])
    def test_on_mig_cards_shares_and_whole_gpus_become_profiles(
            self, text: str, requests: tuple[tuple[str, int], ...], compute: int) -> None:
        assert mig_requests(A100)(parse_request(text)) == (requests, compute)

    def test_a_profile_the_card_lacks_names_the_row_and_a_card_that_has_it(self) -> None:
        history = parse_history(_csv("a,0,1,2,1g.24gb"), "pods.csv")
        with pytest.raises(InvalidInputError) as error:
            history_jobs(history, mig_requests(A100))
        message = str(error.value)
        assert "--workload pods.csv line 2 (pod a), column request" in message
        assert "not a MIG profile of A100-80GB" in message
        assert "--cluster 2x8x" in message

    @pytest.mark.parametrize(("text", "requests", "compute"), [
        ("gpu:2", (("nvidia.com/gpu", 2),), 2000),
        ("shared:250m", (("nvidia.com/gpu.shared", 250),), 250),
        ("shared", (("nvidia.com/gpu.shared", 250),), 250),
        ("2xshared:6gb", (("nvidia.com/gpu.shared", 534),), 534),  # 12 GiB of 22.5
        ("shared:30gb", (("nvidia.com/gpu", 2),), 2000),
        ("1g.10gb", (("nvidia.com/gpu.shared", 428),), 428),  # its 9.6 GiB of the L4's
    ])
    def test_on_cards_without_mig_requests_are_milli_gpus_or_whole_gpus(
            self, text: str, requests: tuple[tuple[str, int], ...], compute: int) -> None:
        assert isinstance(L4, catalogue.WholeGpu)
        assert shared_requests(L4)(parse_request(text)) == (requests, compute)


def test_the_exporter_s_rows_read_back_unchanged(tmp_path: Path) -> None:
    pods = [
        HistoryPod("ml/train-0", 1_746_000_000.0, 1_746_000_030.0, 1_746_003_600.0,
                   request_from_resources({"nvidia.com/gpu": 2})),
        HistoryPod("infer/llm-1", 1_746_000_100.0, 1_746_000_101.0, None,
                   request_from_resources({"nvidia.com/mig-3g.40gb": 1,
                                           "nvidia.com/mig-1g.10gb.me": 2})),
        HistoryPod("infer/embed-2", 1_746_000_200.0, None, None,
                   request_from_resources({"nvidia.com/gpu.shared-10gb": 2})),
        HistoryPod("infer/small-3", 1_746_000_300.0, 1_746_000_301.0, 1_746_000_900.0,
                   request_from_resources({"nvidia.com/gpu.shared": 1})),
    ]
    path = tmp_path / "pods.csv"
    path.write_text(write_history(pods))
    assert load_history(path).pods == tuple(pods)


def test_the_bundled_sample_replays_on_mig_cards_and_cards_without() -> None:
    source = resources.files("tessera.sim") / "data" / "sample_history.csv"
    with resources.as_file(source) as path:
        history = load_history(Path(path))
    assert len(history.pods) > 50
    assert any(p.finished is None and p.started is not None for p in history.pods)
    assert any(p.started is None for p in history.pods)
    kinds = {type(p.request) for p in history.pods}
    assert kinds == {Slices, Gpus, Share}
    assert isinstance(L4, catalogue.WholeGpu)
    for convert in (mig_requests(A100), shared_requests(L4)):
        assert len(history_jobs(history, convert).jobs) == len(history.pods)
