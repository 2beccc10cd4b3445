"""`PlacementEnvironment`: the Placeto MDP as a TF-Agents `PyEnvironment` over Problems.

One episode improves one placement of one graph, one colocation class at a time:
- reset: pick a problem (uniformly among `problems`, seeded), an initial placement (`initial`:
  "random", "single", a baseline method name, "best" (the best of the fast baselines), an array,
  or a callable; a tuple of them is sampled per episode), simulate it: T_0 and the cost C_0.
- each step: the observation describes the graph, the current placement and the class being
  placed (see `tfplaceto.policy.features`); the action is the device index of that class (its
  colocation tie moves with it: every member of the class goes to the device); the simulator
  re-evaluates and the reward is r_t = (C_{t-1} - C_t) / C_0.
- the episode visits every class once, in topological order (`order="topological"`) or in a
  random order (`"random"`), so sum_t r_t = (C_0 - C_final) / C_0. With `window=k` it visits only
  k consecutive classes of that order, from a random position: a cheap episode that re-places one
  region of the graph (the placer's perturbation moves); the sum of rewards is still the episode's
  improvement. With `polish` (e.g. hill climbing), the placement is polished after the last step
  and the last reward includes the polish's gain: the return is then the improvement of the
  polished result, which is what the placer's perturbation episodes are for. With `gains_only`,
  the only reward is at the last step: max(0, improvement). The search keeps its best placement,
  so a perturbation that ends worse costs it nothing more than one that changes nothing; scoring
  losses would teach the policy to change nothing.
Cost: C = T without OOM; with OOM, C = T * (1 + oom_penalty * (1 + overflow)), overflow the
largest relative excess of a peak over its device's memory: an OOM placement is always worse than
the same step time without OOM, and less overflow is better.

Lookahead (`lookahead=True`): before each action the simulator also evaluates the placement with the
class moved to each allowed device (one batched call); the resulting step times are device features.
Every simulated placement, lookahead included, is a candidate for the problem's `best`
(lexicographic (OOM, step time)), which is what placers return.

The environment meets the simulator only through `Problem.simulator()` (arrays in, arrays out) and
the policy only through the observation arrays of `features.py`. Several environments with the
same `dims` can be batched (`tf_agents.environments.BatchedPyEnvironment`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from tfplaceto.policy import features as F
from tfplaceto.problem import Problem

Initial = str | np.ndarray | Callable[[Problem, np.random.Generator], np.ndarray]


@dataclasses.dataclass
class Best:
    """The best placement simulated so far: lexicographic (oom, step_time_s)."""

    step_time_s: float = np.inf
    oom: bool = True
    placement: np.ndarray | None = None

    def offer(self, step_time_s: float, oom: bool, placement: np.ndarray) -> bool:
        if (oom, step_time_s) < (self.oom, self.step_time_s):
            self.step_time_s, self.oom, self.placement = float(step_time_s), bool(oom), placement.copy()
            return True
        return False


def placement_cost(step_time_s: float, peak_bytes: np.ndarray, memory_bytes: np.ndarray,
                   oom_penalty: float) -> float:
    """T, or T * (1 + oom_penalty * (1 + overflow)) when a peak exceeds its device's memory."""
    overflow = float(((peak_bytes - memory_bytes) / memory_bytes).max())
    if overflow <= 0:
        return float(step_time_s)
    return float(step_time_s) * (1.0 + oom_penalty * (1.0 + overflow))


class PlacementEnvironment(py_environment.PyEnvironment):
    """The Placeto MDP over one or several Problems (module docstring).

    Args:
      problems: a Problem or a sequence of them (one is sampled per episode).
      initial: initial placement: "random", "single", a baseline method name, "best", an int array
        (one problem only), a callable (problem, rng) -> array, or a tuple of these (sampled).
      order: "topological" or "random" order of the classes in an episode.
      window: visit only this many consecutive classes of the order per episode (None: all).
      polish: (problem, placement) -> placement applied after the last step (None: nothing).
      gains_only: reward 0 until the last step, then the improvement if positive, else 0.
      seed: seeds problem sampling, random initial placements, random orders and windows.
      oom_penalty: see the module docstring.
      lookahead: simulate every allowed device for the current class (device features).
      dims: padded observation sizes (default: the smallest that fit `problems`); environments
        batched together need the same dims.
    """

    def __init__(self, problems: Problem | Sequence[Problem], initial: Initial | tuple = "random",
                 order: str = "topological", seed: int = 0, oom_penalty: float = 1.0,
                 lookahead: bool = True, dims: F.Dims | None = None, window: int | None = None,
                 polish: Callable[[Problem, np.ndarray], np.ndarray] | None = None,
                 gains_only: bool = False):
        super().__init__()
        self._problems = [problems] if isinstance(problems, Problem) else list(problems)
        if not self._problems:
            raise ValueError("PlacementEnvironment needs at least one problem")
        if order not in ("topological", "random"):
            raise ValueError(f"order must be 'topological' or 'random', got {order!r}")
        self._statics = [F.graph_statics(p) for p in self._problems]
        self._dims = dims or F.dims_for(self._statics, [p.num_devices for p in self._problems])
        self._initial = initial if isinstance(initial, tuple) else (initial,)
        self._order_kind = order
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._window = window
        self._polish = polish
        self._gains_only = gains_only
        self._rng = np.random.default_rng(seed)
        self._oom_penalty = oom_penalty
        self._lookahead = lookahead
        self._baseline_cache: dict[tuple[int, str], np.ndarray] = {}
        self._observation_spec = F.observation_spec(self._dims)
        self._action_spec = array_spec.BoundedArraySpec((), np.int32, 0, self._dims.devices - 1,
                                                        name="device")
        self._best = [Best() for _ in self._problems]
        self._index = 0

    # -- specs and state -------------------------------------------------------------------------
    def observation_spec(self) -> dict:
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        return self._action_spec

    @property
    def dims(self) -> F.Dims:
        return self._dims

    @property
    def problems(self) -> list[Problem]:
        return self._problems

    @property
    def problem(self) -> Problem:
        """The problem of the current episode."""
        return self._problems[self._index]

    @property
    def placement(self) -> np.ndarray:
        """The current placement (device index of every node)."""
        return self._placement.copy()

    @property
    def step_time_s(self) -> float:
        return self._step_time

    @property
    def initial_step_time_s(self) -> float:
        return self._initial_step_time

    @property
    def oom(self) -> bool:
        return self._oom

    @property
    def best(self) -> Best:
        """The best placement simulated so far for the current episode's problem."""
        return self._best[self._index]

    def best_for(self, index: int) -> Best:
        """The best placement simulated so far for `problems[index]`."""
        return self._best[index]

    # -- episode -----------------------------------------------------------------------------------
    def _initial_placement(self, problem: Problem) -> np.ndarray:
        choice = self._initial[self._rng.integers(len(self._initial))] if len(self._initial) > 1 \
            else self._initial[0]
        if isinstance(choice, np.ndarray):
            placement = choice
        elif callable(choice):
            placement = choice(problem, self._rng)
        elif choice == "best":
            key = (self._index, choice)
            if key not in self._baseline_cache:
                from tfplaceto.baselines import starting_placements

                self._baseline_cache[key] = next(iter(starting_placements(problem).values()))
            placement = self._baseline_cache[key]
        elif choice == "random":
            from tfplaceto.baselines import random_placement

            placement = random_placement.place(problem, seed=int(self._rng.integers(2**31)))
        else:
            key = (self._index, choice)
            if key not in self._baseline_cache:
                from tfplaceto import baselines

                self._baseline_cache[key] = baselines.run(choice, problem)
            placement = self._baseline_cache[key]
        placement = np.asarray(placement, np.int32)
        if placement.shape != (problem.num_nodes,):
            raise ValueError(f"initial placement has shape {placement.shape}, expected "
                             f"({problem.num_nodes},)")
        return problem.tie(placement)

    def _simulate(self) -> None:
        problem = self.problem
        result = problem.simulator().result(self._placement)
        names = result.device_names
        peak = np.array([result.peak_memory_bytes[n] for n in names], np.float64)
        self._sim = F.SimState(result.step_time_s, result.node_start_s, result.node_end_s,
                               np.array([result.busy_s[n] for n in names]), peak)
        self._step_time = result.step_time_s
        self._oom = result.oom
        self._cost = placement_cost(result.step_time_s, peak, problem.memory_bytes, self._oom_penalty)
        self.best.offer(result.step_time_s, result.oom, self._placement)

    def _observe(self) -> dict:
        statics = self._statics[self._index]
        step = self._order[min(self._t, len(self._order) - 1)]
        allowed = self.problem.allowed[statics.steps[step]]
        lookahead_s = lookahead_oom = None
        if self._lookahead and self._t < len(self._order):
            lookahead_s, lookahead_oom = self._look_ahead(statics.members[step], allowed)
        return F.observation(statics, self._dims, self._placement, self._sim, step, self._visited,
                             allowed, lookahead_s, lookahead_oom)

    def _look_ahead(self, members: np.ndarray, allowed: np.ndarray):
        devices = np.flatnonzero(allowed)
        candidates = np.repeat(self._placement[None], len(devices), axis=0)
        candidates[:, members] = devices[:, None]
        steps, _, ooms = self.problem.simulator().run_batch(candidates)
        for k in range(len(devices)):
            self.best.offer(steps[k], ooms[k], candidates[k])
        step_s = np.zeros(len(allowed))
        oom = np.zeros(len(allowed))
        step_s[devices], oom[devices] = steps, ooms
        return step_s, oom

    def _reset(self) -> ts.TimeStep:
        self._index = int(self._rng.integers(len(self._problems)))
        statics = self._statics[self._index]
        self._placement = self._initial_placement(self.problem).copy()
        self._simulate()
        self._initial_cost = self._cost
        self._initial_step_time = self._step_time
        self._order = np.arange(statics.num_steps)
        if self._order_kind == "random":
            self._order = self._rng.permutation(statics.num_steps)
        if self._window is not None and self._window < statics.num_steps:
            begin = int(self._rng.integers(statics.num_steps - self._window + 1))
            self._order = self._order[begin:begin + self._window]
        self._visited = np.zeros(statics.num_nodes, np.float32)
        self._t = 0
        return ts.restart(self._observe())

    def _step(self, action) -> ts.TimeStep:
        statics = self._statics[self._index]
        step = self._order[self._t]
        device = int(action)
        node = statics.steps[step]
        if not (0 <= device < self.problem.num_devices and self.problem.allowed[node, device]):
            raise ValueError(f"device {device} is masked for node {node} "
                             f"({self.problem.graph.names[node]!r})")
        previous = self._cost
        members = statics.members[step]
        self._placement[members] = device
        self._visited[members] = 1.0
        if self._polish is not None and self._t + 1 == len(self._order):
            self._placement = np.asarray(self._polish(self.problem, self._placement.copy()), np.int32)
        self._simulate()
        reward = np.float32((previous - self._cost) / self._initial_cost)
        if self._gains_only:
            last = self._t + 1 == len(self._order)
            reward = np.float32(max(0.0, 1.0 - self._cost / self._initial_cost) if last else 0.0)
        self._t += 1
        if self._t >= len(self._order):
            return ts.termination(self._observe(), reward)
        return ts.transition(self._observe(), reward)

    def get_state(self) -> dict:
        """The random generator's state (what a resumed training run needs to continue exactly)."""
        return {"rng": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state["rng"]

    # -- bookkeeping for loops ---------------------------------------------------------------------
    def episode_summary(self) -> dict:
        """Figures of the current (usually just finished) episode."""
        return {"problem": self._index, "initial_step_time_s": self._initial_step_time,
                "step_time_s": self._step_time, "oom": self._oom,
                "improvement": (self._initial_cost - self._cost) / self._initial_cost,
                "steps": len(self._order)}
