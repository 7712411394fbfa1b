"""core.engine.sched.admission.choose on plain objects: no model, no engine, no MLX."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixchat.core.engine.sched.admission import choose, over_cap
from radixchat.core.engine.sched.fairness import PREFER_AMONG, FairQueue


@dataclass
class Req:
    owner: str
    size: int = 10  # K/V it holds (with its growth), as a row's length
    prefilled: bool = True
    done: bool = False
    tag: str = field(default="")


def size(a):
    return a.size


def padded(rows, longest):  # every row as long as the longest, as the decoding batch lays them out
    return rows * longest


def run(waiting, running=(), *, max_batch=4, max_prefill=8, room=1000, blocked=lambda a, p: False, cost=padded):
    fair = FairQueue()
    for r in running:
        fair.push(r)
        fair.pick(1, lambda a, p, r=r: a is not r)  # counted as running, as the engine does
    for a in waiting:
        fair.push(a)
    return choose(
        fair,
        list(running),
        max_batch=max_batch,
        max_prefill_batch=max_prefill,
        room=room,
        size=size,
        cost=cost,
        blocked=blocked,
    ), fair


def test_free_slots_fill_least_served_owner_first():
    alice = [Req("alice", tag=f"a{i}") for i in range(4)]
    bob = Req("bob", tag="b")
    picked, fair = run([*alice, bob], max_batch=2)
    assert [p.tag for p in picked] == ["a0", "b"]  # one each, not alice's two
    assert len(fair) == 3


def test_a_newcomer_joins_over_the_cap_up_to_its_fair_share():
    running = [Req("alice") for _ in range(4)]
    picked, _ = run([Req("alice"), Req("bob", tag="b")], running, max_batch=4)
    assert [p.tag for p in picked] == ["b"]  # alice is over her share; bob joins over the cap
    assert len(running) + len(picked) <= over_cap(4)


def test_kv_room_is_what_requests_hold_and_one_request_alone_always_runs():
    picked, _ = run([Req("alice", size=600), Req("bob", size=600)], room=1000)
    assert len(picked) == 1
    picked, _ = run([Req("alice", size=5000)], room=1000)
    assert len(picked) == 1  # too big for the budget, but alone: it runs
    picked, _ = run([Req("bob", size=5000)], [Req("alice", size=10)], room=1000)
    assert picked == []  # beside a running one it waits


def test_prefill_is_handed_over_only_as_fast_as_it_runs_and_a_newcomer_goes_in_at_once():
    running = [Req("alice", prefilled=False) for _ in range(2)]
    picked, _ = run([Req("alice", tag="a")], running, max_batch=8, max_prefill=2)
    assert picked == []  # the generator still prefills two of hers: none more yet
    picked, _ = run([Req("alice", tag="a")], running[:1], max_batch=8, max_prefill=2)
    assert [p.tag for p in picked] == ["a"]
    # bob and carol have nothing in prefill: their first prompt goes in beside a full prefill
    picked, _ = run([Req("bob", tag="b"), Req("bob", tag="b2"), Req("carol", tag="c")], running, max_prefill=2)
    assert sorted(p.tag for p in picked) == ["b", "c"]


def test_each_owner_gets_a_share_of_the_prefill():
    running = [Req("alice", prefilled=False) for _ in range(3)]
    waiting = [Req("alice", tag=f"a{i}") for i in range(4)] + [Req("bob", tag=f"b{i}") for i in range(4)]
    picked, _ = run(waiting, running, max_batch=32, max_prefill=8)
    # two owners with work: four prompts each in prefill at most (alice has three already)
    assert sorted(p.tag for p in picked) == ["a0", "b0", "b1", "b2", "b3"]


def test_blocked_requests_stay_queued():
    a, b = Req("alice", tag="a"), Req("bob", tag="b")
    picked, fair = run([a, b], blocked=lambda r, p: r.tag == "a")
    assert picked == [b] and len(fair) == 1


def test_room_is_what_the_whole_batch_costs_so_a_row_pays_for_its_padding():
    running = [Req("alice", size=400)]
    waiting = [Req("bob", size=10, tag="b1"), Req("carol", size=10, tag="c1"), Req("dave", size=10, tag="d1")]
    picked, _ = run(waiting, running, room=1000)
    assert [p.tag for p in picked] == ["b1"]  # 2 x 400 fits; a third row of 400 would not
    picked, _ = run(waiting, running, room=1600)
    assert len(picked) == 3  # room for four rows of the longest: all three


def test_a_request_the_room_turns_away_is_not_passed_by_later_ones():
    running = [Req("bob", size=100)]
    waiting = [Req("alice", size=600, tag="long"), Req("carol", size=100, tag="short")]
    picked, fair = run(waiting, running, room=1000)
    assert picked == [] and len(fair) == 2  # carol would fit, but alice's turn comes first
    picked, _ = run(waiting, [], room=1000)
    assert [p.tag for p in picked] == ["long"]  # once the batch drained, alice goes in


def counted(asked):
    def size(a):
        asked["size"] += 1
        return a.size

    return size


def flood_turn(waiting, running, *, max_batch, room):
    """One engine turn under a flood: what `choose` admits, and how often it asked the
    prefix cache (`prefer`) and the engine's own `blocked`."""
    fair = FairQueue()
    for r in running:
        fair.push(r)
        fair.pick(1, lambda a, p, r=r: a is not r)
    for a in waiting:
        fair.push(a)
    asked = {"prefer": 0, "blocked": 0, "size": 0}

    def prefer(a):
        asked["prefer"] += 1
        return a.size

    def blocked(a, picked):
        asked["blocked"] += 1
        return False

    picked = choose(
        fair,
        list(running),
        max_batch=max_batch,
        max_prefill_batch=8,
        room=room,
        size=counted(asked),
        cost=padded,
        blocked=blocked,
        prefer=prefer,
    )
    return picked, fair, asked


def test_a_full_batch_turns_a_flood_away_at_a_glance():
    # the engine asks every turn while the flood waits: a turn must not walk the whole queue
    waiting = [Req(f"user{i % 6}", size=100) for i in range(300)]
    running = [Req("bob", size=950)]
    picked, fair, asked = flood_turn(waiting, running, max_batch=256, room=1000)
    assert picked == [] and len(fair) == 300
    assert asked["prefer"] <= PREFER_AMONG and asked["blocked"] == 0


def test_an_owner_over_their_share_of_a_full_batch_is_turned_away_at_a_glance():
    running = [Req("alice") for _ in range(4)]
    waiting = [Req("alice", tag=f"a{i}") for i in range(300)]
    picked, fair, asked = flood_turn(waiting, running, max_batch=4, room=10**9)
    assert picked == [] and len(fair) == 300
    assert asked["prefer"] <= PREFER_AMONG and asked["blocked"] == 0
    # a newcomer still joins over the cap, at once
    picked, _, _ = flood_turn([*waiting, Req("bob", tag="b")], running, max_batch=4, room=10**9)
    assert [p.tag for p in picked] == ["b"]


def test_weighing_a_candidate_does_not_walk_the_batch():
    # room for all, but each owner's prefill share holds most of theirs back: every waiting
    # request is weighed against the room, and each weighing must cost O(1), not O(batch)
    running = [Req(f"user{i % 6}", size=100, prefilled=False) for i in range(6)]
    running += [Req(f"old{i}", size=100) for i in range(100)]
    waiting = [Req(f"user{i % 6}", size=100) for i in range(300)]
    picked, fair, asked = flood_turn(waiting, running, max_batch=512, room=10**9)
    assert picked == [] and len(fair) == 300  # each owner holds their one prompt in prefill
    assert asked["size"] <= len(running) + 2 * len(waiting)
