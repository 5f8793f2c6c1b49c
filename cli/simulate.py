"""`blocktrain simulate`: the asynchronous network simulator (swarmd.sim) on the real training, codec and merge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from cli import flags as f
from cli import options as o
from cli.bounds import AT_LEAST_0, AT_LEAST_1, POSITIVE, UNIT, Bounds
from cli.common import check_data, cli_errors, print_json, resolve_train_eval
from cli.flags import flag
from cli.groups import OptionGroup, with_groups
from swarmd.errors import ConfigError
from swarmd.sim.policies import DEFAULT_TARGET, make_policy, regime_policy

# -- the simulator's flags (this command's only) -------------------------------------------------
SIM = "Simulated network"
RegimeOpt = Annotated[
    str,
    flag(
        "--regime",
        "Network regime: lockstep, async-mild, wan-tight, wan-mid, wan-loose, edge-mid, bad-edge, bad-edge-loose, "
        "or custom (the network flags below, starting from lockstep's).",
        SIM,
    ),
]
Workers = Annotated[int, flag("--workers", "K: virtual workers (replicas) per block.", SIM, bounds=AT_LEAST_1)]
PolicyOpt = Annotated[
    str | None,
    flag(
        "--policy",
        "Deadline policy: lockstep, fixed (the regime's deadline), adaptive (the daemon's), quantile "
        "(a participation target). Default: the regime's own (fixed, or lockstep when it has no deadline).",
        SIM,
        show_default=False,
    ),
]
TargetParticipation = Annotated[
    float,
    flag(
        "--target-participation",
        "The quantile policy's target: fraction of arrivals to wait for.",
        SIM,
        bounds=Bounds(0, 1, lo_open=True),
    ),
]


def custom(name: str, help: str, bounds: Bounds = AT_LEAST_0) -> Any:
    """A network flag of `--regime custom` (None = the lockstep preset's value): `custom: HELP`, in the panel SIM."""
    return flag(name, f"custom: {help}", SIM, bounds=bounds)


ComputeS = Annotated[float | None, custom("--compute-s", "median seconds per local step.")]
ComputeSigma = Annotated[float | None, custom("--compute-sigma", "log-std of the step time.")]
LatencyS = Annotated[float | None, custom("--latency-s", "median one-way latency, seconds.")]
LatencySigma = Annotated[float | None, custom("--latency-sigma", "log-std of the latency.")]
BandwidthKBps = Annotated[float | None, custom("--bandwidth-kbps", "median upload bandwidth, kB/s.", POSITIVE)]
BandwidthSigma = Annotated[float | None, custom("--bandwidth-sigma", "log-std of the bandwidth.")]
Dropout = Annotated[float | None, custom("--dropout", "chance a worker drops out of a round.", UNIT)]
DeadlineX = Annotated[
    float | None,
    custom("--deadline", "fixed deadline as a multiple of a round's median compute time (H x --compute-s).", POSITIVE),
]


@dataclass(frozen=True)
class NetworkSimOptions(OptionGroup):
    """`blocktrain simulate --regime custom`: the network distributions (None = lockstep preset's value)."""

    compute_s: ComputeS
    compute_sigma: ComputeSigma
    latency_s: LatencyS
    latency_sigma: LatencySigma
    bandwidth_kbps: BandwidthKBps
    bandwidth_sigma: BandwidthSigma
    dropout: Dropout
    deadline: DeadlineX

    def regime(self, name: str):
        """The named preset, or with name custom the lockstep preset changed by the flags given (ConfigError)."""
        from swarmd.sim.regimes import PRESETS, custom_regime, regime_named

        given = self.given()
        if name.strip().lower() != "custom":
            preset = regime_named(name)
            if given:
                flags = ", ".join("--" + k.replace("_", "-") for k in given)
                raise ConfigError(f"{flags} need --regime custom (regime {preset.name} is a preset)")
            return preset
        base = PRESETS["lockstep"]
        values: dict[str, Any] = {
            "compute_s": base.compute_s.median,
            "compute_sigma": base.compute_s.sigma,
            "latency_s": base.latency_s.median,
            "latency_sigma": base.latency_s.sigma,
            "bandwidth_kBps": base.bandwidth_Bps.median / 1e3,
            "bandwidth_sigma": base.bandwidth_Bps.sigma,
            "dropout": base.dropout,
            "deadline": base.deadline,
        }
        values.update({("bandwidth_kBps" if k == "bandwidth_kbps" else k): v for k, v in given.items()})
        return custom_regime(**values)


# small sizes by default so a run takes a minute on a CPU; the architecture options stay the project's defaults
SIM_MODEL = o.ModelOptions.with_defaults(d_model=64, layers_per_block=1, seq_len=64)
SIM_TRAIN = o.TrainOptions.with_defaults(batch_size=16)


@with_groups(model=SIM_MODEL, train=SIM_TRAIN, network=NetworkSimOptions)
def simulate(
    *,
    regime: RegimeOpt,
    policy: PolicyOpt = None,
    target_participation: TargetParticipation = DEFAULT_TARGET,
    workers: Workers = 3,
    model: o.ModelOptions,
    steps_per_round: f.StepsPerRound = 20,
    rounds: f.Rounds = 12,
    train: o.TrainOptions,
    codec: f.CodecOpt = f.DEFAULT_CODEC,
    network: NetworkSimOptions,
    data: f.Data = None,
    eval_data: f.EvalData = None,
    eval_tokens: f.EvalTokens = 4096,
    json_out: f.Json = False,
    overlap: f.Overlap = False,
    overlap_steps: f.OverlapSteps = 0,
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
