"""Running a policy: lockstep episodes of a network's policy on problems, for training and placing.

  specs(env)           (time step spec, action spec) of an environment as TensorSpecs.
  collect(env, policy, time_step)   one batch of lockstep episodes through TF-Agents' `PyDriver`
                       with a PyPolicy (the agent's collect policy, compiled); returns the
                       Trajectory [B, T] and its weights (0 on the boundary step). What the
                       training loop (`train.Embedded`) and the Reverb actors (`tfplaceto.rl.actor_process`)
                       collect with.
  CompiledPyPolicy     a TFPolicy (the agent's `collect_policy`) as the PyPolicy `collect` drives:
                       one concrete function of a flat signature, the policy state kept as tensors.
  Actor                runs a network's policy on one problem (greedy or sampled episodes, one
                       compiled function for every call): what the placer, the training loop's
                       model selection and the benchmarks use.
  ReplayPolicy, replay_placement(env, placement)  a placement replayed as an episode (each class
                       placed where it has it): what self-imitation and cloning train on.
  greedy_placements(problem, network, start, starts, seed)  the policy alone: the end placements
                       of greedy episodes (in lockstep); what `placeto_policy` returns and what
                       the learning benchmarks measure.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from tf_agents.drivers import py_driver
from tf_agents.policies import py_policy, tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step

from tfplaceto.policy import observation
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem
from tfplaceto.rl.agent import PlacetoPolicy, as_tensors
from tfplaceto.rl.environment import MEMORY_HEADROOM, PlacementEnvironment


def specs(env: PlacementEnvironment):
    """(time step spec, action spec) of `env` as TensorSpecs."""
    return tensor_spec.from_spec(env.time_step_spec()), tensor_spec.from_spec(env.action_spec())


def collect(env: PlacementEnvironment, policy, time_step):
    """Runs every lane of `env` to the end of its episode with `policy` (a PyPolicy).

    `time_step` must be FIRST for every lane (as `env.reset()` or the previous collect returns).
    Returns (Trajectory [B, T] as numpy, weights [B, T], the next time step (FIRST)).
    """
    steps: list = []
    driver = py_driver.PyDriver(env, policy, [steps.append], max_episodes=env.batch_size)
    time_step, _ = driver.run(time_step, policy.get_initial_state(env.batch_size))
    experience = tf.nest.map_structure(lambda *xs: np.stack(xs, axis=1), *steps)
    weights = (~experience.is_boundary()).astype(np.float32)
    return experience, weights, time_step


class ReplayPolicy(py_policy.PyPolicy):
    """Places each class where `placement` has it: a placement replayed as an episode."""

    def __init__(self, time_step_spec, action_spec, placement: np.ndarray, steps: np.ndarray):
        super().__init__(time_step_spec, action_spec)
        self._devices = np.asarray(placement)[steps].astype(np.int32)  # the device of each step's class

    def _action(self, time_step, policy_state):
        return policy_step.PolicyStep(self._devices[time_step.observation[observation.STEP]], policy_state)


def replay_placement(env: PlacementEnvironment, placement: np.ndarray):
    """(Trajectory [1, T], weights [1, T]): one episode of `env` (one lane, one problem) from its
    initial placement, each class placed where `placement` has it."""
    policy = ReplayPolicy(env.time_step_spec(), env.action_spec(), placement, env.statics[0].steps)
    experience, weights, _ = collect(env, policy, env.reset())
    return experience, weights


def _flat_call(function: tf.types.experimental.ConcreteFunction):
    """`function` as a function of its flat list of input tensors, called without binding them
    to its signature again (`ConcreteFunction._call_flat`). Calling a function normally binds and
    type-checks every input on every call: ~0.4 ms a step of 16 lanes in collection, about half a
    step of the shipped ensemble in `Actor`, and the callers' fixed dtypes and shapes already
    guarantee what it checks."""
    return lambda flat: function._call_flat(flat, function.captured_inputs)


class CompiledPyPolicy(py_policy.PyPolicy):
    """`policy` (a TFPolicy: the agent's `collect_policy`) as a PyPolicy over batched time steps.

    What `PyTFEagerPolicy(policy, use_tf_function=True, batch_time_steps=False)` does (the same
    `policy.action` graph, so the same actions), with less Python per step, which matters when a
    step's graph runs in ~3 ms: `policy.action` is traced once into a concrete function of a flat
    signature (no per-call matching of the nested time step and state against a polymorphic
    function), the time step's arrays are converted once each, and the policy state stays as the
    tensors the function returned (the driver only hands it back), and the function is called
    flat (`ConcreteFunction._call_flat`: no per-call binding of the inputs to the signature).
    Actions come back as numpy.

    Args:
      policy: a TFPolicy whose time step and state specs are unbatched.
      batch_size: the (fixed) batch of every call; None: any.
    """

    def __init__(self, policy: tf_policy.TFPolicy, batch_size: int | None = None):
        super().__init__(policy.time_step_spec, policy.action_spec, policy.policy_state_spec, policy.info_spec)
        self._policy = policy
        self._inputs = (policy.time_step_spec, policy.policy_state_spec)
        self._outputs = policy_step.PolicyStep(policy.action_spec, policy.policy_state_spec, policy.info_spec)
        batched = lambda spec: tf.TensorSpec((batch_size,) + tuple(spec.shape), spec.dtype)  # noqa: E731
        signature = [batched(spec) for spec in tf.nest.flatten(self._inputs)]

        @tf.function(input_signature=signature, autograph=False)
        def step(*flat):
            time_step, state = tf.nest.pack_sequence_as(self._inputs, list(flat))
            return tf.nest.flatten(policy.action(time_step, state))

        self._step = _flat_call(step.get_concrete_function())

    def _get_initial_state(self, batch_size):
        return self._policy.get_initial_state(batch_size)

    def _action(self, time_step, policy_state):
        flat = [tf.constant(x) for x in tf.nest.flatten(time_step)] + tf.nest.flatten(policy_state)
        action, state, info = tf.nest.pack_sequence_as(self._outputs, self._step(flat))
        return policy_step.PolicyStep(tf.nest.map_structure(np.asarray, action), state, info)


class Actor:
    """Runs a network's policy on one problem: greedy or sampled episodes from given starts.

    One compiled function (batch size free, greedy or sampled chosen by an argument) serves
    every call, so a placer that runs the policy many times traces it once. Greedy steps choose
    as the network's `greedy` says (`agent.greedy_actions`); sampling uses the policy's own
    seeded generator (`PlacetoPolicy`). With `memory_headroom`, a class is not put where it would
    fill a device past that share of its memory while another device has room (the memory mask
    of `PlacementEnvironment`; none by default here, `MEMORY_HEADROOM` for the policy alone).
    """

    def __init__(self, problem: Problem, network: PlacetoNetwork, seed: int = 0,
                 memory_headroom: float | None = None):
        self._problem = problem
        self._seed = seed
        self._memory_headroom = memory_headroom
        self._acting = network.acting
        probe = PlacementEnvironment(problem)
        self._dims = probe.dims
        statics = as_tensors(observation.pack(probe.statics, probe.dims))
        policy = PlacetoPolicy(*specs(probe), network, statics, seed=seed)
        batched = lambda spec: tf.TensorSpec((None,) + tuple(spec.shape), spec.dtype)  # noqa: E731
        signature = [tf.nest.map_structure(batched, policy.time_step_spec),
                     tf.nest.map_structure(batched, policy.policy_state_spec), tf.TensorSpec((), tf.bool)]

        @tf.function(input_signature=signature, autograph=False)
        def act(time_step, state, greedy):
            logits, state = policy.logits(time_step, state)
            # Drawn when greedy too: the generator's state then depends on the steps taken alone.
            sampled = tf.argmax(logits + policy.gumbel_noise(tf.shape(logits)), axis=-1, output_type=tf.int32)
            return tf.where(greedy, policy.greedy_actions(logits), sampled), state

        call = _flat_call(act.get_concrete_function())  # traced here: building an Actor is its whole warm-up
        self._policy = policy
        self._act = lambda *args: call(tf.nest.flatten(args))

    def episodes(self, start="random", count: int = 1, greedy: bool = True, window: int | None = None,
                 seed: int | None = None, forced: list[dict[int, int]] | None = None,
                 deadline: float | None = None, window_sees: bool = False,
                 window_at: np.ndarray | None = None) -> list[np.ndarray]:
        """End placements of `count` episodes in lockstep from `start` (see PlacementEnvironment's
        `initial`); `window`: re-place only that many consecutive classes (`window_sees`,
        `window_at`: as PlacementEnvironment has them); `seed`: of the starts and windows
        (default: the actor's); `forced`: per episode, {step: device} choices made for the policy
        (a diagnostic: does the policy carry a deviation down its branch?); `deadline` (a
        `time.perf_counter()` value): no step is taken after it, and the episodes cut there
        return their placements as they are (the classes not yet visited where the start had
        them), so a placer's time budget bounds an episode to one step past it."""
        seed = self._seed if seed is None else seed
        env = PlacementEnvironment(self._problem, batch_size=count, initial=start, seed=seed, window=window,
                                   window_sees=window_sees, window_at=window_at, dims=self._dims,
                                   memory_headroom=self._memory_headroom, **self._acting)
        if not self._run(env, greedy, forced, deadline):
            return env.placements()
        return [summary["placement"] for summary in env.pop_summaries()]

    def disagreements(self, placement: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """The steps (classes, by their position in the topological order) where the greedy
        policy would put the class elsewhere than `placement` has it, every class before it
        being where `placement` has it: one whole episode replaying `placement`, the policy's
        own choice at each step recorded and not taken. Where the policy would change a
        placement, given everything before that point (the greedy policy's own end placement has
        none). Those found by `deadline` when it cuts the episode."""
        env = PlacementEnvironment(self._problem, initial=placement, dims=self._dims,
                                   memory_headroom=self._memory_headroom, **self._acting)
        devices = np.asarray(placement)[env.statics[0].steps]
        chosen: list[tuple[int, int]] = []
        replay = {t: int(devices[t % len(devices)]) for t in range(len(devices) * env.passes)}
        self._run(env, True, [replay], deadline, chosen)
        return np.unique([step for step, device in chosen if device != devices[step]]).astype(np.int64)

    def _run(self, env: PlacementEnvironment, greedy: bool, forced, deadline: float | None,
             chosen: list | None = None) -> bool:
        """Runs every lane of `env` to its end (False: cut by `deadline`); `chosen`: a list the
        first lane's (step, the policy's own choice) is appended to at every step."""
        step = env.reset()
        state = self._policy.get_initial_state(env.batch_size)
        greedy = tf.constant(greedy)
        t = 0
        while not step.is_last().all():
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            action, state = self._act(tf.nest.map_structure(tf.constant, step), state, greedy)
            action = action.numpy().copy()
            if chosen is not None:
                chosen.append((int(step.observation[observation.STEP][0]), int(action[0])))
            for lane, choices in enumerate(forced or ()):
                if t in choices and step.observation[observation.ACTION_MASK][lane, choices[t]]:
                    action[lane] = choices[t]
            step = env.step(action)
            t += 1
        return True


def greedy_placements(problem: Problem, network: PlacetoNetwork, start="random", starts: int = 1,
                      seed: int = 0, memory_headroom: float | None = MEMORY_HEADROOM) -> list[np.ndarray]:
    """The policy alone: the end placements of `starts` greedy episodes (in lockstep) from
    `start` ("random": random placements drawn with `seed`; "single"; "baseline"; an array),
    kept off a device a class would fill past `memory_headroom` of its memory while another has
    room (None: no such mask; `PlacementEnvironment`).

    No search and no climbing: a policy that changes nothing returns its start.
    """
    return Actor(problem, network, seed, memory_headroom).episodes(start, starts, greedy=True, seed=seed)
