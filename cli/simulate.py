"""`blocktrain simulate`: the asynchronous network simulator (swarmd.sim) on the real training, codec and merge."""

from __future__ import annotations

from cli import options as o
from cli.common import check_data, cli_errors, print_json, resolve_train_eval
from cli.groups import with_groups
from swarmd.errors import ConfigError
from swarmd.sim.policies import DEFAULT_TARGET, make_policy, regime_policy

# small sizes by default so a run takes a minute on a CPU; the architecture options stay the project's defaults
SIM_MODEL = o.ModelOptions.with_defaults(d_model=64, layers_per_block=1, seq_len=64)
SIM_TRAIN = o.TrainOptions.with_defaults(batch_size=16)


@with_groups(model=SIM_MODEL, train=SIM_TRAIN, network=o.NetworkSimOptions)
def simulate(
    *,
    regime: o.RegimeOpt,
    policy: o.PolicyOpt = None,
    target_participation: o.TargetParticipation = DEFAULT_TARGET,
    workers: o.Workers = 3,
    model: o.ModelOptions,
    steps_per_round: o.StepsPerRound = 20,
    rounds: o.Rounds = 12,
    train: o.TrainOptions,
    codec: o.CodecOpt = o.DEFAULT_CODEC,
    network: o.NetworkSimOptions,
    data: o.Data = None,
    eval_data: o.EvalData = None,
    eval_tokens: o.EvalTokens = 4096,
    json_out: o.Json = False,
    overlap: o.Overlap = False,
    overlap_steps: o.OverlapSteps = 0,
) -> None:
    """Simulate a swarm of B x K virtual workers under a network regime: real training, codec and merge, virtual clock.

    Only the network and the clock are simulated, so the simulated wall time does not depend on this
    machine's load and a run is reproducible from --seed (one torch thread).
    """
    with cli_errors():
        net = network.regime(regime)  # a bad regime name fails here, before torch loads
        chosen = make_policy(policy or regime_policy(net), net, steps_per_round, target_participation)  # before torch
        if workers < 1 or rounds < 1 or steps_per_round < 1 or eval_tokens < 1:
            raise ConfigError("--workers, --rounds, --steps-per-round and --eval-tokens must be >= 1")
        check_data(data)
        cfg = model.config()
        import torch

        from swarmd.core.data import ByteData
        from swarmd.node.config import peer_train_config
        from swarmd.sim.engine import RoundRecord, SimConfig, simulate

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # bit-identical reruns of a seed
        sim_cfg = SimConfig(
            cfg,
            train.config(peer_train_config(steps_per_round)),
            workers,
            rounds,
            steps_per_round,
            codec,
            eval_tokens,
            overlap=overlap,  # every merge lands late (delayed averaging) ...
            overlap_steps=overlap_steps,  # ... after this many of the next round's steps (0 = all)
        )
        train_path, eval_path = resolve_train_eval(data, eval_data)
        corpus, held_out = ByteData.from_path(train_path, cfg.seq_len), ByteData.from_path(eval_path, cfg.seq_len)

        def on_round(r: RoundRecord) -> None:
            if json_out:
                return
            deadline = "none" if r.deadline_s is None else f"{r.deadline_s:.2f}s"
            print(
                f"round {r.round}/{rounds}: t {r.t_s:8.2f}s  deadline {deadline}  accepted {r.accepted}/{r.workers} "
                f"(dropped {r.dropped}, late {r.late})  sent {r.upload_bytes / 1e6:.2f} MB  ce {r.ce:.4f}",
                flush=True,
            )

        try:
            result = simulate(sim_cfg, net, chosen, corpus, held_out, on_round)
        finally:
            torch.set_num_threads(threads)
        if json_out:
            print_json({**result.to_dict(), "regime_spec": net.to_dict(), "config": cfg.to_dict(), "workers": workers})
        else:
            print(
                f"{net.name} / {chosen.name}: from-noise CE {result.ce_start:.4f} -> {result.ce:.4f}, participation "
                f"{result.participation:.2f}, simulated {result.sim_wall_s:.1f}s, {result.wire_bytes / 1e6:.2f} MB sent"
            )
