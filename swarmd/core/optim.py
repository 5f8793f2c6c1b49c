"""ReplicaAdamW: AdamW whose step size is that of the replicas' averaged gradient.

K replicas of a block each run AdamW on their own small batch and average their deltas. Each replica's
second moment v estimates E[g^2] = mu^2 + s^2 of its own batch's gradient (mean mu, noise variance s^2),
so in a coordinate where the noise dominates each replica steps by about mu / s: no more than one
replica alone would, and the average of K such steps is no longer. Synchronous data parallelism at K x
the batch sees the mean of K gradients, whose second moment is mu^2 + s^2 / K, and steps by up to sqrt(K)
more there. ReplicaAdamW gives each replica that denominator from its own moments:

    v_K = m^2 + max(v - m^2, 0) / K        (m, v: the bias-corrected first and second moments)

m^2 stands for mu^2 (its own noise, about (1 - beta1) / (1 + beta1) s^2, bounds the gain at about
sqrt((1 + beta1) / (1 - beta1)), 4.4 at beta1 = 0.9), v - m^2 for s^2. With K = 1 it is AdamW: the step
is torch's own AdamW step, bit for bit. The swarm sets K (set_replicas) to the number of same-block
deltas its last merge counted, own included, so a peer alone, or whose peers' deltas were all refused,
trains exactly as AdamW does. The state (step, exp_avg, exp_avg_sq) is AdamW's, so checkpoints move
between the two freely.

Measured (benchmarks/replica_sim.py, BENCHMARKS.md#replica_sim): with replicas averaging every step it
recovers most of what separates them from synchronous data parallelism (4 replicas: +4.31% -> +1.89% excess
loss after 200 steps). With H=25 local steps between averages the replicas' drift apart costs more and this
does not touch it: it led AdamW for the first ~600 steps and ended 0.023 nats behind at 1,600, its larger steps
in noisy coordinates moving the replicas further apart, so TrainConfig.replica_adam is off by default.
"""

from __future__ import annotations

from typing import Any

import torch


class ReplicaAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay, bias correction) with the denominator of K averaged replicas.

    :param replicas: K (>= 1), changed later with set_replicas; param groups and hyperparameters as AdamW's
    """

    def __init__(self, params: Any, *args: Any, replicas: float = 1.0, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.replicas = 1.0
        self.set_replicas(replicas)

    def set_replicas(self, replicas: float) -> None:
        """K for the next steps: how many replicas' deltas the last merge averaged (1: plain AdamW)."""
        if not replicas >= 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.replicas = float(replicas)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step; K = 1 is torch's AdamW step itself."""
        if self.replicas <= 1.0:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("ReplicaAdamW does not support sparse gradients")
                self._update(p, p.grad, self.state[p], lr, beta1, beta2, eps, decay)
        return loss

    def _update(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        decay: float,
    ) -> None:
        if not state:  # AdamW's own state layout, so either optimizer resumes the other's
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        p.mul_(1 - lr * decay)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m, m2, noise = signal_and_noise(state, beta1, beta2)
        denom = (m2 + noise / self.replicas).sqrt_().add_(eps)
        p.addcdiv_(m, denom, value=-lr)


def signal_and_noise(
    state: dict[str, Any], beta1: float, beta2: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From AdamW's state of one parameter: m (the bias-corrected first moment), m^2 (standing for mu^2) and
    max(v - m^2, 0) (standing for s^2; module doc)."""
    t = float(state["step"])
    m = state["exp_avg"] / (1 - beta1**t)
    v = state["exp_avg_sq"] / (1 - beta2**t)
    m2 = m * m
    return m, m2, (v - m2).clamp_min_(0)


@torch.no_grad()
def replica_gain(
    opt: torch.optim.Optimizer, params: dict[str, torch.Tensor], delta: dict[str, torch.Tensor], replicas: float
) -> dict[str, torch.Tensor]:
    """A round's own delta scaled per coordinate by the step-size ratio of K averaged replicas to one.

    After the K replicas' deltas are averaged, a coordinate where the noise dominates has moved by about
    1 / sqrt(K) of what synchronous data parallelism at K x the batch moves it (module doc); where the signal
    dominates, by as much. Scaling each replica's delta by sqrt((mu^2 + s^2) / (mu^2 + s^2 / K)), with mu^2 and s^2
    from its own AdamW moments at the round's end (ReplicaAdamW's estimate), gives the average that step size
    after the round, so the replicas' local steps (and their drift apart) stay AdamW's. Names without AdamW state
    (buffers, frozen parameters) keep their delta.
    """
    if replicas <= 1:
        return delta
    beta1, beta2 = opt.param_groups[0]["betas"]
    out = {}
    for name, d in delta.items():
        p = params.get(name)
        state = opt.state.get(p, {}) if p is not None else {}
        if "exp_avg" not in state:
            out[name] = d
            continue
        _, m2, noise = signal_and_noise(state, beta1, beta2)
        gain = ((m2 + noise + 1e-30) / (m2 + noise / replicas + 1e-30)).sqrt()
        out[name] = d * gain.to(d.device)
    return out
