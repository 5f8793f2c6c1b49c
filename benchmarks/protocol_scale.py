"""Protocol at scale, simulated: group averaging among 1,000 and 10,000 virtual peers (swarmd.sim.protocol).

No training: virtual peers start 1e-2 apart with deltas of the tiny model's real shapes, then run the daemon's
grouping, codec with error feedback and robust merge on a virtual clock with a regime's dropout. Per size: bytes per
peer per round, rounds to consensus < 1e-3, virtual exchange seconds, DHT operations per peer per round. Writes --out
and its --section of --md; --levels-sweep PEERS: the anchored payload's int8 step instead.

    python benchmarks/protocol_scale.py --sizes 1000 10000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.harness import daemons, options, results
from swarmd.averaging.config import GROUP_LAYOUTS
from swarmd.sim.protocol import DHT_OPS_PER_ROUND, ProtocolConfig, simulate


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--regime", default="wan-mid")
    p.add_argument("--merge", default="robust", choices=["robust", "mean"])
    p.add_argument("--group-layout", default="grid", choices=GROUP_LAYOUTS, help="GossipConfig.group_layout")
    options.add_outputs(p, "protocol_scale.json", results.BENCHMARKS)
    options.add_section(p, "protocol_scale.py")
    levels = "instead: the anchored payload's int8 step (rms / 4, 16, 64, absmax / 127) at PEERS peers: bytes against "
    levels += "the consensus distance (writes protocol_scale_levels.json)"
    p.add_argument("--levels-sweep", type=int, default=0, metavar="PEERS", help=levels)
    return p.parse_args(argv)


def levels_sweep(a) -> None:
    """Bytes and consensus of the anchored payload's int8 step rule (groups.OFFSET_INT8_RMS_LEVELS)."""
    from swarmd.averaging import groups

    chosen, rows = groups.OFFSET_INT8_RMS_LEVELS, []
    try:
        for levels in (4.0, 16.0, 64.0, None):
            groups.OFFSET_INT8_RMS_LEVELS = levels
            out = simulate(protocol_config(a, a.levels_sweep, regime="lockstep"), daemons.TINY_CFG)
            r = {"levels": levels, "bytes_per_peer_round": out["bytes_per_peer_round"], **final_distances(out)}
            r["rounds_to_1e-3"], to_1e4 = out["rounds_to_1e-3"], [out[k]["rounds_to_1e-4"] for k in ("block", "table")]
            rows.append(r | {"rounds_to_1e-4": None if None in to_1e4 else max(to_1e4)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        groups.OFFSET_INT8_RMS_LEVELS = chosen
    command = results.command_line("protocol_scale.py", None)
    levels_json = {"command": command, "rows": rows, "chosen": chosen}
    results.write_json(a.out.with_name("protocol_scale_levels.json"), levels_json)
    base = rows[0]["bytes_per_peer_round"]
    head = "levels | bytes per peer per round | vs levels 4 | distance after the last round (block / table) "
    head += "| rounds to 1e-3 | rounds to 1e-4"
    table = []
    for r in rows:
        name = "absmax / 127" if r["levels"] is None else f"rms / {r['levels']:g}"
        table.append(
            f"{name} | {r['bytes_per_peer_round']:,.0f} | {r['bytes_per_peer_round'] / base:.2f}x "
            f"| {r['final_distance_block']:.1e} / {r['final_distance_table']:.1e} | {r['rounds_to_1e-3']} "
            f"| {r['rounds_to_1e-4']}"
        )
    lines = results.paragraphs(
        f"### The anchored payload's int8 step: bytes against agreement ({a.levels_sweep} virtual peers)",
        f"Command: `{command}`",
        f"swarmd.sim.protocol, {a.rounds} rounds, k = {a.group_size}, regime lockstep (no dropout), {a.merge} "
        "merge. The int8 step of a row is max(absmax / 127, rms / levels); a plain delta uses levels 4. An "
        "anchored payload (offset + delta) carries the drift since the anchor, so a coarse step leaves a floor "
        f"of int8 noise between the replicas. The daemon uses levels {chosen}.",
        results.table(head, table),
    )
    results.replace_section(a.md, "protocol_scale.py-levels", lines)


def protocol_config(a, peers: int, **kw) -> ProtocolConfig:
    """The ProtocolConfig of --group-size, --rounds, --merge, --regime and --group-layout at `peers` (kw: others)."""
    kw = {"regime": a.regime, "layout": a.group_layout} | kw
    return ProtocolConfig(peers=peers, group_size=a.group_size, rounds=a.rounds, merge=a.merge, **kw)


def final_distances(out: dict) -> dict:
    return {f"final_distance_{k}": out[k]["rounds"][-1]["consensus_distance"] for k in ("block", "table")}


def row_of(out: dict) -> dict:
    """The table row of one simulated size."""
    cfg = out["config"]
    exchange = [r["exchange_s"] for part in ("block", "table") for r in out[part]["rounds"][1:]]
    row = {"peers": cfg["peers"], "replicas_per_block": out["replicas_per_block"], "grid_block": out["block"]["grid"]}
    row |= {"grid_table": out["table"]["grid"], "bytes_per_peer_round": out["bytes_per_peer_round"]}
    row |= {k: out[k] for k in ("all_to_all_bytes_per_peer_round", "rounds_to_1e-3")}
    row |= {f"rounds_to_1e-3_{k}": out[k]["rounds_to_1e-3"] for k in ("block", "table")} | final_distances(out)
    row["exchange_s_median"] = statistics.median(exchange) if exchange else 0.0
    row["dht_ops_per_peer_round"] = DHT_OPS_PER_ROUND  # a count of the daemon's calls, not a measurement
    return row | {
        "records_per_lookup": out["records_per_lookup"],
        "cpu_s": out["block"]["cpu_s"] + out["table"]["cpu_s"],
    }


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)
    if a.levels_sweep:
        levels_sweep(a)
        return
    runs, rows = [], []
    for n in a.sizes:
        runs.append(simulate(protocol_config(a, n), daemons.TINY_CFG))
        rows.append(row_of(runs[-1]))
        print(json.dumps(rows[-1]), flush=True)
    command = results.command_line("protocol_scale.py", argv)
    results.write_json(a.out, {"command": command, "rows": rows, "runs": runs, "machine": results.machine()})
    head = (
        "peers | grid (block / table) | bytes sent per peer per round | all-to-all would send | rounds to "
        "consensus < 1e-3 (block / table) | distance after the last round (block / table) "
        "| exchange s per round (virtual, median) | DHT ops per peer per round | records per lookup"
    )
    lines = results.paragraphs(
        f"### Protocol at scale, simulated: group averaging among {', '.join(f'{n:,}' for n in a.sizes)} virtual peers",
        f"Command: `{command}`",
        f"swarmd.sim.protocol: no training; each virtual peer starts 1e-2 (relative) from the others with a "
        f"random delta of the tiny model's real shapes (block and byte table of benchmarks/scale.py), then "
        f"{a.rounds} rounds of the daemon's {a.group_layout} grouping (k = {a.group_size}), int8 codec with error "
        f"feedback and {a.merge} merge; the virtual clock, latency, bandwidth and dropout of regime `{a.regime}`. "
        "B = 3: one block's replicas are simulated (peers / 3), the byte table over every peer.",
        results.table(head, (size_row(a, r) for r in rows), "rlrrrrrrr"),
        "Bytes per peer stay flat (a group has at most k members whatever the swarm size); the rounds to agree grow "
        "with the grid's dimensions, log_k of the peers. The consensus distance is the worst peer's, dropped peers "
        "(who keep their state that round) included. DHT operations per peer per round are constant (three lookups "
        "and one announce, counted, not simulated; a Kademlia lookup takes O(log N) hops), but a lookup returns "
        "every record of the swarm (the grouping needs the membership): its bytes, the one cost not flat, grow.",
    )
    results.replace_section(a.md, a.section, lines)


def size_row(a, r: dict) -> str:
    """A row of the size table (no grid: the fewest groups of at most k, every round)."""
    grid = "x".join(map(str, r["grid_block"])) + " / " + "x".join(map(str, r["grid_table"]))
    if a.group_layout != "grid":
        grid = f"{a.group_layout}: groups of <= {a.group_size}"
    return (
        f"{r['peers']:,} | {grid} | {r['bytes_per_peer_round']:,.0f} | {r['all_to_all_bytes_per_peer_round']:,.0f} "
        f"| {r['rounds_to_1e-3_block']} / {r['rounds_to_1e-3_table']} "
        f"| {r['final_distance_block']:.1e} / {r['final_distance_table']:.1e} "
        f"| {r['exchange_s_median']:.2f} | {r['dht_ops_per_peer_round']} | {r['records_per_lookup']:,}"
    )


if __name__ == "__main__":
    main()
