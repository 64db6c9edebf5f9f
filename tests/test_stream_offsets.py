"""The commit tracker: a partition commits up to its highest contiguous acknowledged offset + 1."""

from __future__ import annotations

import random

import pytest

from spinf_stream.stream.offsets import OffsetTracker, PartitionOffsets


def tracked(*offsets: int) -> PartitionOffsets:
    p = PartitionOffsets()
    for o in offsets:
        p.track(o)
    return p


def test_nothing_to_commit_before_any_ack():
    p = tracked(0, 1, 2)
    assert p.committable() is None
    assert p.position is None


def test_in_order_acks_commit_offset_plus_one():
    p = tracked(0, 1, 2)
    p.ack(0)
    assert p.committable() == 1
    p.ack(1)
    p.ack(2)
    assert p.committable() == 3


def test_an_ack_behind_a_gap_does_not_move_the_commit():
    p = tracked(0, 1, 2, 3)
    p.ack(0)
    p.ack(2)
    p.ack(3)
    assert p.committable() == 1  # offset 1 is not acknowledged: 2 and 3 must wait


def test_filling_the_gap_releases_everything_behind_it():
    p = tracked(0, 1, 2, 3)
    for o in (3, 2, 0):
        p.ack(o)
    assert p.committable() == 1
    p.ack(1)
    assert p.committable() == 4


def test_offsets_with_holes_are_contiguous_over_what_was_tracked():
    # compacted topics and transaction markers leave holes in the offsets a consumer sees
    p = tracked(5, 7, 8, 20)
    p.ack(7)
    assert p.committable() is None
    p.ack(5)
    assert p.committable() == 8
    p.ack(20)
    p.ack(8)
    assert p.committable() == 21


def test_committable_is_none_until_the_position_moves_again():
    p = tracked(0, 1)
    p.ack(0)
    assert p.committable() == 1
    p.mark_committed(1)
    assert p.committable() is None
    p.ack(1)
    assert p.committable() == 2


def test_tracking_must_increase():
    p = tracked(3)
    with pytest.raises(ValueError):
        p.track(3)
    with pytest.raises(ValueError):
        p.track(2)


def test_negative_offsets_are_refused():
    with pytest.raises(ValueError):
        PartitionOffsets().track(-1)


def test_acking_an_untracked_offset_is_an_error():
    p = tracked(0, 2)
    with pytest.raises(ValueError):
        p.ack(1)
    with pytest.raises(ValueError):
        p.ack(3)


def test_acking_twice_is_an_error():
    p = tracked(0, 1)
    p.ack(1)
    with pytest.raises(ValueError):
        p.ack(1)
    p.ack(0)
    with pytest.raises(ValueError):
        p.ack(0)  # already committed past


def test_pending_and_unacked_counts():
    p = tracked(0, 1, 2)
    p.ack(2)
    assert p.unacked == 2
    assert p.pending == 3  # 2 is acknowledged but waits behind 0 and 1
    p.ack(0)
    assert (p.unacked, p.pending) == (1, 2)


def test_random_ack_orders_match_a_reference_model():
    rng = random.Random(7)
    for _ in range(200):
        offsets = sorted(rng.sample(range(500), rng.randint(1, 60)))
        p = tracked(*offsets)
        acked: set[int] = set()
        for o in rng.sample(offsets, len(offsets)):
            p.ack(o)
            acked.add(o)
            # reference: walk the tracked offsets from the start while acknowledged
            expected = None
            for t in offsets:
                if t not in acked:
                    break
                expected = t + 1
            assert p.position == expected
        assert p.unacked == 0 and p.pending == 0


def test_tracker_keeps_partitions_apart():
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    a, b = ("in", 0), ("in", 1)
    for o in range(3):
        t.track(a, o)
        t.track(b, 10 + o)
    t.ack(a, 0)
    t.ack(b, 11)
    assert t.committable() == {a: 1}
    t.ack(b, 10)
    assert t.committable() == {a: 1, b: 12}
    assert t.committable(only=[b]) == {b: 12}
    t.mark_committed({a: 1, b: 12})
    assert t.committable() == {}
    assert t.unacked == 3


def test_forgetting_a_partition_drops_its_state():
    t: OffsetTracker[str] = OffsetTracker()
    t.track("p0", 0)
    t.forget(["p0"])
    assert "p0" not in t
    t.track("p0", 0)  # fresh state: tracking restarts
    assert t.unacked == 1
