"""Which partitions backpressure pauses and resumes (``spinf_stream.stream.backpressure``): a
partition at its share of ``--max-inflight`` pauses alone, every one at the total or when
stopping, and a paused one resumes at half its share."""

from __future__ import annotations

import pytest

from spinf_stream.stream.backpressure import decide, share

ALL = {"a", "b", "c", "d"}


@pytest.mark.parametrize(("max_inflight", "assigned", "want"), [(2048, 6, 341), (20, 2, 10), (3, 4, 1), (5, 0, 5)])
def test_a_partition_s_share_is_the_bound_over_the_assigned_partitions(max_inflight, assigned, want):
    assert share(max_inflight, assigned) == want


def test_only_the_partition_at_its_share_pauses():
    d = decide({"a": 10, "b": 3}, ALL, set(), max_inflight=40, stopping=False)  # share 10
    assert d.pause == {"a"} and d.resume == set()
    d = decide({"a": 9, "b": 3}, ALL, set(), max_inflight=40, stopping=False)
    assert d.pause == set()


def test_every_partition_pauses_at_the_total_and_when_stopping():
    assert decide({"a": 10, "b": 10, "c": 10, "d": 10}, ALL, {"a"}, 40, False).pause == ALL - {"a"}
    assert decide({}, ALL, set(), 40, True).pause == ALL
    assert decide({"a": 50}, {"a", "b"}, set(), 40, False).pause == {"a", "b"}


def test_a_paused_partition_resumes_at_half_its_share_not_before():
    assert decide({"a": 6}, ALL, {"a"}, 40, False).resume == set()  # 6 > 10 // 2: stays paused
    assert decide({"a": 5}, ALL, {"a"}, 40, False).resume == {"a"}
    assert decide({"a": 5}, ALL, {"a"}, 40, True).resume == set()  # stopping: nothing resumes
    # after the total paused everything, the partitions drained to half their share resume alone
    assert decide({"a": 9, "b": 2}, ALL, ALL, 40, False).resume == {"b", "c", "d"}


def test_a_partition_no_longer_assigned_is_neither_paused_nor_resumed():
    d = decide({"x": 100}, {"a"}, {"x"}, 40, False)
    assert d.pause == set() and d.resume == set()
