"""Sybils cost something (swarmd.membership.sybil, swarmd.membership.pow): probation, the cap per network range,
the proof of work on a key, and the record field that carries it (old records still parse and verify)."""

from __future__ import annotations

import dataclasses

import pytest

from swarmd.membership.identity import Identity
from swarmd.membership.pow import leading_zero_bits, pow_digest, pow_ok, pow_problem, solve_pow
from swarmd.membership.records import PeerRecord
from swarmd.membership.sybil import (
    NO_ADDRESS,
    Probation,
    address_range,
    counting_by_range,
    counting_records,
)
from swarmd.membership.trust import is_valid, record_bytes, sign_record


# -- probation ------------------------------------------------------------------------------------------------------
def test_a_new_identity_counts_after_k_rounds_of_passed_checks():
    p = Probation(rounds_required=3)
    assert p.on_probation("new")  # never seen
    for r in range(2):
        assert not p.observe(r, passed={"new"}, failed=set())
        assert p.on_probation("new") and p.rounds_left("new") == 2 - r
    assert p.observe(2, passed={"new"}, failed=set()) == {"new"}
    assert not p.on_probation("new") and p.counting(["new", "other"]) == {"new"}


def test_a_round_counts_once_whatever_parts_it_passed_in_and_a_failure_in_either_part_fails_it():
    p = Probation(rounds_required=2)
    p.observe(0, {"a", "b"}, set())  # block part
    p.observe(0, {"a"}, {"b"})  # table part: b failed it
    assert p.rounds_left("a") == 1  # round 0 once
    assert p.rounds_left("b") == 4  # reset, and the next probation is longer: 2 x (1 + 1 failure)
    p.observe(1, {"a"}, set())
    assert not p.on_probation("a")


def test_a_failure_resets_and_lengthens_probation_up_to_a_cap():
    p = Probation(rounds_required=3, max_rounds_required=7)
    p.observe(0, {"x"}, set())
    p.observe(1, {"x"}, set())
    p.observe(2, set(), {"x"})
    assert p.on_probation("x") and p.rounds_left("x") == 6
    p.observe(3, set(), {"x"})
    assert p.rounds_left("x") == 7  # 3 x 3 capped at 7
    for r in range(4, 11):
        p.observe(r, {"x"}, set())
    assert not p.on_probation("x")


def test_an_identity_that_counts_goes_back_on_probation_after_failures_in_a_row():
    p = Probation(rounds_required=1, demote_after=2)
    p.observe(0, {"y"}, set())
    assert not p.on_probation("y")
    p.observe(1, set(), {"y"})
    assert not p.on_probation("y")  # one failure: still counts
    p.observe(2, {"y"}, set())
    p.observe(3, set(), {"y"})
    assert not p.on_probation("y")  # not in a row
    p.observe(4, set(), {"y"})
    assert p.on_probation("y")


def test_a_fresh_swarm_where_everyone_is_new_counts_everyone_after_k_rounds():
    peers = {f"peer{i}" for i in range(5)}
    views = [Probation(rounds_required=3, trusted={me}) for me in sorted(peers)]
    for r in range(3):
        for view in views:  # everyone's deltas pass the one-by-one check: they merge, and the probation advances
            view.observe(r, passed=peers, failed=set())
    assert all(view.counting(peers) == peers for view in views)


def test_probation_is_deterministic_and_bounded():
    a, b = Probation(max_identities=50), Probation(max_identities=50)
    for view in (a, b):
        view.observe(0, {"honest"}, set())
        view.observe(1, {"honest"}, set())
        view.observe(2, {"honest"}, set())
        for r in range(3, 40):  # a flood of fresh identities every round
            view.observe(r, {f"sybil{r}-{i}" for i in range(10)} | {"honest"}, set())
            assert len(view) <= 50
    assert not a.on_probation("honest")  # identities that count are forgotten last
    assert {p for p in a._ids} == {p for p in b._ids}
    assert all(a.rounds_left(p) == b.rounds_left(p) for p in a._ids)


def test_a_checkpoints_rows_give_back_the_same_verdicts_and_malformed_rows_are_skipped():
    before = Probation()
    for r in range(3):
        before.observe(r, {"counts"}, set())
    before.observe(3, {"newcomer"}, {"failed-once"})
    rows = before.to_rows()
    after = Probation(max_identities=3)
    bad = [["x", 1], ["y", *range(8)], [7, 1, 1, 0, 0, 0, False, -1, -1], "row", ["z", 1, 1, 0, 0, 0, 1, -1, -1]]
    assert after.load_rows(rows + bad) == 3 and after.load_rows("not rows") == 0
    assert after.to_rows() == rows
    assert not after.on_probation("counts") and after.on_probation("newcomer")
    assert after.rounds_left("failed-once") == before.rounds_left("failed-once") > 3
    assert Probation(max_identities=2).load_rows(rows) == 2  # bounded as it is when it observes


def test_trusted_and_off():
    assert not Probation(trusted={"me"}).on_probation("me")
    assert not Probation(rounds_required=0).on_probation("anyone")


# -- the cap per range ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("203.0.113.7:50051", "v4:203.0.113.0/24"),
        ("203.0.113.250:1", "v4:203.0.113.0/24"),
        ("127.0.0.1:5000", "v4:127.0.0.0/24"),
        ("10.1.2.3:5000", "v4:10.1.2.0/24"),
        ("[2001:db8:aaaa:bbbb::1]:443", "v6:2001:db8:aaaa::/48"),
        ("[::ffff:198.51.100.9]:80", "v4:198.51.100.0/24"),
        ("[::1]:9", "v6:::/48"),
        ("Peer.Example.org.:80", "name:peer.example.org"),
        ("", NO_ADDRESS),
        ("bad host:x", NO_ADDRESS),
    ],
)
def test_address_range(address, expected):
    assert address_range(address) == expected


def test_the_cap_keeps_the_oldest_known_then_the_lowest_peer_id_per_range():
    addresses = {
        "e": "203.0.113.5:1",
        "d": "203.0.113.6:1",
        "c": "203.0.113.7:1",
        "b": "203.0.113.8:1",
        "z": "198.51.100.1:1",
        "y": "127.0.0.1:2",
        "x": "127.0.0.1:3",
    }
    first_seen = {"e": 0, "d": 5, "c": 5}
    assert counting_by_range(addresses, per_range=2, first_seen=first_seen) == {"e", "c", "z", "x", "y"}
    assert counting_by_range(addresses, per_range=1, first_seen=first_seen) == {"e", "z", "x"}
    assert counting_by_range(addresses, per_range=0) == set(addresses)


def test_counting_records_applies_probation_then_the_cap():
    p = Probation(rounds_required=1)
    p.observe(0, {"old1", "old2", "other"}, set())
    p.observe(1, {"late"}, set())
    records = [
        PeerRecord(pid, addr, 0, 1, 0.0, "c", "b", False, "s")
        for pid, addr in (
            ("late", "203.0.113.1:1"),
            ("old2", "203.0.113.2:1"),
            ("old1", "203.0.113.3:1"),
            ("new", "203.0.113.4:1"),
            ("other", "198.51.100.1:1"),
        )
    ]
    kept = counting_records(records, p, per_range=2)
    assert [r.peer_id for r in kept] == ["old2", "old1", "other"]  # "late" is past probation but younger


# -- proof of work --------------------------------------------------------------------------------------------------
def test_proof_of_work_solves_and_checks():
    me = Identity.generate(bytes(range(32)))
    nonce = solve_pow(me.public_key, 12)
    assert nonce is not None and leading_zero_bits(pow_digest(me.public_key, nonce)) >= 12
    assert pow_ok(me.peer_id, nonce, 12)
    assert pow_ok(me.peer_id, 12345, 0)  # difficulty 0: off
    other = Identity.generate(bytes(range(1, 33)))
    assert not pow_ok(other.peer_id, nonce, 12)  # the work is bound to the key
    assert not pow_ok("not a peer id", nonce, 12)
    assert not pow_ok(me.peer_id, -1, 12) and not pow_ok(me.peer_id, 2**64, 12)
    # a nonce found for 12 bits rarely holds for 20: the check really looks at the bits
    assert pow_ok(me.peer_id, nonce, 20) == (leading_zero_bits(pow_digest(me.public_key, nonce)) >= 20)
    assert solve_pow(me.public_key, 30, max_tries=1000) is None
    with pytest.raises(ValueError):
        solve_pow(me.public_key, 41)


def test_leading_zero_bits():
    assert leading_zero_bits(b"\x00\x00\xff") == 16
    assert leading_zero_bits(b"\x00\x01") == 15
    assert leading_zero_bits(b"\x80") == 0
    assert leading_zero_bits(b"\x00") == 8


def test_the_record_carries_the_nonce_signed_and_old_records_still_parse_and_verify():
    me = Identity.generate(bytes(range(32)))
    base = PeerRecord(me.peer_id, "203.0.113.9:50051", 0, 3, 1.0, "c", "b", False, "s", "e")
    # a record as a peer without the field signs it: no pow_nonce in its value or its signed bytes
    old = sign_record(base, me, 60)
    old_value = old.to_value()
    assert "pow_nonce" not in old_value
    assert b"pow_nonce" not in record_bytes(old)
    parsed = PeerRecord.from_value(old_value)
    assert parsed is not None and parsed.pow_nonce == 0 and is_valid(parsed)
    assert pow_problem(parsed, 0) == "" and pow_problem(parsed, 8) != ""
    # with a proof of work: the nonce travels in the value and is signed
    nonce = solve_pow(me.public_key, 8, start=1)
    assert nonce
    signed = sign_record(dataclasses.replace(base, pow_nonce=nonce), me, 60)
    value = signed.to_value()
    assert value["pow_nonce"] == nonce
    back = PeerRecord.from_value(value)
    assert back is not None and is_valid(back) and pow_problem(back, 8) == ""
    forged = PeerRecord.from_value({**value, "pow_nonce": nonce + 1})
    assert forged is not None and not is_valid(forged)  # the nonce is under the signature
    for bad in (-1, 2**64, 1.5, True, "7"):
        assert PeerRecord.from_value({**value, "pow_nonce": bad}) is None
