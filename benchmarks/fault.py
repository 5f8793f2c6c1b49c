"""Fault tolerance: kill -9 one of 6 daemons mid-exchange; the rest finish the round by the deadline.

6 tiny daemons (B=3 x 2 replicas); the victim (peer 5) gets SIGKILL once it reports "averaging" after --kill-after
merged rounds, then restarts from its checkpoint and must end bit-identical to its replica. Writes
benchmarks/results/fault.json and its section of BENCHMARKS.md:

    python benchmarks/fault.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, results
from swarmd.core import checkpoint as ck
from swarmd.protocol import PeerState
from swarmd.tools.launch import LocalSwarm

CFG = daemons.TINY_CFG
VICTIM = 5


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_schedule(p, rounds=30, steps=10)
    p.add_argument("--kill-after", type=int, default=3, help="kill the victim once it has merged this many rounds")
    p.add_argument("--deadline-max", type=float, default=10.0)
    options.add_outputs(p, "fault.json", results.BENCHMARKS)
    return p.parse_args(argv)


async def kill_mid_exchange(swarm: LocalSwarm, after: int, timeout_s: float = 300) -> int:
    """SIGKILL the victim (its daemon, DHT process and p2pd) once its status says averaging at round >= after;
    the round it died in. Polls its status at 50 Hz."""
    from swarmd.transport import PeerClient

    client, deadline = PeerClient(), time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                st = await client.status(swarm.peers[VICTIM].address, 1.0)
            except Exception:
                st = None
            if st is not None and PeerState.from_pb(st.state) == PeerState.AVERAGING and st.round >= after:
                swarm.kill(VICTIM, signal.SIGKILL)
                return st.round
            await asyncio.sleep(0.02)
    finally:
        await client.close()
    raise SystemExit("victim never reached the averaging state")


async def wait_round(swarm: LocalSwarm, survivors: list[int], round: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sts = await swarm.statuses()
        reached = all(sts[i] is not None and sts[i].round >= round for i in survivors)
        if reached or not any(swarm.peers[i].alive() for i in survivors):
            return
        await asyncio.sleep(0.2)  # polling statuses with a deadline
    raise SystemExit(f"survivors did not reach round {round}")


def main(argv=None) -> None:
    a = parse_args(argv)
    survivors = [i for i in range(6) if i != VICTIM]
    with daemons.tiny_swarm("fault-", 6, a.data_dir, a.rounds, a.steps, deadline_max_s=a.deadline_max) as swarm:
        try:
            swarm.start(timeout_s=300)
            kr = asyncio.run(kill_mid_exchange(swarm, a.kill_after))
            ckpt_round = ck.read_config(swarm.peers[VICTIM].checkpoint_dir)["round"]
            print(f"killed peer {VICTIM} during round {kr} (its checkpoint is at round {ckpt_round})", flush=True)
            asyncio.run(wait_round(swarm, survivors, kr + 1))
            swarm.restart(VICTIM, timeout_s=300)
            resumed = swarm.peers[VICTIM].info.get("round")
            finished = swarm.wait(timeout_s=900)
        finally:
            swarm.stop()
        daemons.check_exit(swarm, finished, "peers failed")
        sums = swarm.summaries()
        replica = VICTIM % CFG.blocks  # peer 2 trains the same block
        identical = daemons.replicas_identical(swarm, [replica, VICTIM], replica)
        resynced = "adopted the block" in swarm.peers[VICTIM].log_path.read_text(errors="replace")
    rows = []
    for i in survivors:
        hist = {h["round"]: h for h in sums[i]["history"]}
        h = hist.get(kr) or {}
        row = {"peer": i, "block": i % CFG.blocks, "kill_round_exchange_s": h.get("seconds")}
        row["kill_round_deadline_s"] = h.get("deadline_s")
        row["participation_before"] = hist[kr - 1]["participation"] if kr - 1 in hist else None
        row["participation_kill_round"] = h.get("participation")
        row["participation_after"] = [hist[r]["participation"] for r in sorted(hist) if r > kr]
        rows.append(row | {"final_round": sums[i]["round"]})
    vhist = sorted(sums[VICTIM]["history"], key=lambda h: h["round"])
    out = {"command": results.command_line("fault.py", argv), "config": CFG.to_dict(), "rounds": a.rounds}
    out |= {"steps_per_round": a.steps, "deadline_max_s": a.deadline_max, "killed_round": kr}
    out |= {"victim_checkpoint_round": ckpt_round, "victim_resumed_at_round": int(resumed) if resumed else None}
    out["survivors"] = rows
    out["all_survivors_within_deadline"] = all(
        r["kill_round_exchange_s"] is not None and r["kill_round_exchange_s"] <= r["kill_round_deadline_s"] + 0.5
        for r in rows
    )
    out["victim_rounds_after_restart"] = [h["round"] for h in vhist]
    out["victim_participation_after_restart"] = [h["participation"] for h in vhist]
    out["victim_first_merge_after_restart_s"] = vhist[0]["at_s"] if vhist else None
    out |= {"victim_resynced": resynced, "victim_final_round": sums[VICTIM]["round"]}
    out |= {"victim_block_identical_to_replica": identical, "machine": results.machine()}
    results.write_json(a.out, out)
    print(json.dumps(out, indent=2))
    results.replace_section(a.md, "fault.py", markdown(out))


def markdown(out: dict) -> list[str]:
    """The fault.py section of a result."""
    rows, kr, ckpt_round, nan = out["survivors"], out["killed_round"], out["victim_checkpoint_round"], float("nan")
    head = (
        "survivor | block | exchange s in kill round | deadline s in force | participation round before "
        "| kill round | rounds after (mean)"
    )
    cells = [
        f"{r['peer']} | {r['block']} | {r['kill_round_exchange_s'] or 0:.2f} | {r['kill_round_deadline_s'] or 0:.2f} "
        f"| {nan if r['participation_before'] is None else r['participation_before']:.3f} "
        f"| {r['participation_kill_round'] or 0:.3f} "
        f"| {sum(r['participation_after']) / len(r['participation_after']) if r['participation_after'] else nan:.3f}"
        for r in rows
    ]
    participation = ", ".join(f"{p:.2f}" for p in out["victim_participation_after_restart"][:5])
    return [
        "### Fault tolerance: kill -9 one of 6 daemons mid-exchange",
        "",
        f"Command: `{out['command']}`",
        "",
        f"6 processes (B=3 x 2 replicas, L_b=1, d=32, seq=32), {out['rounds']} rounds x H={out['steps_per_round']}, "
        f"int8, deadline_max {out['deadline_max_s']:.0f}s. Peer {VICTIM} (block {VICTIM % out['config']['blocks']}) "
        f"got SIGKILL while its status said `averaging` in round {kr} (its last checkpoint: round {ckpt_round}).",
        "",
        *results.table(head, cells, align="r" * 7),
        "",
        f"Every survivor finished the kill round within its deadline: **{out['all_survivors_within_deadline']}**; "
        f"all reached round {min(r['final_round'] for r in rows)}. "
        f"The victim restarted from its checkpoint (round {ckpt_round}), re-synced from its replica "
        f"({'adopted the reference state' if out['victim_resynced'] else 'no pull needed'}), "
        f"merged rounds {out['victim_rounds_after_restart'][:3]}... up to {out['victim_final_round']} "
        f"with participation {participation}; "
        f"its final block is bit-identical to its replica's: **{out['victim_block_identical_to_replica']}**.",
        "",
        "Participation counts (peer, kind) deltas expected from the DHT records at round start: the dead peer's "
        "record stays until its TTL (15 s) expires, and it is banned after the first failed dial, so the drop shows "
        "in the kill round (and the next one for peers it was supposed to dial).",
        "",
    ]


if __name__ == "__main__":
    main()
