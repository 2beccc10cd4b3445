"""`PlacementEnvironment`: the Placeto MDP as a batched TF-Agents `PyEnvironment` over Problems.

An episode improves one placement of one graph, one colocation class (node) at a time:
- reset: pick a problem, an initial placement (`initial`: "random" (uniform over the allowed
  accelerators, seeded), "single", "baseline" (the best fast baseline), an int array, a callable
  (problem, rng) -> array, or a tuple of these sampled per episode) and simulate it: T_0, C_0.
- each step: the observation (`tfplaceto.policy.observation`) says which class is being placed and
  what the current placement and its simulated schedule look like; the action is that class's
  device (its colocation tie moves with it); the simulator re-evaluates and the reward is
  r_t = (C_{t-1} - C_t) / C_0, the intermediate improvement.
- the episode visits every class once, in topological order (`order="topological"`) or a random
  order (`"random"`), so sum_t r_t = (C_0 - C_final) / C_0 and the end placement is entirely the
  policy's choice: a policy that changes nothing keeps its (for "random": bad) start. With
  `window=k` an episode visits only k consecutive classes of that order from a random position:
  a re-placement of one region of a given placement (the search's policy perturbations); with
  `window_sees` the classes before the window count as visited, as they would in a whole episode;
  `window_at` names the steps it may begin at (`placeto.policy_perturbation(where_it_differs=True)`:
  where the policy would change the placement, `Actor.disagreements`).
  With `passes=k` the episode goes through that order k times: on a later pass every class is
  placed again with the whole placement of the pass before it known (where a class's consumers
  went, which the first pass has not chosen yet when it places the class).
  With `schedule="visited"` the observation's schedule is that of the visited nodes alone, not
  the whole placement's (the rewards are the whole placement's either way): in topological order
  it is when the nodes placed so far run and the devices are free, with the nodes not yet placed
  (a random start's) left out.
With `memory_headroom=h` a device is masked for a class that would fill it past h x its memory,
by the peak memory of what the episode has placed there (`observation.memory_fits`), unless no
allowed device is left. A problem whose whole graph fits one device within h of the smallest
device's memory is never masked, and its masks are not computed (every family member: the
shipped policy trains as without it). Training and the policy alone (`greedy_placements`,
`method="placeto_policy"`) use `MEMORY_HEADROOM` by default; an `Actor` built without one (the
search's policy windows: the search keeps a fitting placement ahead of any that runs out)
does not. Without it the shipped policy, trained where memory never binds, piled 9 of 12 rows
of six Keras applications at 2-4x batch onto a device they do not fit; with it none runs out,
at 0.936x the best fast baseline (docs/RESULTS.md, session 48).
Cost: C = T without OOM; with OOM, C = T * (1 + oom_penalty * (1 + overflow)), overflow the
largest relative excess of a peak over its device's memory, so an OOM placement is always worse
than the same step time without OOM, and less overflow is better.

Batching: the environment runs `batch_size` episodes (lanes) in lockstep, so one network call
serves every lane. With `same_problem` (the default) all lanes of a batch place the same problem
(sampled per batch), so their episodes have equal length and their returns at each step index are
a baseline for each other; with `shared_start` they also start from the same initial placement
(one draw per batch), so their returns differ by their actions only: the baseline's variance
falls (common random numbers).

Problem sampling: uniform, or with `prioritize=p` a share p of the draws in proportion to each
problem's gap (the mean end cost of its last batch over the best step time simulated for it, less
1), the rest uniform: a curriculum that spends the batches where the policy is furthest from
what has been found (after the "regret" scores of prioritized level replay, Jiang et al., 2021),
not on problems it already places as well as their best. A problem not yet sampled has gap 1.

The TF-Agents contract holds per lane: a step after a lane's LAST time
step resets that lane (its action is ignored) and returns FIRST, so drivers and
`validate_py_environment` run it unchanged.

The environment meets the simulator only through `Problem.simulator()` and the policy only
through the observation arrays of `tfplaceto.policy.observation`; the static arrays of its problems are
`statics` (pack them with `observation.pack` for the network).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from tfplaceto import baselines
from tfplaceto.policy.observation import (
    ACTION_MASK,
    Dims,
    GraphStatics,
    dims_for,
    empty_observations,
    fill_observations,
    graph_statics,
    memory_fits,
    observation_spec,
)
from tfplaceto.problem import Best, Problem  # noqa: F401  (Best re-exported)

Initial = str | np.ndarray | Callable[[Problem, np.random.Generator], np.ndarray]
INITIAL_NAMES = ("random", "single", "baseline")
SCHEDULES = ("placement", "visited")  # what an observation's schedule describes (`schedule`)
# The share of a device's memory a policy fills at most by default (`memory_headroom`). The
# estimate it fills by (`observation.memory_fits`) leaves out transfer times: placements filled
# to 1.0 of it peaked at up to 1.002x in the simulator, to 0.9 at up to 0.902x (four Keras
# applications, docs/RESULTS.md, session 47); the rest of the 5% is for graphs not seen, and for
# what a real GPU's runtime keeps for itself.
MEMORY_HEADROOM = 0.95


def action_spec_for(dims: Dims) -> array_spec.BoundedArraySpec:
    """The action spec of an environment at `dims`: a device index, padded devices included."""
    return array_spec.BoundedArraySpec((), np.int32, 0, dims.devices - 1, name="device")


def placement_cost(step_time_s: float, peak_bytes: np.ndarray, memory_bytes: np.ndarray,
                   oom_penalty: float) -> float:
    """T, or T * (1 + oom_penalty * (1 + overflow)) when a peak exceeds its device's memory."""
    overflow = float(((peak_bytes - memory_bytes) / memory_bytes).max())
    if overflow <= 0:
        return float(step_time_s)
    return float(step_time_s) * (1.0 + oom_penalty * (1.0 + overflow))


def initial_placement(problem: Problem, choice: Initial, rng: np.random.Generator,
                      cache: dict | None = None) -> np.ndarray:
    """One initial placement of `problem` (see the module docstring), tied to its classes."""
    if isinstance(choice, np.ndarray):
        placement = choice
    elif callable(choice):
        placement = choice(problem, rng)
    elif choice == "random":
        placement = baselines.run("random", problem, seed=int(rng.integers(2**31)))
    elif choice in ("single", "baseline"):
        cache = {} if cache is None else cache
        key = (id(problem), choice)
        if key not in cache:
            cache[key] = (baselines.run("single", problem) if choice == "single"
                          else next(iter(baselines.starting_placements(problem).values())))
        placement = cache[key]
    else:
        raise ValueError(f"initial placement must be one of {INITIAL_NAMES}, an array or a "
                         f"callable, got {choice!r}")
    placement = np.asarray(placement, np.int32)
    if placement.shape != (problem.num_nodes,):
        raise ValueError(f"initial placement has shape {placement.shape}, expected ({problem.num_nodes},)")
    return problem.tie(placement)


def _rows_by_problem(lanes: Sequence[_Lane]) -> dict[int, list[int]]:
    """Problem index -> the positions of its lanes in `lanes` (in order)."""
    rows: dict[int, list[int]] = {}
    for row, lane in enumerate(lanes):
        rows.setdefault(lane.problem, []).append(row)
    return rows


class _Lane:
    """One episode's state."""

    problem: int
    statics: GraphStatics
    placement: np.ndarray
    visited: np.ndarray
    order: np.ndarray
    t: int
    cost: float
    initial_cost: float
    initial_step_time: float
    step_time: float
    oom: bool
    start: np.ndarray
    end: np.ndarray
    peak: np.ndarray
    done: bool


class PlacementEnvironment(py_environment.PyEnvironment):
    """The Placeto MDP over one or several Problems, `batch_size` episodes at a time.

    Args:
      problems: a Problem or a sequence of them.
      batch_size: episodes run in lockstep (lanes).
      initial: initial placement: "random", "single", "baseline", an int array (one problem),
        a callable (problem, rng) -> array, or a tuple of these (one sampled per episode).
      order: "topological" or "random" order of the classes in an episode.
      seed: seeds problem sampling, random initial placements and random orders.
      oom_penalty: see the module docstring.
      same_problem: all lanes of a batch place the same problem (sampled per batch).
      window: visit only this many consecutive classes of the order per episode (None: all).
      window_sees: a window's episode begins with the classes before the window marked visited,
        as a whole episode would be when it reaches the window, so a policy with the "placed"
        view sees what lies before the window (its devices, the schedule of its nodes) instead
        of an empty placement.
      window_at: the steps (classes, by their position in the topological order) a window may
        begin at, one drawn per episode (None: any); a window that would run past the last
        class begins early enough to end at it.
      dims: padded observation sizes (default: the smallest that fit `problems`).
      prioritize: share of problem draws made in proportion to the problems' gaps (module
        docstring); 0: uniform.
      passes: how many times an episode visits each class of its order (module docstring).
      schedule: what the observation's schedule (node start and end times, device busy time,
        step time) describes: "placement", the lane's whole current placement; "visited", the
        nodes the episode has visited alone (`Simulator.schedule_batch(active=...)`), which
        does not depend on the devices of the nodes not yet visited (a random start's).
      memory_headroom: mask the devices a class would fill past this share of their memory
        (module docstring); None: only the devices a node is not allowed on are masked.
    """

    def __init__(self, problems: Problem | Sequence[Problem], batch_size: int = 1,
                 initial: Initial | tuple = "random", order: str = "topological", seed: int = 0,
                 oom_penalty: float = 1.0, same_problem: bool = True, dims: Dims | None = None,
                 window: int | None = None, shared_start: bool = False, prioritize: float = 0.0,
                 passes: int = 1, schedule: str = "placement", window_sees: bool = False,
                 window_at: Sequence[int] | None = None, memory_headroom: float | None = None):
        super().__init__(handle_auto_reset=False)
        self._problems = [problems] if isinstance(problems, Problem) else list(problems)
        if not self._problems:
            raise ValueError("PlacementEnvironment needs at least one problem")
        if order not in ("topological", "random"):
            raise ValueError(f"order must be 'topological' or 'random', got {order!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._statics = [graph_statics(p) for p in self._problems]
        self._dims = dims or dims_for(self._statics)
        self._initial = initial if isinstance(initial, tuple) else (initial,)
        self._order_kind = order
        self._rng = np.random.default_rng(seed)
        self._oom_penalty = oom_penalty
        self._same_problem = same_problem
        self._batch = batch_size
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._window = window
        self._window_sees = window_sees
        if window_at is not None and (order != "topological" or not len(window_at)):
            raise ValueError("window_at needs the topological order and at least one step")
        self._window_at = None if window_at is None else np.asarray(window_at, np.int64)
        if passes < 1:
            raise ValueError(f"passes must be at least 1, got {passes}")
        self._passes = passes
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self._schedule_of = schedule
        if not 0.0 <= prioritize <= 1.0:
            raise ValueError(f"prioritize must be in [0, 1], got {prioritize}")
        self._prioritize = prioritize
        if memory_headroom is not None and not memory_headroom > 0:
            raise ValueError(f"memory_headroom must be positive, got {memory_headroom}")
        self._memory_headroom = memory_headroom
        self._memory_binds = [memory_headroom is not None and st.one_device_bytes > memory_headroom * st.memory_bytes.min()
                              for st in self._statics]
        self._gaps = np.ones(len(self._problems))
        self._shared_start = shared_start and same_problem
        self._cache: dict = {}
        self._observation_spec = observation_spec(self._dims)
        self._action_spec = action_spec_for(self._dims)
        self._best = [Best() for _ in self._problems]
        self._lanes = [_Lane() for _ in range(batch_size)]
        self._summaries: list[dict] = []

    # -- specs and state -------------------------------------------------------------------------
    def observation_spec(self) -> dict:
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        return self._action_spec

    @property
    def batched(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def passes(self) -> int:
        return self._passes

    @property
    def schedule(self) -> str:
        return self._schedule_of

    @property
    def dims(self) -> Dims:
        return self._dims

    @property
    def problems(self) -> list[Problem]:
        return self._problems

    @property
    def statics(self) -> list[GraphStatics]:
        return self._statics

    def placements(self) -> list[np.ndarray]:
        """The current placement of every lane (copies)."""
        return [lane.placement.copy() for lane in self._lanes]

    def step_times(self) -> np.ndarray:
        """The current simulated step time of every lane."""
        return np.array([lane.step_time for lane in self._lanes])

    def best_for(self, index: int) -> Best:
        """The best placement simulated so far for `problems[index]`."""
        return self._best[index]

    def pop_summaries(self) -> list[dict]:
        """Figures of the episodes finished since the last call (one dict per episode)."""
        summaries, self._summaries = self._summaries, []
        return summaries

    def get_state(self) -> dict:
        """The random generator's state and the problems' gaps (what a resumed training run
        needs to continue exactly)."""
        return {"rng": self._rng.bit_generator.state, "gaps": self._gaps.tolist()}

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state["rng"]
        self._gaps = np.asarray(state.get("gaps", self._gaps), np.float64)

    @property
    def gaps(self) -> np.ndarray:
        """Each problem's gap (module docstring): what `prioritize` samples by."""
        return self._gaps.copy()

    # -- episodes ----------------------------------------------------------------------------------
    def _simulate(self, lane: _Lane) -> None:
        self._schedule([lane])
        self._evaluate(lane)

    def _schedule(self, lanes: list[_Lane]) -> None:
        """Simulates the lanes' placements: one kernel call per problem among them."""
        for index, rows in _rows_by_problem(lanes).items():
            group = [lanes[row] for row in rows]
            simulator = self._problems[index].simulator()
            starts, ends, peaks = simulator.schedule_batch(np.stack([lane.placement for lane in group]))
            for lane, start, end, peak in zip(group, starts, ends, peaks):
                lane.start, lane.end, lane.peak = start, end, peak

    def _evaluate(self, lane: _Lane) -> None:
        """Step time, OOM and cost of a lane's simulated schedule; offered as the problem's best."""
        problem = self._problems[lane.problem]
        # The fixed costs of a calibrated cluster's step (0 on presets): as Simulator.run counts.
        lane.step_time = (float(lane.end.max()) if len(lane.end) else 0.0) + problem.simulator().overhead_s(
            lane.placement)
        memory = lane.statics.memory_bytes  # the cluster's, as float64 (exact for integer bytes)
        lane.oom = bool((lane.peak > memory).any())
        lane.cost = placement_cost(lane.step_time, lane.peak, memory, self._oom_penalty)
        self._best[lane.problem].offer(lane.step_time, lane.oom, lane.placement)

    def _begin(self, lane: _Lane, index: int, placement: np.ndarray | None = None) -> None:
        statics = self._statics[index]
        lane.problem, lane.statics = index, statics
        lane.placement = (self._draw_start(index) if placement is None else placement).copy()
        lane.visited = np.zeros(statics.num_nodes, np.float32)
        lane.order = (self._rng.permutation(statics.num_steps) if self._order_kind == "random"
                      else np.arange(statics.num_steps))
        if self._window is not None and self._window < statics.num_steps:
            last = statics.num_steps - self._window
            begin = (int(self._rng.integers(last + 1)) if self._window_at is None
                     else min(int(self._rng.choice(self._window_at)), last))
            if self._window_sees and begin:
                lane.visited[np.concatenate([statics.members[s] for s in lane.order[:begin]])] = 1.0
            lane.order = lane.order[begin:begin + self._window]
        lane.order = np.tile(lane.order, self._passes)
        lane.t, lane.done = 0, False
        self._simulate(lane)
        lane.initial_cost, lane.initial_step_time = lane.cost, lane.step_time

    def _draw_start(self, index: int) -> np.ndarray:
        choice = self._initial[int(self._rng.integers(len(self._initial)))]
        return initial_placement(self._problems[index], choice, self._rng, self._cache)

    def _observe(self, step_type: np.ndarray, reward: np.ndarray) -> ts.TimeStep:
        obs = empty_observations(self._dims, self._batch)
        for index, rows in _rows_by_problem(self._lanes).items():  # the lanes of one problem at once
            lanes = [self._lanes[row] for row in rows]
            statics = self._statics[index]
            d = statics.num_devices
            placements = np.stack([lane.placement for lane in lanes])
            if self._schedule_of == "visited":
                starts, ends, step_times = self._visited_schedules(index, lanes, placements)
            else:
                starts, ends = np.stack([lane.start for lane in lanes]), np.stack([lane.end for lane in lanes])
                step_times = np.array([lane.step_time for lane in lanes])
            # Busy time of each (lane, device): one bincount over lane-offset device indices.
            offsets = (np.arange(len(lanes)) * d)[:, None]
            busy = np.bincount((placements + offsets).ravel(), weights=(ends - starts).ravel(),
                               minlength=len(lanes) * d).reshape(len(lanes), d)
            steps = np.array([lane.order[min(lane.t, len(lane.order) - 1)] for lane in lanes])
            fill_observations(obs, np.array(rows), statics, index, steps, placements,
                              np.stack([lane.visited for lane in lanes]), starts, ends, busy,
                              np.stack([lane.peak for lane in lanes]), step_times)
            if self._memory_binds[index]:
                allowed = obs[ACTION_MASK][rows, :d]
                fits = allowed & memory_fits(statics, steps, placements, np.stack([lane.visited for lane in lanes]),
                                             self._memory_headroom)
                obs[ACTION_MASK][rows, :d] = np.where(fits.any(axis=1, keepdims=True), fits, allowed)
        discount = (step_type != ts.StepType.LAST).astype(np.float32)
        return ts.TimeStep(step_type.astype(np.int32), reward.astype(np.float32), discount, obs)

    def _visited_schedules(self, index: int, lanes: list[_Lane], placements: np.ndarray):
        """(starts, ends, step times) of the schedules of the lanes' visited nodes alone: one
        kernel call per visited set among them (in lockstep the lanes of a problem share one)."""
        simulator = self._problems[index].simulator()
        starts, ends = np.empty(placements.shape), np.empty(placements.shape)
        step_times = np.zeros(len(lanes))
        groups: dict[bytes, list[int]] = {}
        for row, lane in enumerate(lanes):
            groups.setdefault(lane.visited.tobytes(), []).append(row)
        for rows in groups.values():
            active = lanes[rows[0]].visited > 0
            starts[rows], ends[rows], _ = simulator.schedule_batch(placements[rows], active=active)
            if active.any():
                step_times[rows] = ends[rows][:, active].max(axis=1)
        return starts, ends, step_times

    def _sample_problem(self) -> int:
        if self._prioritize > 0 and self._rng.random() < self._prioritize:
            return int(self._rng.choice(len(self._problems), p=self._gaps / self._gaps.sum()))
        return int(self._rng.integers(len(self._problems)))

    def _record_gaps(self, lanes: list[_Lane]) -> None:
        """The gap of each problem among `lanes` (episodes that just ended) from their end costs."""
        for index, rows in _rows_by_problem(lanes).items():
            best = self._best[index].step_time_s
            if np.isfinite(best) and best > 0:
                # A floor keeps every problem drawable: one placed as well as its best still drifts.
                self._gaps[index] = max(np.mean([lanes[row].cost for row in rows]) / best - 1.0, 0.01)

    def _reset(self) -> ts.TimeStep:
        shared = self._sample_problem() if self._same_problem else None
        start = self._draw_start(shared) if self._shared_start else None
        for lane in self._lanes:
            self._begin(lane, shared if shared is not None else self._sample_problem(), start)
        return self._observe(np.full(self._batch, ts.StepType.FIRST), np.zeros(self._batch))

    def _step(self, action) -> ts.TimeStep:
        actions = np.asarray(action).reshape(-1)
        if len(actions) != self._batch:
            raise ValueError(f"expected {self._batch} actions, got {len(actions)}")
        if all(lane.done for lane in self._lanes):
            return self._reset()
        step_type = np.full(self._batch, ts.StepType.MID)
        reward = np.zeros(self._batch)
        # Every lane's action first, then the changed placements simulated in one kernel call,
        # then the lanes in order (resets draw from the generator and offers reach the problem's
        # best in lane order, as one lane at a time would).
        previous = [lane.cost for lane in self._lanes]
        moved = [not lane.done and self._act(lane, int(device)) for lane, device in zip(self._lanes, actions.tolist())]
        self._schedule([lane for lane, changed in zip(self._lanes, moved) if changed])
        shared = None
        ended = []
        for row, lane in enumerate(self._lanes):
            if lane.done:  # auto-reset of this lane
                if self._same_problem:
                    shared = self._sample_problem() if shared is None else shared
                self._begin(lane, shared if shared is not None else self._sample_problem())
                step_type[row] = ts.StepType.FIRST
                continue
            if moved[row]:
                self._evaluate(lane)
            # A placement with no cost at all (ops too small to cost) cannot improve: no reward.
            reward[row] = (previous[row] - lane.cost) / lane.initial_cost if lane.initial_cost > 0 else 0.0
            if lane.t >= len(lane.order):
                lane.done = True
                step_type[row] = ts.StepType.LAST
                self._summaries.append(self._summary(lane))
                ended.append(lane)
        self._record_gaps(ended)
        return self._observe(step_type, reward)

    def _act(self, lane: _Lane, device: int) -> bool:
        """Places the lane's current class on `device`; True when its placement changed (to be
        simulated: an unchanged placement needs no simulation)."""
        statics = lane.statics
        step = lane.order[lane.t]
        node = statics.steps[step]
        problem = self._problems[lane.problem]
        if not (0 <= device < problem.num_devices and statics.allowed[node, device]):
            raise ValueError(f"device {device} is masked for node {node} ({problem.graph.names[node]!r})")
        members = statics.members[step]
        lane.visited[members] = 1.0
        lane.t += 1
        if lane.placement[node] == device:
            return False
        lane.placement[members] = device
        return True

    def _summary(self, lane: _Lane) -> dict:
        return {"problem": lane.problem, "initial_step_time_s": lane.initial_step_time,
                "step_time_s": lane.step_time, "oom": lane.oom,
                "improvement": (lane.initial_cost - lane.cost) / lane.initial_cost if lane.initial_cost > 0 else 0.0,
                "steps": len(lane.order), "placement": lane.placement.copy()}
