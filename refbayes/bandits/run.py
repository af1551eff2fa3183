"""The bandit run loop (Duran-Martin et al. 2022, Algorithm 1, "Online-Eval").

Warm-up: arms pulled round-robin for N_a * n_warmup_per_arm steps; the agent
initialises its belief from that data; then for each later step it observes
s_t, chooses a_t, receives y_t and updates. The record keeps every step's
action, reward and expected regret and the wall-clock time of each online step
(choose + update).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from .._progress import Progress

if TYPE_CHECKING:
    from .agents import Agent
    from .environments import BanditEnvironment

__all__ = ["BanditResult", "run_bandit", "compare_agents"]


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


@dataclass(frozen=True, eq=False)
class BanditResult:
    """Record of one run.

    actions (T,) int, rewards (T,), regrets (T,) expected regret per step,
    step_times (T - T_w,) seconds per online step, init_time seconds for
    Agent.InitBelief, n_warmup T_w, count_warmup: whether totals include the
    warm-up steps (the authors' code does; Algorithm 1 does not).
    """

    agent: str
    env: str
    actions: np.ndarray
    rewards: np.ndarray
    regrets: np.ndarray
    step_times: np.ndarray
    init_time: float
    n_warmup: int
    count_warmup: bool = True

    def _counted(self, arr):
        return arr if self.count_warmup else arr[self.n_warmup:]

    @property
    def total_reward(self) -> float:
        """Sum of the counted rewards (warm-up included when ``count_warmup``)."""
        return float(np.sum(self._counted(self.rewards)))

    @property
    def total_regret(self) -> float:
        """Sum of the counted per-step regrets (best arm's mean reward minus the pulled arm's)."""
        return float(np.sum(self._counted(self.regrets)))

    @property
    def mean_step_time(self) -> float:
        """Mean seconds per online step."""
        return float(np.mean(self.step_times)) if self.step_times.size else 0.0

    def cumulative_reward(self) -> NDArray[np.float64]:
        """(T,) or (T - T_w,) running total of the counted rewards."""
        return np.cumsum(self._counted(self.rewards))

    def cumulative_regret(self) -> NDArray[np.float64]:
        """(T,) or (T - T_w,) running total of the counted regrets."""
        return np.cumsum(self._counted(self.regrets))


def run_bandit(env: BanditEnvironment, agent: Agent, rng: np.random.Generator, n_warmup_per_arm: int = 20,
               count_warmup: bool = True, progress: bool = False) -> BanditResult:
    """Run ``agent`` on ``env`` (Algorithm 1). Returns a BanditResult.

    rng drives the agent (initialisation and Thompson draws); the environment
    is a fixed table. n_warmup_per_arm: N_w pulls per arm in the warm-up.
    """
    _check_rng(rng)
    for attr in ("init", "choose", "update"):
        if not callable(getattr(agent, attr, None)):
            raise TypeError(f"agent must have init/choose/update (missing {attr!r}); got {type(agent).__name__}")
    warm = env.warmup(n_warmup_per_arm)
    T, Tw = env.n_steps, warm.n_steps
    actions = np.empty(T, dtype=np.int64)
    actions[:Tw] = warm.actions
    t0 = time.perf_counter()
    state = agent.init(warm, rng)
    init_time = time.perf_counter() - t0
    times = np.empty(T - Tw)
    with Progress(T - Tw, getattr(agent, "name", "agent"), enabled=progress) as bar:
        for t in range(Tw, T):
            s = env.contexts[t]
            t1 = time.perf_counter()
            a = agent.choose(state, s, rng)
            y = env.reward(t, a)
            state = agent.update(state, s, a, y, rng)
            times[t - Tw] = time.perf_counter() - t1
            actions[t] = a
            bar.advance()
    idx = np.arange(T)
    rewards = env.rewards[idx, actions]
    regrets = env.mean_rewards.max(axis=1) - env.mean_rewards[idx, actions]
    return BanditResult(getattr(agent, "name", type(agent).__name__), env.name, actions, rewards, regrets, times,
                        init_time, Tw, bool(count_warmup))


def compare_agents(make_env: Callable[[np.random.Generator], BanditEnvironment], agents: Mapping[str, Agent],
                   seeds: Iterable[int], n_warmup_per_arm: int = 20, count_warmup: bool = True,
                   progress: bool = False) -> dict[str, Any]:
    """Run several agents over several seeds; every agent sees the same environments.

    make_env(rng) -> BanditEnvironment; agents: dict name -> Agent; seeds:
    iterable of ints. For seed s the environment uses default_rng([s, 0]) and
    every agent default_rng([s, 1]). Returns {name: {"rewards": [...],
    "regrets": [...], "step_time": [...], "init_time": [...],
    "reward_mean", "reward_std", "step_time_mean", "step_time_std"}} plus the
    list of BanditResults under "_results".
    """
    out = {name: {"rewards": [], "regrets": [], "step_time": [], "init_time": []} for name in agents}
    results = []
    for seed in seeds:
        env = make_env(np.random.default_rng([int(seed), 0]))
        for name, agent in agents.items():
            res = run_bandit(env, agent, np.random.default_rng([int(seed), 1]), n_warmup_per_arm, count_warmup,
                             progress)
            results.append(res)
            rec = out[name]
            rec["rewards"].append(res.total_reward)
            rec["regrets"].append(res.total_regret)
            rec["step_time"].append(res.mean_step_time)
            rec["init_time"].append(res.init_time)
    for rec in out.values():
        for key in ("rewards", "step_time"):
            arr = np.asarray(rec[key])
            stem = "reward" if key == "rewards" else key
            rec[f"{stem}_mean"] = float(arr.mean())
            rec[f"{stem}_std"] = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    out["_results"] = results
    return out
