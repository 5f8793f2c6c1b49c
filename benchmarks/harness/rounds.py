"""What a soak run reads off its daemons' round histories: merging groups, splits, and rounds that got stuck.

A daemon checkpoints its last 50 rounds (swarmd.metrics round_history: the round, its participation, its end in s
since the process started, merged_block: the peer ids the merge took). RoundLog gathers them as the run goes;
merge_groups, splits and stuck_rounds read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from benchmarks.harness.daemons import history
from swarmd.tools.launch import PeerProc


class RoundLog:
    """Round-history entries by (peer index, round): read(peers, t0_wall) adds what each checkpoint holds now, each
    entry with "t" (s since t0_wall), "block", "peer" and "process" (the process's started_wall)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], dict] = {}

    def read(self, peers: Iterable[PeerProc], t0_wall: float) -> None:
        for p in peers:
            for h in history(p):
                if "round" in h:
                    key = (p.index, int(h["round"]))
                    process = round(h["wall"] - h.get("at_s", 0.0), 1)
                    self.entries[key] = dict(h, t=h["wall"] - t0_wall, block=p.block, peer=p.index, process=process)

    def by_block_round(self) -> dict[int, dict[int, list[list[str]]]]:
        """block -> round -> the merged_block sets its peers reported for that round."""
        out: dict[int, dict[int, list[list[str]]]] = {}
        for (_, r), e in sorted(self.entries.items()):
            if e.get("merged_block"):
                out.setdefault(e["block"], {}).setdefault(r, []).append(list(e["merged_block"]))
        return out

    def processes(self) -> dict[tuple[int, float], list[tuple[int, float]]]:
        """(peer, process) -> [(round, t of its end), ...] in round order."""
        out: dict[tuple[int, float], list[tuple[int, float]]] = {}
        for (peer, r), e in sorted(self.entries.items()):
            out.setdefault((peer, e["process"]), []).append((r, e["t"]))
        return out


def merge_groups(merged: list[list[str]]) -> list[list[str]]:
    """One block's merging groups in one round: the connected components of the peers' merged sets (two sets that
    share a peer are one group), each sorted, largest first."""
    groups: list[set[str]] = []
    for ids in merged:
        s = set(ids)
        touching = [g for g in groups if g & s]
        for g in touching:
            s |= g
            groups.remove(g)
        groups.append(s)
    return sorted((sorted(g) for g in groups), key=lambda g: (-len(g), g))


def splits(rounds: dict[int, list[list[str]]], heal_within: int = 3) -> list[dict]:
    """The splits of one block: runs of consecutive observed rounds in which its peers merged in two or more
    disjoint groups, each {"first_round", "last_round", "rounds" (how many it lasted), "groups" (of its first
    round), "healed" (a round of one group followed), "unhealed" (it lasted more than heal_within rounds)}."""
    out: list[dict] = []
    run: dict | None = None
    ordered = sorted(rounds)
    for i, r in enumerate(ordered):
        groups = merge_groups(rounds[r])
        contiguous = run is not None and i > 0 and ordered[i - 1] == run["last_round"] and r == run["last_round"] + 1
        if len(groups) > 1:
            if run is not None and contiguous:
                run["last_round"], run["rounds"] = r, run["rounds"] + 1
            else:
                run = {"first_round": r, "last_round": r, "rounds": 1, "groups": groups, "healed": False}
                out.append(run)
        elif run is not None:
            run["healed"] = run["healed"] or contiguous
            run = None
    for s in out:
        s["unhealed"] = s["rounds"] > heal_within
    return out


def stuck_rounds(
    processes: dict[tuple[int, float], list[tuple[int, float]]],
    limit_s: float,
    excused: dict[int, list[tuple[float, float]]] | None = None,
) -> tuple[list[dict], list[dict]]:
    """(stuck, excused): the rounds whose end came more than limit_s after the previous round's end of the same
    process (a process's first round is not timed: its start includes the daemon's), each {"peer", "round",
    "seconds", "t"}; a round of a peer that overlaps one of its excused (start, end) spans (it was paused) is
    listed in excused instead."""
    stuck: list[dict] = []
    spared: list[dict] = []
    for (peer, _), ends in processes.items():
        for (_, t_prev), (r, t) in itertools.pairwise(ends):
            if t - t_prev <= limit_s:
                continue
            row = {"peer": peer, "round": r, "seconds": round(t - t_prev, 1), "t": round(t, 1)}
            spans = (excused or {}).get(peer, [])
            (spared if any(a < t and b > t_prev for a, b in spans) else stuck).append(row)
    return stuck, spared
