"""Assemble BENCHMARKS.md from the fragments the benchmark scripts write under benchmarks/results/.

Each benchmark script writes its JSON and a markdown fragment (tables + the exact command that
produced every figure); this script only concatenates them in issue order:
    python benchmarks/compose.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PARTS = [
    ("Model core: quality, sigma range, memory, throughput (issue 2)", "ISSUE2.md"),
    ("Swarm: gossip, codecs, scale, fault tolerance (issue 3)", "ISSUE3_swarm.md"),
    ("Swarm transport: gRPC stream vs TCP, bytes per codec (issue 3)", "ISSUE3_transport.md"),
    ("Serving across the swarm (issue 4)", "ISSUE4.md"),
    ("Quality at realistic budgets: block-0 fix, messages between blocks (issue 8)", "ISSUE8.md"),
    ("A swarm across hosts: network namespaces, user-space delay (issue 10)", "ISSUE10_netns.md"),
    ("Bad input: exit codes, messages and seconds to the message (issues 10 and 22)", "ISSUE10_bad_input.md"),
    ("Asynchronous network simulator: Tables 4/5 at CPU scale, deadline policies (issue 11)", "ISSUE11_async.md"),
    ("Public-swarm trust: the cost of identities, signatures and the swarm key (issue 9)", "ISSUE9_trust_cost.md"),
    ("Public-swarm trust: robust merge with honest peers, one attacker's reach (issue 9)", "ISSUE9_robust_merge.md"),
    ("Public-swarm trust: the fault matrix against real daemons (issue 9)", "ISSUE9_adversary.md"),
    ("Averaging one tensor: hivemind's averager vs our butterfly all-reduce (issue 12)", "ISSUE12_averaging.md"),
    ("Replicas that pay: outer optimizer and replica efficiency (issue 12)", "ISSUE12_replicas.md"),
    ("No pause for the network: delayed averaging (issue 12)", "ISSUE12_delayed.md"),
    ("Group averaging: 3-24 daemons, 1,000 and 10,000 simulated peers (issue 12)", "ISSUE12_groups.md"),
    ("Depth instrument: per-block trace, KL and depth recovery, screening budgets (issue 19)", "ISSUE19_depth.md"),
    ("Depth that pays: fresher predecessors and the hand-off term (issue 19)", "ISSUE19_finals.md"),
    ("Replicas against synchronous data parallel at the same global batch (issue 20)", "ISSUE20_sync_dp.md"),
    ("Groups that keep quality: the simulator and 12 daemons (issue 20)", "ISSUE20_groups.md"),
    ("Trust without an honest majority: what the checks cost (issue 21)", "ISSUE21_trust.md"),
    ("Fast swarm commands: status, score, generate, dashboard (issue 22)", "ISSUE22_swarm_commands.md"),
    ("The Docker image, built and run for real (issue 22)", "ISSUE22_docker.md"),
]
HEADER = """# BlockTrain benchmarks

Every figure below was measured on this project's development machine: 2 CPU cores shared with
other jobs (load averages of 4-12 during most runs), no GPU, Python 3.11, torch 2.13.0 CPU. Absolute
times are noisy; comparisons are made side by side in one run and quoted as ratios. Each section
names the command that produced it; the raw results are the JSON (and PNG) files next to the
fragments in `benchmarks/results/`. CE is in nats per byte on `../shared/data/wikitext-2/eval.txt`;
BlockTrain CE is always from-noise CE (the Euler sampler from pure noise with the true context).
This file is assembled by `python benchmarks/compose.py`.

The default block changed with issue 8. The quality (issue 2) and swarm-quality (issue 3) sections were
re-measured with it, and their documented-block figures carry the flags that reproduce them. The other
sections of issues 2-4 and 10 (sigma range, memory, transport codecs, scale, fault, serving, netns, bad
input) were measured with the documented block, then the default; their commands now run the new default
block, so their figures would move (the model has one more d x d projection and its own context table per
block; serving hops carry 2d more floats per position). Re-measuring them is open work.

The default changed again with issue 19: every block trains with the hand-off term (`--handoff-loss
prev_byte`) and a later block's peer refreshes its predecessors four times a round (`--predecessor-pulls 4`).
The quality.py commands of the sections before issue 19 carry `--handoff-loss none --predecessor-pulls 1`, which
reproduces their figures; the daemon benchmarks (swarm.py, scale, fault, adversary, serving, ...) run the new
default when re-run, except where a section says it was re-measured.

And once more at issue 19's stop 32: a later block's message input starts at the identity (`--pred-in-init
identity`), not at 0. Block 0 is unchanged (it reads no message). The quality.py commands measured before carry
`--pred-in-init zero`, which reproduces their figures; the daemon benchmarks run the new default when re-run.
In the same stop a later block of a pipelined schedule starts its turn from its predecessor's weights
(`--block-init predecessor`); the pipelined quality.py commands measured before carry `--block-init fresh`.
"""


def main() -> None:
    if len(sys.argv) > 1:  # it takes no options: anything else (--help too) gets the usage, and nothing is written
        raise SystemExit(f"usage: python benchmarks/compose.py  (rewrites BENCHMARKS.md from {RESULTS.name}/*.md)")
    out = [HEADER]
    for title, name in PARTS:
        body = (RESULTS / name).read_text().strip()
        out += [f"\n# {title}\n", body, ""]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
