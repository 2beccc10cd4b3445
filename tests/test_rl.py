"""The Placeto MDP, the REINFORCE agent, training (learning, determinism, resume), the search and the placer."""

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import gpus, layered, with_gpu_memory

import tfplaceto as tp
from tfplaceto import errors, placeto, search
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.policy.checkpoint import load_policy, save_policy
from tfplaceto.policy.network import MASKED_LOGIT, PlacetoNetwork
from tfplaceto.policy.observation import (
    ACTION_MASK,
    BUSY,
    END,
    PLACEMENT,
    PROBLEM,
    START,
    STEP,
    STEP_TIME,
    VISITED,
    graph_statics,
    memory_fits,
    pack,
)
from tfplaceto.problem import Best, Problem, allowed_devices
from tfplaceto.rl.acting import Actor, greedy_placements
from tfplaceto.rl.agent import as_tensors, greedy_actions
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.rl.train import train


def two_chains(length=3, devices=2, megabytes=1):
    """Chains a0 -> a1 -> ... and b0 -> b1 -> ...: the best placement puts one chain per device."""
    names = [f"{chain}{i}" for chain in "ab" for i in range(length)]
    producers = [c * length + i for c in range(2) for i in range(length - 1)]
    graph = make_op_graph(names, ["MatMul"] * len(names), producers, [megabytes * 10**6] * len(producers),
                          np.arange(len(producers)), [p + 1 for p in producers])
    cluster = tp.Cluster(gpus(devices), name="tiny")
    compute = np.full((len(names), devices), 1e-3)
    return Problem(graph, cluster, compute, allowed_devices(graph, cluster))


def _random_episode(env, seed, record=None):
    """Random allowed actions in every lane until they all end; the rewards [steps, lanes].
    `record`: a list each step's (observation, actions) is appended to."""
    rng = np.random.default_rng(seed)
    step = env.reset()
    rewards = []
    while not step.is_last().all():
        actions = np.array([rng.choice(np.flatnonzero(mask)) for mask in step.observation[ACTION_MASK]], np.int32)
        if record is not None:
            record.append((step.observation, actions))
        step = env.step(actions)
        rewards.append(step.reward.copy())
    return np.array(rewards)


def _recorded(env, seed=0):
    """`_random_episode`'s (observation, actions) of every step."""
    record = []
    _random_episode(env, seed, record)
    return record


@pytest.mark.parametrize("order,window,passes", [("topological", None, 1), ("random", None, 1), ("topological", 6, 1),
                                                 ("topological", None, 2), ("random", 6, 3)])
def test_rewards_sum_to_the_total_improvement(order, window, passes):
    problem = layered(seed=1)
    env = PlacementEnvironment(problem, batch_size=3, initial="random", order=order, seed=4, window=window,
                               passes=passes)
    steps = (window or problem.num_nodes) * passes
    for episode in range(2):
        rewards = _random_episode(env, episode)
        summaries = env.pop_summaries()
        assert len(summaries) == 3 and rewards.shape == (steps, 3)
        for lane, summary in enumerate(summaries):
            assert not summary["oom"] and summary["steps"] == steps
            t0, final = summary["initial_step_time_s"], summary["step_time_s"]
            assert rewards[:, lane].sum() == pytest.approx((t0 - final) / t0, abs=1e-5)
            assert final == pytest.approx(problem.simulator().run(summary["placement"])[0])


def test_prioritized_sampling_draws_problems_by_their_gap_and_resumes_exactly():
    problems = [layered(seed=1), two_chains()]
    env = PlacementEnvironment(problems, batch_size=3, seed=2, prioritize=1.0, shared_start=True)
    assert env.gaps.tolist() == [1.0, 1.0]  # none sampled yet
    _random_episode(env, seed=0)
    index = env.pop_summaries()[0]["problem"]
    ended = [lane.cost for lane in env._lanes]
    assert env.gaps[index] == pytest.approx(max(np.mean(ended) / env.best_for(index).step_time_s - 1, 0.01))
    assert env.gaps[1 - index] == 1.0

    state = {**env.get_state(), "gaps": [4.0, 0.01]}
    env.set_state(state)
    draws = [env._sample_problem() for _ in range(2000)]
    assert 0.99 < draws.count(0) / len(draws) < 1.0  # in proportion: 4.0 to 0.01
    uniform = PlacementEnvironment(problems, batch_size=3, seed=2, prioritize=0.0)
    uniform.set_state(state)
    assert 0.45 < np.mean([uniform._sample_problem() for _ in range(2000)]) < 0.55

    resumed = PlacementEnvironment(problems, batch_size=3, seed=7, prioritize=0.5, shared_start=True)
    resumed.set_state(env.get_state())  # an exact resume: generator and gaps (and the bests,
    for index, best in enumerate(env._best):  # which training restores and offers back itself)
        resumed.best_for(index).offer(best.step_time_s, best.oom, best.placement)
    for _ in range(4):
        _random_episode(env, seed=1)
        _random_episode(resumed, seed=1)
        assert [s["problem"] for s in env.pop_summaries()] == [s["problem"] for s in resumed.pop_summaries()]
        assert env.gaps.tolist() == resumed.gaps.tolist()
    with pytest.raises(ValueError, match="prioritize"):
        PlacementEnvironment(problems, prioritize=1.5)


def test_the_environment_keeps_the_tf_agents_contract():
    from tf_agents.environments import utils

    # Lanes of different problems end at different steps: each resets on its own (auto-reset).
    env = PlacementEnvironment([layered(seed=1), layered(seed=2, depth=3)], batch_size=2, seed=0,
                               same_problem=False)
    utils.validate_py_environment(env, episodes=3)
    step = env.reset()
    kinds = set()
    for _ in range(40):
        step = env.step(np.array([np.flatnonzero(m)[0] for m in step.observation[ACTION_MASK]], np.int32))
        kinds.add(tuple(step.step_type.tolist()))
    assert (0, 1) in kinds or (1, 0) in kinds  # one lane restarted while the other went on


def test_a_window_episode_re_places_consecutive_classes_only():
    problem = layered(seed=2)
    start = np.zeros(problem.num_nodes, np.int32)
    env = PlacementEnvironment(problem, batch_size=4, initial=start, seed=3, window=5)
    statics = graph_statics(problem)
    position = {int(node): k for k, node in enumerate(statics.steps)}  # node -> its step
    step = env.reset()
    rng = np.random.default_rng(0)
    while not step.is_last().all():  # always a device other than 0, so every visited class moves
        step = env.step(np.array([rng.choice(np.flatnonzero(m[1:]) + 1) for m in step.observation[ACTION_MASK]],
                                 np.int32))
    for summary in env.pop_summaries():
        moved = sorted(position[int(n)] for n in np.flatnonzero(summary["placement"] != start))
        assert len(moved) == 5 and moved[-1] - moved[0] == 4


@pytest.mark.parametrize("schedule", ["placement", "visited"])
def test_a_window_that_sees_begins_where_a_whole_episode_reaching_it_would_be(schedule):
    """`window_sees`: the window's first observation is a whole episode's at that step when the
    whole episode has put every class before it where the start has it; without it, nothing is
    visited."""
    problem = layered(seed=2)
    start = np.random.default_rng(1).integers(problem.num_devices, size=problem.num_nodes).astype(np.int32)
    start = problem.tie(start)
    statics = graph_statics(problem)
    whole = PlacementEnvironment(problem, initial=start, schedule=schedule)
    observations, step = [], whole.reset()
    while not step.is_last().all():  # every class placed where the start has it
        observations.append(step.observation)
        step = whole.step(start[statics.steps[step.observation[STEP]]].astype(np.int32))
    begins = []
    for seed in range(4):
        seeing = PlacementEnvironment(problem, initial=start, seed=seed, window=5, window_sees=True,
                                      schedule=schedule).reset().observation
        begin = int(seeing[STEP][0])
        begins.append(begin)
        for key, value in observations[begin].items():
            np.testing.assert_allclose(seeing[key], value, err_msg=key)
        blind = PlacementEnvironment(problem, initial=start, seed=seed, window=5, schedule=schedule).reset()
        assert int(blind.observation[STEP][0]) == begin and not blind.observation[VISITED].any()
    assert max(begins) > 0  # windows that begin after the first class, with something to see


def test_windows_begin_only_at_the_steps_they_are_given():
    problem = layered(seed=2)
    last = graph_statics(problem).num_steps - 1
    at = [3, 9, last]
    begins = set()
    for seed in range(12):
        env = PlacementEnvironment(problem, initial="random", seed=seed, window=4, window_sees=True, window_at=at)
        begins.add(int(env.reset().observation[STEP][0]))
    assert begins == {3, 9, last - 4 + 1}  # a window begun at the last class would run past it
    with pytest.raises(ValueError, match="topological"):
        PlacementEnvironment(problem, order="random", window=4, window_at=at)


def test_the_policy_disagrees_nowhere_with_its_own_greedy_placement_and_first_where_a_class_was_moved():
    """`Actor.disagreements`: a "placed"-view policy's greedy end placement is what it would
    choose at every step; one class moved away from it is the first step it disagrees with, and
    a greedy window that sees what lies before it, begun there, puts the placement back."""
    from tfplaceto.rl.acting import Actor

    problem = layered(seed=3)
    actor = Actor(problem, PlacetoNetwork(view="placed", seed=1), seed=0)
    own = actor.episodes("random", 1, greedy=True, seed=4)[0]
    assert len(actor.disagreements(own)) == 0
    statics, moved_step = graph_statics(problem), 6
    first = statics.steps[moved_step]
    moved = own.copy()
    moved[statics.members[moved_step]] = next(d for d in np.flatnonzero(problem.allowed[first]) if d != own[first])
    differ = actor.disagreements(moved)
    assert differ[0] == moved_step
    repaired = actor.episodes(moved, 1, greedy=True, window=4, window_sees=True, window_at=differ[:1])[0]
    np.testing.assert_array_equal(repaired, own)
    # A policy perturbation that begins where the policy differs draws nothing where the policy
    # would change nothing, and else re-places classes from a disagreement on.
    perturb = placeto.policy_perturbation(actor, window=4, where_it_differs=True)
    assert perturb(np.random.default_rng(0), own, 2) == []
    step_of = np.argsort(statics.step_class)[statics.classes]  # each node's step
    for placement in perturb(np.random.default_rng(0), moved, 8):
        assert step_of[placement != moved].min(initial=moved_step) >= moved_step


def test_oom_is_penalized():
    problem = two_chains()
    small = tp.Cluster(gpus(2, memory=2_500_000), name="small")
    problem = Problem(problem.graph, small, problem.compute_s, problem.allowed)
    env = PlacementEnvironment(problem, initial="single", seed=0)
    env.reset()
    assert env.step_times()[0] == pytest.approx(6e-3)
    statics = env.statics[0]
    rewards = []
    for step in range(statics.num_steps):  # one chain per device: fits
        chain = problem.graph.names[statics.steps[step]][0]
        rewards.append(float(env.step(np.array([int(chain == "b")], np.int32)).reward[0]))
    summary = env.pop_summaries()[0]
    assert not summary["oom"] and sum(rewards) > 0.5  # more than the step-time gain alone (0.5)


def forward_backward(megabytes=(10, 20, 30), gradient_megabytes=1, split=False):
    """A training step's shape: a forward chain f0 -> f1 -> f2 -> loss, then a backward chain
    loss -> g2 -> g1 -> g0 where g_i also reads f_i's activation; f_i holds its weights
    (1 MB of persistent bytes). `split`: f1 keeps a second tensor (5 MB) for g1, which reads
    that instead of f1's activation, and every node has 2 MB of outputs nobody reads (a grouped
    graph's shape: tensors leaving a node at different times, and scratch)."""
    names = ["f0", "f1", "f2", "loss", "g2", "g1", "g0"]
    mb = 10**6
    producers = [0, 1, 2, 3, 4, 5]  # one output tensor per node but g0
    sizes = [m * mb for m in megabytes] + [mb] + [gradient_megabytes * mb] * 2
    reads = [(1, 0), (6, 0), (2, 1), (5, 1), (3, 2), (4, 2), (4, 3), (5, 4), (6, 5)]  # (consumer, tensor)
    output_bytes = None
    if split:
        producers.append(1)
        sizes.append(5 * mb)
        reads[3] = (5, 6)
        output_bytes = np.bincount(producers, sizes, minlength=7).astype(np.int64) + 2 * mb
    graph = make_op_graph(names, ["MatMul"] * 7, producers, sizes, [t for _, t in reads], [c for c, _ in reads],
                          output_bytes=output_bytes, persistent_bytes=[mb] * 3 + [0] * 4)
    cluster = tp.Cluster(gpus(2), name="tiny")
    return Problem(graph, cluster, np.full((7, 2), 1e-3), allowed_devices(graph, cluster))


@pytest.mark.parametrize("megabytes, split", [((10, 20, 30), False), ((30, 30, 5), False), ((30, 30, 5), True)])
@pytest.mark.parametrize("placement", [[0] * 7, [0, 0, 0, 0, 1, 1, 1], [0, 1, 0, 0, 1, 0, 1]])
def test_the_memory_a_class_fits_in_is_the_simulated_peak_of_its_device(megabytes, split, placement):
    problem = forward_backward(megabytes, split=split)
    statics = graph_statics(problem)
    placement = np.array(placement, np.int32)
    last = statics.num_steps - 1  # g0: every other class visited where `placement` has it
    visited = np.ones((1, 7), np.float32)
    visited[0, statics.members[last]] = 0
    device = placement[statics.members[last][0]]
    peak = problem.simulator().run(placement)[1][device]  # the copies of remote activations included

    def fits(limit_bytes):
        headroom = limit_bytes / statics.memory_bytes[device]
        return memory_fits(statics, np.array([last]), placement[None], visited, headroom)[0, device]

    assert fits(peak) and not fits(peak - 1)


def test_a_memory_headroom_keeps_a_class_off_a_device_it_would_fill_while_another_has_room():
    mb = 10**6
    base = forward_backward(megabytes=(30, 30, 5))  # 70 MB at the peak on one device

    def on(memory):
        return Problem(base.graph, tp.Cluster(gpus(2, memory=memory), name="small"), base.compute_s, base.allowed)

    problem = on(66 * mb)

    def first_allowed(headroom):  # a policy that piles everything on the first device it may use
        env = PlacementEnvironment(problem, initial="random", seed=0, memory_headroom=headroom)
        step, masks = env.reset(), []
        while not step.is_last().all():
            masks.append(step.observation[ACTION_MASK][0, :2].copy())
            step = env.step(np.array([np.flatnonzero(masks[-1])[0]], np.int32))
        return env.pop_summaries()[0], np.array(masks)

    piled, masks = first_allowed(None)
    assert piled["oom"] and (piled["placement"] == 0).all() and masks.all()
    placed, masks = first_allowed(0.9)
    assert not placed["oom"] and not masks[:, 0].all()  # the first device was masked once full
    # Where no device has room, every allowed device stays open.
    env = PlacementEnvironment(on(mb), initial="random", seed=0, memory_headroom=0.9)
    assert env.reset().observation[ACTION_MASK][0, :2].all()
    with pytest.raises(ValueError, match="memory_headroom"):
        PlacementEnvironment(problem, memory_headroom=0.0)


def test_the_shipped_policy_alone_splits_a_real_training_step_that_does_not_fit_one_device():
    """A small CNN's training step on two V100s with 3/4 of its one-device peak each: the shipped
    policy, trained where memory seldom binds, piles it on one device unless a memory mask
    keeps it off a full one; the policy alone (`placeto_policy`) has that mask by default."""
    from tfplaceto.rl.train import problems_for

    inputs = tf.keras.Input((32, 32, 3))
    x = inputs
    for i, filters in enumerate([32, 32, 64, 64, 128]):
        x = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    op_graph = tp.import_graph(model, batch_size=128)

    def problem_with(memory_bytes):
        return problems_for([op_graph], [with_gpu_memory("2xV100", memory_bytes)])[0][0]

    one_device = problem_with(10**11)
    peak = one_device.simulator().run(np.zeros(one_device.num_nodes, np.int32))[1][0]
    problem = problem_with(int(0.75 * peak))
    policy = load_policy()
    for mask, runs_out in (({"memory_headroom": None}, True), ({}, False)):
        for placement in greedy_placements(problem, policy, "random", 2, seed=0, **mask):
            assert problem.simulator().run(placement)[2] == runs_out


def test_training_collects_and_selects_with_the_memory_mask_and_replays_without_it(monkeypatch):
    from tfplaceto.rl import acting
    from tfplaceto.rl import train as training

    base = forward_backward(megabytes=(30, 30, 5))
    problem = Problem(base.graph, tp.Cluster(gpus(2, memory=66 * 10**6), name="small"), base.compute_s, base.allowed)
    made = []

    class Recording(PlacementEnvironment):
        def __init__(self, *args, **kwargs):
            made.append((callable(kwargs.get("initial")), kwargs.get("memory_headroom")))  # (a replay, headroom)
            super().__init__(*args, **kwargs)

    for module in (training, acting):
        monkeypatch.setattr(module, "PlacementEnvironment", Recording)
    for headroom in (0.95, None):
        made.clear()
        train(problem, episodes=8, lanes=4, seed=0, hidden=8, rounds=2, progress=False, select_every=1,
              self_imitation=1.0, imitate_baseline=True, memory_headroom=headroom)
        # collection, then model selection's actors' episodes, with the headroom; replays without it
        assert made[0] == (False, headroom) and made.count((False, headroom)) > 1 and (True, None) in made
        assert (True, 0.95) not in made


def test_collection_goes_through_the_collect_policy_and_never_picks_a_masked_device():
    from tf_agents.policies import py_tf_eager_policy

    from tfplaceto.rl.acting import collect, specs
    from tfplaceto.rl.agent import PlacetoPolicy

    problem = layered(seed=2, cpu_only=[0, 5, 9, 13])
    env = PlacementEnvironment(problem, batch_size=3, initial="random", seed=0)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    policy = py_tf_eager_policy.PyTFEagerPolicy(
        PlacetoPolicy(*specs(env), network, as_tensors(pack(env.statics, env.dims)), seed=1),
        use_tf_function=True, batch_time_steps=False)
    time_step = env.reset()
    for _ in range(2):
        experience, weights, time_step = collect(env, policy, time_step)
        assert experience.action.shape == (3, problem.num_nodes + 1)  # the last step is the boundary
        assert weights[:, :-1].all() and not weights[:, -1].any()
        mask = experience.observation[ACTION_MASK][weights > 0]
        assert mask[np.arange(len(mask)), experience.action[weights > 0]].all()
        for summary in env.pop_summaries():
            assert (summary["placement"][[0, 5, 9, 13]] == 2).all()
    step = env.reset()
    while env.statics[0].steps[step.observation[STEP][0]] != 5:
        step = env.step(np.array([2, 2, 2], np.int32))
    with pytest.raises(ValueError, match="masked"):  # node 5 has no kernel on device 0
        env.step(np.array([0, 0, 0], np.int32))


def test_the_compiled_py_policy_acts_as_the_eager_one_and_keeps_its_state_as_tensors():
    # Also with the XLA-compiled scoring of sampled actions (the agent's collect policy's).
    from tf_agents.policies import py_tf_eager_policy

    from tfplaceto.rl.acting import CompiledPyPolicy, collect, specs
    from tfplaceto.rl.agent import PlacetoPolicy

    problem = layered(seed=4)
    runs = []
    for wrap, jit in ((lambda p: py_tf_eager_policy.PyTFEagerPolicy(p, use_tf_function=True, batch_time_steps=False),
                       False), (lambda p: CompiledPyPolicy(p, 4), False), (lambda p: CompiledPyPolicy(p, 4), True)):
        env = PlacementEnvironment(problem, batch_size=4, initial="random", seed=5)
        network = PlacetoNetwork(hidden=8, rounds=2, seed=0, refresh_every=3)
        policy = wrap(PlacetoPolicy(*specs(env), network, as_tensors(pack(env.statics, env.dims)), seed=2,
                                    jit_score=jit))
        time_step, actions = env.reset(), []
        for _ in range(2):
            experience, _, time_step = collect(env, policy, time_step)
            actions.append(experience.action)
        runs.append(actions)
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    step = policy.action(env.reset(), policy.get_initial_state(4))
    assert isinstance(step.action, np.ndarray) and isinstance(step.state["embeddings"], tf.Tensor)


def test_colocated_nodes_move_together():
    problem = layered(seed=3)
    graph = problem.graph
    colocation = np.arange(graph.num_ops)
    colocation[7] = colocation[2]  # nodes 2 and 7 are tied
    tied = make_op_graph(graph.names, graph.types, graph.tensor_producer, graph.tensor_bytes,
                         graph.edge_tensor, graph.edge_consumer, colocation=colocation)
    problem = Problem(tied, problem.cluster, problem.compute_s, allowed_devices(tied, problem.cluster))
    env = PlacementEnvironment(problem, initial="random", seed=1)
    rewards = _random_episode(env, 0)
    assert len(rewards) == problem.num_nodes - 1
    placement = env.pop_summaries()[0]["placement"]
    assert placement[2] == placement[7]


def _policy_alone(network, problem, starts=8):
    """Mean step time of the policy's greedy episodes from random starts."""
    placements = greedy_placements(problem, network, start="random", starts=starts, seed=100)
    return np.mean([problem.simulator().run(p)[0] for p in placements])


@pytest.mark.parametrize("learning_rate,refresh_every", [(1e-2, 1), (1e-2, 8), (0.0, 8)])
def test_the_policy_alone_learns_to_split_two_chains(learning_rate, refresh_every):
    # Chains of 4 ops (1 ms each) with 100 MB (4 ms over NVLink) between consecutive ops: the best
    # placement is one chain per device (4 ms); one device takes 8 ms; a random placement moves
    # tensors ~4 times (~20 ms). Untrained weights miss the best placement; trained ones reach it
    # from random starts, and without the gradient step (learning rate 0) nothing is learned.
    # refresh_every: the paper's embedding at every step, and the default (here one embedding
    # per episode: the steps are scored from the start's embedding and their own device features).
    problem = two_chains(length=4, megabytes=100)
    untrained = _policy_alone(PlacetoNetwork(hidden=16, rounds=2, seed=0, refresh_every=refresh_every), problem)
    result = train(problem, episodes=640, lanes=16, seed=0, hidden=16, rounds=2, refresh_every=refresh_every,
                   learning_rate=learning_rate, progress=False)
    trained = _policy_alone(result.exported_network(), problem)
    assert untrained > 6e-3
    if learning_rate:
        assert trained == pytest.approx(4e-3, rel=0.02)
    else:
        assert trained == pytest.approx(untrained)


def test_the_loss_scores_each_step_from_the_embedding_the_policy_acted_on():
    # With refresh_every=3 the policy embeds at each episode's first step and every 3 steps and
    # scores the steps between from that embedding; the loss must recompute exactly those logits.
    import tensorflow as tf
    from tf_agents.trajectories import time_step as ts

    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoAgent, PlacetoPolicy

    problem = layered(seed=7)
    env = PlacementEnvironment(problem, batch_size=2, initial="random", seed=3)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=1, refresh_every=3)
    statics = as_tensors(pack(env.statics, env.dims))
    policy = PlacetoPolicy(*specs(env), network, statics, seed=0)
    agent = PlacetoAgent(*specs(env), network, statics, max_train_steps=None)
    step, state = env.reset(), policy.get_initial_state(2)
    steps, acted = [], []
    while True:
        time_step = tf.nest.map_structure(tf.constant, step)
        logits, state = policy.logits(time_step, state)
        steps.append(step)
        acted.append(logits.numpy())
        if step.is_last().all():
            break
        step = env.step(np.argmax(acted[-1], -1).astype(np.int32))
    step_type = np.stack([s.step_type for s in steps], axis=1)  # [B, T]
    ages = agent.refresh_ages(tf.constant(step_type)).numpy()
    assert (ages[:, 0] == 0).all() and ages.max() == 2
    for t, s in enumerate(steps):
        origin = {k: tf.constant(np.stack([steps[t - ages[b, t]].observation[k][b] for b in range(2)]))
                  for k in s.observation}
        recomputed = network.score(statics, tf.nest.map_structure(tf.constant, s.observation),
                                   network.embed(statics, origin))
        np.testing.assert_allclose(recomputed.numpy(), acted[t], rtol=1e-5, atol=1e-5)
    valid = tf.constant((step_type != ts.StepType.LAST).astype(np.float32))
    groups, slots, mask = (x.numpy() for x in agent._select(valid, tf.constant(ages), tf.zeros_like(valid)))
    chosen, group = slots[mask > 0], (np.arange(len(slots)) // 3)[mask > 0]  # slot g * 3 + j: group g
    assert sorted(chosen) == list(np.flatnonzero(valid.numpy().reshape(-1)))  # every valid step once
    np.testing.assert_array_equal(groups[group], chosen - ages.reshape(-1)[chosen])  # from its embedding
    # As the loss scores them: each group's one embedding for its 3 slots, the logits acted on.
    observations = {k: np.stack([s.observation[k] for s in steps], axis=1).reshape((-1,) + s.observation[k].shape[1:])
                    for k in steps[0].observation}
    logits = network.score(statics, {k: tf.constant(v[slots]) for k, v in observations.items()},
                           network.embed(statics, {k: tf.constant(v[groups]) for k, v in observations.items()}))
    acted_flat = np.stack(acted, axis=1).reshape(-1, acted[0].shape[-1])  # [B * T, D]
    np.testing.assert_allclose(logits.numpy()[mask > 0], acted_flat[chosen], rtol=1e-5, atol=1e-5)
    # A sample with room for one lane's groups takes all of a kept (imitation) lane's.
    lane_groups = int(((ages[1] == 0) & (valid.numpy()[1] > 0)).sum())
    sampled = PlacetoAgent(*specs(env), network, statics, max_train_steps=3 * lane_groups)
    kept = valid * tf.constant([[0.0], [1.0]])
    _, slots, mask = (x.numpy() for x in sampled._select(valid, tf.constant(ages), kept))
    assert sorted(slots[mask > 0]) == list(np.flatnonzero(kept.numpy().reshape(-1)))


@pytest.mark.parametrize("name,value", [("refresh_every", 0), ("refresh_every", 2.5), ("refresh_every", True),
                                        ("passes", 0), ("passes", 1.5), ("passes", True)])
def test_a_bad_refresh_or_passes_is_a_typed_error(name, value):
    with pytest.raises(errors.InvalidArgumentError, match=name):
        PlacetoNetwork(**{name: value})


def test_a_later_pass_places_every_class_again_knowing_the_whole_placement(tmp_path, monkeypatch):
    # The order repeats: a second pass visits the classes of the first in the same order, every
    # node already visited; the end placement is the second pass's choices.
    problem = layered(seed=2)
    env = PlacementEnvironment(problem, batch_size=2, initial="random", seed=3, passes=2)
    record = _recorded(env)
    visited = [obs["visited"][0, :problem.num_nodes] for obs, _ in record]
    steps = graph_statics(problem).steps
    num = len(steps)
    assert [int(obs[STEP][0]) for obs, _ in record] == list(range(num)) * 2
    assert all(v.sum() < problem.num_nodes for v in visited[:num])
    assert all(v.all() for v in visited[num:])
    end = env.pop_summaries()[0]["placement"]
    np.testing.assert_array_equal(end[steps], [actions[0] for _, actions in record[num:]])
    # A policy acts with the passes it was made with, saved with it; training collects them.
    result = train(problem, episodes=16, lanes=8, seed=0, hidden=8, rounds=2, passes=2, progress=False,
                   self_imitation=2.0, imitate_baseline=True, select_every=None, logdir=str(tmp_path / "run"))
    assert result.decisions == 16 * 2 * num
    loaded = load_policy(str(tmp_path / "run" / "policy"))
    assert loaded.passes == 2 and PlacetoNetwork().passes == 1
    from tfplaceto.rl import acting

    made = []

    class Recording(PlacementEnvironment):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("passes", 1))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(acting, "PlacementEnvironment", Recording)
    assert len(acting.Actor(problem, loaded, seed=0).episodes("random", 2, seed=1)) == 2
    assert made[-1] == 2


def test_the_visited_schedule_is_the_placed_nodes_own_whatever_the_start():
    # schedule="visited" (the "scheduled" view's): the same actions from two random starts are
    # observed alike, schedule included; the placement's schedule ("placement") is not.
    problem = layered(seed=2)
    schedule_fields = (START, END, BUSY, STEP_TIME)
    for schedule, same in (("visited", True), ("placement", False)):
        first, second = (_recorded(PlacementEnvironment(problem, batch_size=2, initial="random", seed=seed,
                                                         schedule=schedule)) for seed in (3, 4))
        assert not np.array_equal(first[0][0][PLACEMENT], second[0][0][PLACEMENT])  # two starts
        assert [a.tolist() for _, a in first] == [a.tolist() for _, a in second]
        alike = [all(np.array_equal(one[k], other[k]) for k in schedule_fields)
                 for (one, _), (other, _) in zip(first, second)]
        assert all(alike) if same else not any(alike[:len(alike) // 2]), schedule
    # Before anything is placed nothing runs; the makespan of the placed nodes grows with them.
    env = PlacementEnvironment(problem, batch_size=1, initial="random", seed=3, schedule="visited")
    observed = [obs for obs, _ in _recorded(env)]
    assert float(observed[0][STEP_TIME][0]) == 0.0 and not observed[0][BUSY].any()
    assert 0 < float(observed[1][STEP_TIME][0]) < float(observed[-1][STEP_TIME][0])
    with pytest.raises(ValueError, match="schedule"):
        PlacementEnvironment(problem, schedule="partial")
    # A "scheduled" policy acts under schedule="visited": the environments it makes say so.
    assert PlacetoNetwork(view="scheduled").acting == {"passes": 1, "schedule": "visited"}
    assert PlacetoNetwork(view="placed").acting == {"passes": 1, "schedule": "placement"}


def test_the_exported_policy_is_the_best_evaluated_one(tmp_path):
    problem = two_chains(length=4, megabytes=100)
    logdir = str(tmp_path / "run")
    result = train(problem, episodes=64, lanes=8, seed=0, hidden=8, rounds=2, learning_rate=1e-2,
                   select_every=2, select_starts=3, logdir=logdir, progress=False)
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["selected_episode"] == result.selected_episode is not None
    exported = load_policy(summary["policy_dir"])
    for kept, saved in zip(result.selected_weights, exported.variables):
        np.testing.assert_array_equal(kept, saved.numpy())
    # The selection's evaluation (its own fixed starts) of the exported policy beats fresh weights.
    def alone(network):
        placements = greedy_placements(problem, network, start="random", starts=3, seed=20_000)
        return np.mean([problem.simulator().run(p)[0] for p in placements])

    assert alone(exported) <= alone(PlacetoNetwork(hidden=8, rounds=2, seed=0))


def test_model_selection_on_validation_problems_exports_the_best_there(monkeypatch, tmp_path):
    from tfplaceto.rl import train as train_module

    trained_on, validation = two_chains(length=4, megabytes=100), layered(seed=4)
    evaluated = []

    class Recording(train_module._Selection):
        def __init__(self, problems, *args, **kwargs):
            evaluated.extend(problems)
            super().__init__(problems, *args, **kwargs)

    monkeypatch.setattr(train_module, "_Selection", Recording)
    common = dict(lanes=8, seed=0, hidden=8, rounds=2, learning_rate=1e-2, select_every=1, select_starts=3,
                  logdir=str(tmp_path), progress=False)
    result = train(trained_on, episodes=32, select_on=[validation], **common)
    assert evaluated == [validation]
    with pytest.raises(errors.InvalidArgumentError, match="same selection problems"):
        train(trained_on, episodes=40, select_on=[validation, trained_on], **common)
    exported, fresh = result.exported_network(), PlacetoNetwork(hidden=8, rounds=2, seed=0)

    def alone(network):  # the selection's own evaluation: its fixed starts on the validation problem
        placements = greedy_placements(validation, network, start="random", starts=3, seed=20_000)
        return np.mean([validation.simulator().run(p)[0] for p in placements])

    assert alone(exported) <= alone(fresh)


def test_weight_averaging_exports_the_moving_average_and_trains_as_without_it(tmp_path, monkeypatch):
    from tfplaceto.rl.agent import PlacetoAgent

    problem = layered(seed=4)
    common = dict(seed=5, lanes=4, hidden=8, rounds=2, progress=False, checkpoint_every=1)
    plain = train(problem, episodes=16, select_every=None, **common)
    fresh = PlacetoNetwork(hidden=8, rounds=2, seed=5)
    fresh.warm_up()
    updated = [[v.numpy() for v in fresh.variables]]
    agent_train = PlacetoAgent.train

    def recording(agent, *args, **kwargs):  # the weights after every update
        loss = agent_train(agent, *args, **kwargs)
        updated.append([v.numpy() for v in agent._network.variables])
        return loss

    monkeypatch.setattr(PlacetoAgent, "train", recording)
    logdir = str(tmp_path / "run")
    averaged = train(problem, episodes=16, select_every=None, average_weights=0.5, logdir=logdir, **common)
    monkeypatch.undo()
    # Training itself is the same: the average is a shadow of it.
    for a, b in zip(plain.network.variables, averaged.network.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    expected = updated[0]
    for weights in updated[1:]:
        expected = [0.5 * e + 0.5 * w for e, w in zip(expected, weights)]
    exported = load_policy(os.path.join(logdir, "policy"))
    for want, kept, saved in zip(expected, averaged.selected_weights, exported.variables):
        np.testing.assert_allclose(kept, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(saved.numpy(), kept)
    assert any(not np.array_equal(k, v.numpy()) for k, v in zip(averaged.selected_weights, averaged.network.variables))
    # Selection evaluates the average; a resumed run selects and exports what a straight one does.
    selecting = dict(common, select_every=1, average_weights=0.9)
    straight = train(problem, episodes=24, **selecting)
    train(problem, episodes=12, logdir=str(tmp_path / "resumed"), **selecting)
    resumed = train(problem, episodes=24, logdir=str(tmp_path / "resumed"), **selecting)
    assert resumed.selected_episode == straight.selected_episode
    for a, b in zip(resumed.selected_weights, straight.selected_weights):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(errors.InvalidArgumentError, match="average_weights"):
        train(problem, episodes=4, average_weights=1.0, **common)


@pytest.mark.parametrize("curriculum,problems_per_update", [(False, 1), (True, 1), (True, 2)])
def test_training_is_deterministic_and_resumes_exactly(tmp_path, curriculum, problems_per_update):
    # With `curriculum`: two problems drawn by their gaps, and self-imitation of the best sampled
    # so far: a resume restores the gaps and the bests the replays clone. `problems_per_update`
    # 2: each update averages the gradients of two batches (of problems of different sizes).
    problem = [layered(seed=4), two_chains()] if curriculum else layered(seed=4)
    extra = dict(prioritize=0.5, self_imitation=5.0, problems_per_update=problems_per_update) if curriculum else {}

    def run(episodes, logdir=None):
        result = train(problem, episodes=episodes, seed=5, lanes=2, hidden=8, rounds=2,
                       initial=("random", "single"), logdir=logdir, checkpoint_every=1, progress=False,
                       **extra)
        return [v.numpy() for v in result.network.trainable_variables], result

    straight, straight_result = run(8)
    logdir = str(tmp_path / "run")
    run(4, logdir)
    resumed, resumed_result = run(8, logdir)
    assert resumed_result.episodes == 8 and len(resumed_result.history) == 8
    for a, b in zip(straight, resumed):  # same seed, interrupted or not: the same weights
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [h["step_time_s"] for h in resumed_result.history] == pytest.approx(
        [h["step_time_s"] for h in straight_result.history])
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    nodes = [p.num_nodes for p in (problem if curriculum else [problem])]
    decisions = sum(nodes[h["problem"]] for h in resumed_result.history)
    assert summary["episodes"] == 8 and summary["decisions"] == decisions
    assert load_policy(summary["policy_dir"]).config == resumed_result.network.config
    assert summary["learner_steps"] == 4 // problems_per_update * 4  # 4 batches of 2 lanes, 4 updates a group


@pytest.mark.parametrize("reproducible", [True, False])
def test_training_runs_tensorflow_functions_with_the_single_threaded_executor(reproducible, monkeypatch):
    # The default executor orders ops by timings it measures, and AddN sums from whichever input
    # buffer it can reuse: an update then differs now and then in its last bits, and two runs of
    # the shipped command parted after ~1200 episodes (docs/RESULTS.md). The updates are recorded
    # where they run; the callback, the caller's code, runs with the default executor.
    from tensorflow.python.eager import context

    from tfplaceto.rl.agent import PlacetoAgent

    default = context.context().function_call_options.executor_type  # TensorFlow's: None
    updates, callbacks = set(), set()
    update = PlacetoAgent.train

    def recording(agent, *args, **kwargs):
        updates.add(context.context().function_call_options.executor_type)
        return update(agent, *args, **kwargs)

    monkeypatch.setattr(PlacetoAgent, "train", recording)
    train(layered(seed=4), episodes=4, seed=5, lanes=2, hidden=8, rounds=2, progress=False,
          reproducible=reproducible,
          callback=lambda entry: callbacks.add(context.context().function_call_options.executor_type))
    assert updates == ({"SINGLE_THREADED_EXECUTOR"} if reproducible else {default})
    assert callbacks <= {default, ""}
    assert context.context().function_call_options.executor_type == default  # restored after


def test_a_callback_can_run_a_policy_function_first_run_before_training():
    # A function first run with TensorFlow's default executor has its conditionals lowered to
    # Switch ops, which the single-threaded executor refuses: benchmarks/learning.py evaluates the
    # policy before training and again in the callback, and failed at its first evaluation.
    problem = layered(seed=4)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0, refresh_every=2)  # a tf.cond: refresh or not
    actor = Actor(problem, network, 0)
    before = actor.episodes("random", 1, seed=1)[0]  # the first run: the default executor
    during = []
    train(problem, episodes=2, seed=5, lanes=2, progress=False, network=network,
          callback=lambda entry: during.append(actor.episodes("random", 1, seed=1)[0]))
    assert len(during) == 2 and all(problem.allowed[np.arange(problem.num_nodes), p].all() for p in [before, *during])


def test_saved_policy_reloads_to_identical_actions(tmp_path):
    problem = layered(seed=5)
    network = PlacetoNetwork(hidden=8, rounds=3, seed=9)
    save_policy(network, str(tmp_path / "policy"))
    loaded = load_policy(str(tmp_path / "policy"))
    assert loaded.config == network.config
    first = greedy_placements(problem, network, starts=3, seed=2)
    second = greedy_placements(problem, loaded, starts=3, seed=2)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("corrupt", ["missing", "json", "weights"])
def test_a_named_policy_that_does_not_load_is_an_error(tmp_path, corrupt):
    directory = tmp_path / "policy"
    if corrupt != "missing":
        save_policy(PlacetoNetwork(hidden=8, rounds=2, seed=0), str(directory))
        target = directory / ("policy.json" if corrupt == "json" else "weights.index")
        target.write_text("{not json")
    with pytest.raises(errors.PolicyError):
        placeto.policy_placement(layered(seed=1), policy=str(directory))


def test_placeto_policy_is_the_policy_alone():
    problem = layered(seed=6, cpu_only=[3])
    simulator = problem.simulator()
    untrained = placeto.policy_placement(problem, policy="untrained", start="random", seed=0)
    again = placeto.policy_placement(problem, policy="untrained", start="random", seed=0)
    np.testing.assert_array_equal(untrained, again)
    assert problem.allowed[np.arange(problem.num_nodes), untrained].all()
    # Its end placement is the greedy episode's: the same as greedy_placements gives.
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    alone = placeto.policy_placement(problem, policy=network, start="single", seed=0)
    np.testing.assert_array_equal(alone, greedy_placements(problem, network, start="single")[0])
    assert simulator.run(alone)[0] > 0


def test_placer_is_valid_deterministic_and_never_worse_than_the_best_baseline(monkeypatch):
    # Deterministic when the search ends by patience, not by its 10 s deadline, which a loaded
    # machine can reach first (then the two calls stop at different rounds): a deadline far away.
    monkeypatch.setattr(search, "BUDGET_S", 600.0)
    problem = layered(seed=6, cpu_only=[3])
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    first = placeto.place(problem, seed=0, policy=network)
    second = placeto.place(problem, seed=0, policy=network)
    np.testing.assert_array_equal(first, second)
    assert problem.allowed[np.arange(problem.num_nodes), first].all()
    simulator = problem.simulator()
    assert simulator.run(first)[0] <= search.best_baseline(problem).step_time_s


def _recording_polish(monkeypatch, events):
    """search.polish, logging "polish" in `events` at each call."""
    polish = search.polish

    def recording(*args, **kwargs):
        events.append("polish")
        return polish(*args, **kwargs)

    monkeypatch.setattr(search, "polish", recording)


def test_search_climbs_every_start_and_asks_for_none_after_the_deadline(monkeypatch):
    problem = layered(seed=6, cpu_only=[3])
    baseline = search.best_baseline(problem).placement
    all_on_last = np.full(problem.num_nodes, problem.num_devices - 1, np.int32)
    simulator = problem.simulator()
    assert simulator.run(all_on_last)[0] > simulator.run(baseline)[0]
    events = []
    _recording_polish(monkeypatch, events)

    def starts(deadline_passed, first, second):
        events.append("start 0")
        yield first
        if deadline_passed:
            raise AssertionError("a start was asked for after the deadline")
        events.append("start 1")
        yield second

    def never(rng, placement, count):
        raise AssertionError("a perturbation after the deadline")

    found = search.search(problem, starts(True, baseline, None), [(never, 1)], deadline=time.perf_counter() - 1)
    assert events == ["start 0", "polish"]  # offered (and climbed, to the deadline) all the same
    np.testing.assert_array_equal(found.placement, baseline)
    moves = search.random_window_moves(problem)

    def perturb(rng, placement, count):
        events.append("perturb")
        return moves(rng, placement, count)

    for first, second in ((all_on_last, baseline), (baseline, all_on_last)):
        events.clear()
        found = search.search(problem, starts(False, first, second), [(perturb, 1)], patience=1)
        # The second start is climbed whether it begins better than the first or worse.
        assert events[:events.index("perturb")] == ["start 0", "polish", "start 1", "polish"]
        assert found.step_time_s <= simulator.run(baseline)[0]


class _RecordingActor:
    """Stands in for `rl.acting.Actor` in the placer: logs "actor" when built and "episode" (or
    "window episode") at each call; an episode leaves its start as it is (from "random": all on
    the last device)."""

    events: list = []

    def __init__(self, problem, network, seed=0):
        self.events.append("actor")
        self._all_on_last = np.full(problem.num_nodes, problem.num_devices - 1, np.int32)

    def episodes(self, start="random", count=1, greedy=True, window=None, seed=None, deadline=None,
                 window_sees=False, window_at=None):
        self.events.append("episode" if window is None else "window episode")
        return [(self._all_on_last if isinstance(start, str) else start).copy() for _ in range(count)]


def test_the_placer_climbs_the_best_baseline_before_the_policy_runs_and_runs_none_after_its_deadline(monkeypatch):
    problem = layered(seed=6, cpu_only=[3])
    baseline = search.best_baseline(problem)
    events = _RecordingActor.events = []
    monkeypatch.setattr(placeto, "Actor", _RecordingActor)
    monkeypatch.setattr(placeto._LazyActor, "warm_up_s", 0.5)  # what building an actor took last
    _recording_polish(monkeypatch, events)
    placed = placeto.place(problem, seed=0, policy="untrained")
    assert events[:3] == ["polish", "actor", "episode"]  # the baseline climbed before any episode
    # The shipped configuration's "placed" view ends at the same placement from every start: one.
    assert events.count("episode") == 1
    assert problem.simulator().run(placed)[0] <= baseline.step_time_s
    # Less time than building the policy's function took last: it is not begun (it cannot be cut).
    events.clear()
    monkeypatch.setattr(placeto._LazyActor, "warm_up_s", 2 * search.BUDGET_S)
    placed = placeto.place(problem, seed=0, policy="untrained")
    assert "actor" not in events and "episode" not in events and "window episode" not in events
    assert problem.simulator().run(placed)[0] <= baseline.step_time_s
    # No time at all: the best baseline is offered, no policy is built, no episode runs.
    events.clear()
    monkeypatch.setattr(search, "BUDGET_S", 0.0)
    placed = placeto.place(problem, seed=0, policy="untrained")
    assert events == ["polish"]
    np.testing.assert_array_equal(placed, problem.tie(baseline.placement))


def test_iterated_search_leaves_a_local_optimum_that_hill_climbing_cannot():
    # Chains of 3 with 100 MB between links (4 ms over NVLink, each op 1 ms): from "all on one
    # device" every single move adds a transfer (worse), only moving a whole chain helps.
    from tfplaceto.baselines import common, local_search

    problem = two_chains(megabytes=100)
    simulator = problem.simulator()
    start = np.zeros(problem.num_nodes, np.int32)
    assert simulator.run(start)[0] == pytest.approx(6e-3)
    climbed = local_search.climb(problem, start, np.random.default_rng(0), float("inf"))
    assert simulator.run(climbed)[0] == pytest.approx(6e-3)  # stuck
    best = Best()
    best.offer(simulator.run(start)[0], False, start)
    inst = common.prepare(problem)
    no_blocks = local_search.Moves([], np.zeros(0, np.int32))  # the perturbations alone
    found = search.improve(problem, best, [(search.random_window_moves(problem, 3), 2)], seed=0,
                           patience=50, neighbourhoods=(inst, local_search.class_moves(inst), no_blocks))
    assert found.step_time_s == pytest.approx(3e-3)
    assert simulator.run(found.placement)[0] == pytest.approx(3e-3)


def test_adaptive_shares_give_the_draws_to_the_source_that_improves_more_often():
    rng = np.random.default_rng(0)
    # The source that improved the best 4 times in 10 takes most draws; the one that never did
    # keeps a few.
    shares = search._shares(rng, np.array([10.0, 10.0]), np.array([4.0, 0.0]), 400)
    assert shares.sum() == 400 and shares[0] > 300 and shares[1] > 0
    # Alike so far: alike shares.
    shares = search._shares(rng, np.array([10.0, 10.0]), np.array([2.0, 2.0]), 400)
    assert 150 < shares[0] < 250


def test_adaptive_search_still_finds_what_the_perturbations_can_and_draws_every_round_in_full():
    problem = two_chains(megabytes=100)
    simulator = problem.simulator()
    start = np.zeros(problem.num_nodes, np.int32)
    from tfplaceto.baselines import common, local_search

    best = Best()
    best.offer(simulator.run(start)[0], False, start)
    inst = common.prepare(problem)
    no_blocks = local_search.Moves([], np.zeros(0, np.int32))  # the perturbations alone
    moves, rounds = search.random_window_moves(problem, 3), [{}]  # per round: source -> draws asked

    def unchanged(rng, placement, count):  # never helps: the best as it is
        rounds[-1]["unchanged"] = count
        return [placement.copy() for _ in range(count)]

    def useful(rng, placement, count):
        rounds[-1]["useful"] = count
        return moves(rng, placement, count)

    found = search.improve(problem, best, [(unchanged, 2), (useful, 2)], seed=0, patience=20, adaptive=True,
                           on_round=lambda _: rounds.append({}),
                           neighbourhoods=(inst, local_search.class_moves(inst), no_blocks))
    assert found.step_time_s == pytest.approx(3e-3)
    rounds = rounds[:-1]
    assert rounds[0] == {"unchanged": 2, "useful": 2}  # the first as the counts say
    assert len(rounds) > 1 and all(sum(r.values()) == 4 for r in rounds)  # then 4 in all, shared
    later = [sum(r.get(name, 0) for r in rounds[1:]) for name in ("unchanged", "useful")]
    assert later[0] < later[1]  # the source that never helped was given fewer


def test_iterated_search_climbs_no_perturbation_that_left_the_best_as_it_was(monkeypatch):
    problem = two_chains(megabytes=100)
    start = np.zeros(problem.num_nodes, np.int32)
    best = Best()
    best.offer(problem.simulator().run(start)[0], False, start)
    climbed = []
    monkeypatch.setattr(search, "polish", lambda problem, placement, *args, **kwargs: climbed.append(placement) or placement)
    keep_or_move = lambda rng, placement, count: [placement.copy(), 1 - placement]  # noqa: E731
    search.improve(problem, best, [(keep_or_move, 2)], seed=0, patience=1)
    assert climbed and not any(np.array_equal(placement, start) for placement in climbed)


def test_patience_counts_climbs_so_draws_that_change_nothing_do_not_end_the_search_sooner(monkeypatch):
    problem = two_chains(megabytes=100)
    start = np.zeros(problem.num_nodes, np.int32)
    climbed, rounds = [], []
    monkeypatch.setattr(search, "polish", lambda problem, placement, *args, **kwargs: climbed.append(placement) or placement)

    def search_with(perturb):
        climbed.clear()
        rounds.clear()
        best = Best()
        best.offer(problem.simulator().run(start)[0], False, start)
        search.improve(problem, best, [(perturb, 4)], seed=0, patience=3, on_round=rounds.append)

    # Nothing better is found (the climb is the identity, 1 - start only mirrors the placement):
    # 3 rounds' worth of climbs (3 x 4), whatever share of the draws left the best as it was.
    search_with(lambda rng, placement, count: [1 - placement] * count)
    assert (len(climbed), len(rounds)) == (12, 3)
    search_with(lambda rng, placement, count: [placement.copy(), 1 - placement] * (count // 2))
    assert (len(climbed), len(rounds)) == (12, 6)
    # Draws that never change the best end it too, after as many rounds.
    search_with(lambda rng, placement, count: [placement.copy()] * count)
    assert (len(climbed), len(rounds)) == (0, 12)


def test_patience_is_per_source_so_a_second_source_does_not_spend_the_first_ones(monkeypatch):
    problem = two_chains(megabytes=100)
    start = np.zeros(problem.num_nodes, np.int32)
    climbed = []
    monkeypatch.setattr(search, "polish", lambda problem, placement, *args, **kwargs: climbed.append(placement) or placement)

    def mirrored(rng, placement, count):  # a draw that is climbed and never improves the best
        return [1 - placement] * count

    def climbs(perturbations):
        climbed.clear()
        best = Best()
        best.offer(problem.simulator().run(start)[0], False, start)
        search.improve(problem, best, perturbations, seed=0, patience=3)
        return len(climbed)

    # Alone, a source of 4 draws a round ends the search after 3 rounds' worth of them (12 climbs).
    assert climbs([(mirrored, 4)]) == 12
    # Two sources: the search ends when one of them has had its 12, not after 12 in all, so a
    # second source does not halve the climbs of the first.
    assert climbs([(mirrored, 2), (mirrored, 2)]) == 24


def test_block_moves_move_a_chain_that_single_moves_cannot():
    from tfplaceto.baselines import local_search

    problem = two_chains(length=4, megabytes=100)  # every single move from one device is worse
    simulator = problem.simulator()
    start = np.zeros(problem.num_nodes, np.int32)
    rng = np.random.default_rng(0)
    assert simulator.run(local_search.climb(problem, start, rng, float("inf")))[0] == pytest.approx(8e-3)
    blocks = search.block_moves(problem)
    assert {len(nodes) for nodes in blocks.nodes} == {2, 4}  # runs of 2 and 4 classes (of 8)
    climbed = local_search.climb(problem, start, rng, float("inf"), moves=blocks)
    assert simulator.run(climbed)[0] == pytest.approx(4e-3)  # one chain per device
    assert len(set(climbed[:4])) == 1 and len(set(climbed[4:])) == 1 and climbed[0] != climbed[4]


def test_tp_train_trains_on_sources_and_clusters_and_its_policy_places(tmp_path):
    source = "builtin:ptb-cells/0"
    result = tp.train([source], ["2xV100"], episodes=2, logdir=str(tmp_path / "run"), lanes=2, hidden=8,
                      rounds=2)
    op_graph = tp.import_graph(source)
    problem_steps = graph_statics(tp.problem.make_problem(
        op_graph, tp.Cluster.preset("2xV100"), tp.profile(op_graph, "2xV100"))).num_steps
    assert result.episodes == 2 and result.decisions == 2 * problem_steps and result.wall_s > 0
    assert list(result.best_step_time_s) == [f"{source}@2xV100"]
    placement = tp.place(op_graph, "2xV100", method="placeto_policy", policy=result.policy_dir, seed=3)
    assert set(placement.values()) <= set(tp.Cluster.preset("2xV100").device_names)
    with pytest.raises(errors.TfplacetoError, match="actors"):
        tp.train([source], ["2xV100"], episodes=2, logdir=None, actors=-1)
    with pytest.raises(errors.TfplacetoError, match="episodes"):
        tp.train([source], ["2xV100"], episodes=0, logdir=None)


def test_a_bad_logdir_is_a_typed_error(tmp_path):
    problem = layered(seed=4)

    def run(logdir, graph=problem):
        return train(graph, episodes=2, seed=5, lanes=2, hidden=8, rounds=2, logdir=str(logdir), progress=False)

    not_a_directory = tmp_path / "file.txt"
    not_a_directory.write_text("x")
    with pytest.raises(errors.CheckpointError, match="logdir"):
        run(not_a_directory)
    logdir = tmp_path / "run"
    run(logdir)
    with pytest.raises(errors.CheckpointError, match="other graphs"):  # another problem, same logdir
        run(logdir, layered(seed=5))
    state = logdir / "state.json"
    state.write_text(state.read_text()[:40])  # truncated
    with pytest.raises(errors.CheckpointError, match="corrupted"):
        run(logdir)


def test_an_episode_takes_no_step_after_its_deadline():
    from tfplaceto.rl.acting import Actor

    problem = layered(seed=3)
    actor = Actor(problem, PlacetoNetwork(hidden=8, rounds=2, seed=0), seed=0)
    start = np.zeros(problem.num_nodes, np.int64)
    cut = actor.episodes(start, 2, greedy=False, deadline=time.perf_counter() - 1)
    assert len(cut) == 2
    for placement in cut:
        np.testing.assert_array_equal(placement, start)
    whole = actor.episodes(start, 2, greedy=False, deadline=time.perf_counter() + 600)
    assert any((placement != start).any() for placement in whole)


def test_with_the_placed_view_a_greedy_episode_ends_at_the_same_placement_from_every_start():
    # What lets the placer run one greedy episode of such a policy instead of one per start.
    from tfplaceto.rl.acting import Actor

    problem = layered(seed=3)
    for view, same in (("placed", True), ("scheduled", True), ("full", False)):
        actor = Actor(problem, PlacetoNetwork(hidden=8, rounds=2, seed=0, view=view), seed=0)
        ends = actor.episodes("random", 3, seed=1) + actor.episodes("single", 1)
        assert all(np.array_equal(end, ends[0]) for end in ends[1:]) == same, view


def test_forced_choices_replace_the_policys_at_their_steps_only():
    from tfplaceto.rl.acting import Actor

    problem = layered(seed=3)
    statics = graph_statics(problem)
    actor = Actor(problem, PlacetoNetwork(hidden=8, rounds=2, seed=0, view="placed"), seed=0)
    start = np.zeros(problem.num_nodes, np.int64)
    plain, = actor.episodes(start, 1)
    step = statics.num_steps - 1  # the last class: nothing after it can follow it
    node = statics.steps[step]
    other = next(d for d in np.flatnonzero(statics.allowed[node]) if d != plain[node])
    again, forced = actor.episodes(start, 2, forced=[{}, {step: int(other)}])
    np.testing.assert_array_equal(again, plain)
    assert forced[node] == other
    members = statics.members[step]
    np.testing.assert_array_equal(np.delete(forced, members), np.delete(plain, members))


def _random_batch(seed: int):
    """A problem, its environment (3 lanes sharing a start) and one batch of random episodes."""
    from tf_agents.policies import random_py_policy

    from tfplaceto.rl.acting import collect

    problem = layered(seed=seed)
    env = PlacementEnvironment(problem, batch_size=3, seed=0, shared_start=True)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=0)
    experience, weights, _ = collect(env, policy, env.reset())
    return problem, env, experience, weights


def test_self_imitation_replays_the_best_placement_found_from_the_batch_start():
    from tfplaceto.rl.train import _SelfImitation

    problem, env, experience, weights = _random_batch(4)
    summaries = env.pop_summaries()
    assert _SelfImitation(env, 0.0).batch(experience, weights, summaries)[2] is None  # off
    imitator, best = _SelfImitation(env, 2.0), env.best_for(0)
    best.step_time_s, best.placement = 0.0, np.arange(problem.num_nodes) % 2  # the best found
    merged, merged_weights, imitation = imitator.batch(experience, weights, summaries)
    assert imitation.tolist() == [0.0, 0.0, 0.0, 2.0] and merged_weights.shape == (4, weights.shape[1])
    replay = tf.nest.map_structure(lambda x: x[3], merged)
    np.testing.assert_array_equal(replay.observation["placement"][0],  # the batch's own start
                                  experience.observation["placement"][0, 0])
    steps = graph_statics(problem).steps
    np.testing.assert_array_equal(replay.action[:len(steps)], best.placement[steps])
    last = int(np.flatnonzero(replay.step_type == 2)[0])  # StepType.LAST: every class placed
    np.testing.assert_array_equal(replay.observation["placement"][last][:problem.num_nodes], best.placement)
    # The next batch (another start) is replayed from its own start.
    from tf_agents.policies import random_py_policy

    from tfplaceto.rl.acting import collect

    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=1)
    following, following_weights, _ = collect(env, policy, env.reset())
    assert not np.array_equal(following.observation["placement"][0, 0], experience.observation["placement"][0, 0])
    merged, _, _ = imitator.batch(following, following_weights, env.pop_summaries())
    np.testing.assert_array_equal(merged.observation["placement"][3, 0], following.observation["placement"][0, 0])
    # A fixed target (`imitate_baseline="fixed"`: the teacher) is cloned whatever is found better.
    teacher = Best()
    teacher.offer(1.0, False, np.zeros(problem.num_nodes, np.int32))
    merged, _, _ = _SelfImitation(env, 2.0, {0: teacher}).batch(following, following_weights, summaries)
    np.testing.assert_array_equal(tf.nest.map_structure(lambda x: x[3], merged).action[:len(steps)], 0)


def test_imitating_the_baseline_starts_from_the_best_fast_baselines_placement_or_its_climb():
    # The first batch already replays the teacher: the best found starts at the best fast
    # baseline's placement (one chain per device here, 4 ms), which random episodes rarely reach.
    problem = two_chains(length=4, megabytes=100)
    teacher = search.best_baseline(problem)
    common = dict(episodes=4, lanes=4, seed=0, hidden=8, rounds=2, self_imitation=1.0, select_every=None,
                  progress=False)
    assert train(problem, **common).best[0].step_time_s > teacher.step_time_s
    taught = train(problem, imitate_baseline=True, **common)
    assert taught.best[0].step_time_s == pytest.approx(teacher.step_time_s)
    # "climbed": the teacher is that placement hill-climbed first (seeded by the run's seed),
    # here a local optimum faster than the best fast baseline
    problem = layered(seed=0)
    teacher = search.best_baseline(problem)
    climbed_s = problem.simulator().run(search.polish(problem, teacher.placement, np.random.default_rng(0)))[0]
    assert climbed_s < teacher.step_time_s
    taught = train(problem, imitate_baseline="climbed", **common)
    assert taught.best[0].step_time_s == pytest.approx(climbed_s)
    with pytest.raises(errors.InvalidArgumentError, match="imitate_baseline"):
        train(problem, imitate_baseline="fixd", **common)


def test_imitated_lanes_are_cloned_and_stay_out_of_the_baseline():
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoAgent

    _, env, experience, weights = _random_batch(5)
    agent = PlacetoAgent(*specs(env), PlacetoNetwork(hidden=8, rounds=2, seed=0),
                         as_tensors(pack(env.statics, env.dims)), max_train_steps=None)
    batch = tf.nest.map_structure(tf.constant, experience)
    two = agent._loss(tf.nest.map_structure(lambda x: x[:2], batch), tf.constant(weights[:2]))
    # Lane 2 imitated (a tiny weight) leaves the other lanes' baseline and advantages as they were
    # without it; a larger weight adds its cloning term, -w * mean log pi over its steps.
    tiny = agent._loss(batch, tf.constant(weights), imitation=tf.constant([0.0, 0.0, 1e-9]))
    cloned = agent._loss(batch, tf.constant(weights), imitation=tf.constant([0.0, 0.0, 3.0]))
    assert float(tiny.extra.mean_return) == pytest.approx(float(two.extra.mean_return))
    steps_two, steps_all = float(two.extra.train_steps), float(tiny.extra.train_steps)
    assert float(tiny.extra.policy_loss) * steps_all == pytest.approx(float(two.extra.policy_loss) * steps_two,
                                                                      rel=1e-4, abs=1e-5)
    assert float(cloned.extra.policy_loss) > float(tiny.extra.policy_loss)  # -3 * log pi > 0 added


def test_an_update_on_several_batches_takes_the_mean_of_their_gradients():
    from tf_agents.policies import random_py_policy

    from tfplaceto.rl.acting import collect, specs
    from tfplaceto.rl.agent import PlacetoAgent

    env = PlacementEnvironment([layered(seed=5), layered(seed=6, depth=4)], batch_size=3, seed=0, shared_start=True)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=0)
    by_problem = {}  # a batch of each problem: their steps differ in number
    while len(by_problem) < 2:
        experience, weights, _ = collect(env, policy, env.reset())
        by_problem[int(experience.observation[PROBLEM][0, 0])] = (
            tf.nest.map_structure(tf.constant, experience), tf.constant(weights), None)
    batches = [by_problem[0], by_problem[1]]

    def agent():  # no clipping: Adam's first moment after one update is 0.1 x the gradient applied
        return PlacetoAgent(*specs(env), PlacetoNetwork(hidden=8, rounds=2, seed=0),
                            as_tensors(pack(env.statics, env.dims)), max_train_steps=None, gradient_clipping=1e9)

    reference = agent()
    gradients = [[g.numpy() for g in reference._gradients(*batch)[0]] for batch in batches]
    averaged = agent()
    info = averaged.train_averaged(batches)
    moments = [m for m in averaged._optimizer.variables if m.name.startswith("m/")]  # Adam's first moments
    assert len(moments) == len(gradients[0])
    for moment, first, second in zip(moments, *gradients):
        np.testing.assert_allclose(moment.numpy(), 0.1 * (first + second) / 2, rtol=1e-4, atol=1e-7)
    assert int(averaged.train_step_counter.numpy()) == 1 and np.isfinite(float(info.loss))
    # One batch: the same update as TF-Agents' `train` on it.
    single, one = agent(), agent()
    single.train(batches[0][0], batches[0][1])
    one.train_averaged(batches[:1])
    for a, b in zip(single.network.trainable_variables, one.network.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_exploration_deviates_to_uniformly_random_allowed_devices_in_collection_only():
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoAgent, PlacetoPolicy

    env = PlacementEnvironment(layered(seed=2), batch_size=64, initial="random", seed=0)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    statics = as_tensors(pack(env.statics, env.dims))
    time_step = tf.nest.map_structure(tf.constant, env.reset())
    assert time_step.observation[ACTION_MASK].numpy().all()  # the first class may go anywhere
    # Logits that put all mass on slot 1 (slot 2 masked on even lanes): without exploration every
    # sampled action is 1.
    logits = np.tile([0.0, 1e4, 0.0], (64, 1)).astype(np.float32)
    logits[::2, 2] = -1e9
    biased = PlacetoPolicy(*specs(env), network, statics, seed=1, exploration=0.5)
    biased.logits = lambda step, state=(), sampling=False: (tf.constant(logits), state)  # noqa: E731
    state = biased.get_initial_state(64)
    actions = np.stack([biased.action(time_step, state).action.numpy() for _ in range(60)])  # (60, 64)
    assert (actions[:, ::2] != 2).all()  # never a masked slot
    # Half the actions deviate, uniformly over the allowed devices.
    for lanes, expected in ((slice(0, None, 2), [1 / 4, 3 / 4, 0]), (slice(1, None, 2), [1 / 6, 2 / 3, 1 / 6])):
        np.testing.assert_allclose(np.bincount(actions[:, lanes].ravel(), minlength=3) / actions[:, lanes].size,
                                   expected, atol=0.04)
    # The agent's greedy policy and distribution do not explore; without exploration the collect
    # policy's generator draws exactly what it drew before the option existed.
    agent = PlacetoAgent(*specs(env), network, statics, seed=1, exploration=0.5)
    plain = PlacetoPolicy(*specs(env), network, statics, seed=1)
    greedy = agent.policy.action(time_step, agent.policy.get_initial_state(64)).action.numpy()
    logits, _ = plain.logits(time_step, plain.get_initial_state(64))
    np.testing.assert_array_equal(greedy, np.argmax(logits.numpy(), -1))
    zero = PlacetoPolicy(*specs(env), network, statics, seed=1, exploration=0.0)
    np.testing.assert_array_equal(zero.action(time_step, ()).action.numpy(),
                                  plain.action(time_step, ()).action.numpy())


def test_greedy_actions_count_the_devices_the_policy_scores_alike_as_one_outcome():
    masked = MASKED_LOGIT
    logits = np.array([
        [1.0, 0.5, 0.5, 0.5],  # 0.36 on device 0, 0.64 on one of the three alike: the first of them
        [2.0, 0.5, 0.5, masked],  # 0.69 on device 0, 0.31 on the two alike
        [1.0, 0.5, masked, masked],  # masked slots are alike but no outcome
        [1.0, 0.5, 0.51, 0.52],  # close, but not alike: the plain argmax
        [1.0, 0.5, np.nextafter(np.float32(0.5), np.float32(1)), 0.5],  # alike up to float rounding
    ], np.float32)
    np.testing.assert_array_equal(greedy_actions(tf.constant(logits), "outcome").numpy(), [1, 0, 0, 0, 1])
    np.testing.assert_array_equal(greedy_actions(tf.constant(logits), "device").numpy(), [0, 0, 0, 0, 0])
    # On logits with many ties: the first device of the likeliest outcome.
    rng = np.random.default_rng(0)
    logits = (rng.integers(0, 4, (300, 8)) * 0.7).astype(np.float32)
    logits[:, 1:][rng.random((300, 7)) < 0.3] = masked
    for row, chosen in zip(logits, greedy_actions(tf.constant(logits), "outcome").numpy()):
        allowed = row > masked / 2
        probability = np.exp(row - row[allowed].max()) * allowed
        outcomes = {value: probability[allowed & (row == value)].sum() for value in row[allowed]}
        assert outcomes[row[chosen]] >= max(outcomes.values()) * (1 - 1e-6)
        assert chosen == np.flatnonzero(allowed & (row == row[chosen]))[0]


def test_greedy_episodes_of_the_actor_and_of_the_greedy_tf_agents_policy_agree():
    from tfplaceto.rl.acting import Actor, CompiledPyPolicy, collect, specs
    from tfplaceto.rl.agent import PlacetoGreedyPolicy, PlacetoPolicy

    problem = layered(seed=3, devices=4)  # three GPUs, alike to the policy until used, and the host
    ends = {}
    for way in ("device", "outcome"):
        network = PlacetoNetwork(hidden=8, rounds=2, seed=1, refresh_every=2, view="placed", greedy=way)
        env = PlacementEnvironment(problem, initial="random", seed=7, **network.acting)
        policy = PlacetoGreedyPolicy(PlacetoPolicy(*specs(env), network, as_tensors(pack(env.statics, env.dims))))
        collect(env, CompiledPyPolicy(policy), env.reset())
        ends[way] = Actor(problem, network).episodes("random", 1, greedy=True, seed=7)[0]
        np.testing.assert_array_equal(env.pop_summaries()[0]["placement"], ends[way])
    # The same untrained weights: by the likeliest device every class goes to the host (the one
    # device no other is alike to); by the likeliest outcome the GPUs count as one, and all four
    # devices are used.
    assert len(np.unique(ends["device"])) < len(np.unique(ends["outcome"]))


def test_weight_decay_shrinks_every_weight_by_its_share_of_the_step():
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoAgent

    _, env, _, _ = _random_batch(5)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    agent = PlacetoAgent(*specs(env), network, as_tensors(pack(env.statics, env.dims)),
                         learning_rate=0.01, weight_decay=2.0)
    before = [v.numpy() for v in network.trainable_variables]
    # Zero gradients leave Adam's own step at zero: what changes is the decay alone, w *= 1 - lr * decay.
    agent._apply_fn([tf.zeros_like(v) for v in network.trainable_variables])
    for was, now in zip(before, network.trainable_variables):
        np.testing.assert_allclose(now.numpy(), was * (1 - 0.01 * 2.0), rtol=1e-5, atol=1e-7)


def test_episode_credit_gives_every_step_its_episodes_whole_return():
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoAgent

    _, env, experience, weights = _random_batch(6)
    improvements = np.array([s["improvement"] for s in env.pop_summaries()])  # (C_0 - C_T) / C_0
    statics = as_tensors(pack(env.statics, env.dims))
    rewards, valid = tf.constant(experience.reward, tf.float32), tf.constant(weights)

    def returns(credit):
        agent = PlacetoAgent(*specs(env), PlacetoNetwork(hidden=8, rounds=2, seed=0), statics, credit=credit)
        return agent.step_returns(rewards, valid).numpy()

    to_go, episode = returns("to_go"), returns("episode")
    np.testing.assert_allclose(to_go[:, 0], improvements, rtol=1e-5, atol=1e-6)  # the same at the first step
    np.testing.assert_allclose(episode, improvements[:, None] * weights, rtol=1e-5, atol=1e-6)
    # Later steps differ: the return-to-go leaves out the rewards before the step.
    assert not np.allclose(to_go[:, 1:], episode[:, 1:], atol=1e-4)
    with pytest.raises(errors.InvalidArgumentError, match="credit"):
        returns("final")
