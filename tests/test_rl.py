"""The Placeto MDP, the REINFORCE agent, training (determinism, resume) and the placer."""

import json
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.policy import features as F
from tfplaceto.policy import placer
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem, allowed_devices
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.rl.train import make_logits_fn, rollout, train


def _gpus(count, memory=16 * 10**9):
    return [tp.Device(f"/job:localhost/replica:0/task:0/device:GPU:{i}", "GPU", memory, model="V100")
            for i in range(count)]


def two_chains(length=3, devices=2, megabytes=1):
    """Chains a0 -> a1 -> ... and b0 -> b1 -> ...: the best placement puts one chain per device."""
    names = [f"{chain}{i}" for chain in "ab" for i in range(length)]
    producers = [c * length + i for c in range(2) for i in range(length - 1)]
    graph = make_op_graph(names, ["MatMul"] * len(names), producers, [megabytes * 10**6] * len(producers),
                          np.arange(len(producers)), [p + 1 for p in producers])
    cluster = tp.Cluster(_gpus(devices), name="tiny")
    compute = np.full((len(names), devices), 1e-3)
    return Problem(graph, cluster, compute, allowed_devices(graph, cluster))


def layered(seed=0, width=4, depth=5, devices=3, cpu_only=()):
    """A random layered DAG with uneven costs; `cpu_only` nodes may only go on the last device."""
    rng = np.random.default_rng(seed)
    n = width * depth
    producers, consumers = [], []
    for layer in range(1, depth):
        for j in range(width):
            for parent in rng.choice(width, size=2, replace=False):
                producers.append((layer - 1) * width + parent)
                consumers.append(layer * width + j)
    kernels = np.ones((n, 2), bool)
    for node in cpu_only:
        kernels[node, 1] = False
    graph = make_op_graph([f"n{i}" for i in range(n)], ["MatMul"] * n, producers,
                          rng.integers(1, 50, len(producers)) * 10**5, np.arange(len(producers)),
                          consumers, kernels=kernels)
    host = tp.Device("/job:localhost/replica:0/task:0/device:CPU:0", "CPU", 64 * 10**9, model="host")
    cluster = tp.Cluster(_gpus(devices - 1) + [host], name="layered")
    compute = rng.uniform(0.5, 3.0, (n, 1)) * 1e-3 * np.array([1.0] * (devices - 1) + [4.0])
    return Problem(graph, cluster, compute, allowed_devices(graph, cluster))


def _random_episode(env, seed):
    rng = np.random.default_rng(seed)
    step = env.reset()
    rewards = []
    while not step.is_last():
        action = rng.choice(np.flatnonzero(step.observation[F.ACTION_MASK]))
        step = env.step(np.int32(action))
        rewards.append(float(step.reward))
    return rewards


@pytest.mark.parametrize("order,window", [("topological", None), ("random", None), ("topological", 6)])
def test_rewards_sum_to_the_total_improvement(order, window):
    problem = layered(seed=1)
    env = PlacementEnvironment(problem, initial="random", order=order, seed=4, window=window)
    for episode in range(3):
        rewards = _random_episode(env, episode)
        summary = env.episode_summary()
        assert not summary["oom"] and len(rewards) == summary["steps"] == (window or problem.num_nodes)
        t0, final = summary["initial_step_time_s"], summary["step_time_s"]
        assert sum(rewards) == pytest.approx((t0 - final) / t0, abs=1e-5)
        assert final == pytest.approx(problem.simulator().run(env.placement)[0])


def test_a_window_episode_re_places_consecutive_classes_only():
    problem = layered(seed=2)
    start = np.zeros(problem.num_nodes, np.int32)
    env = PlacementEnvironment(problem, initial=start, seed=3, window=5)
    statics = F.graph_statics(problem)
    position = {int(node): k for k, node in enumerate(statics.steps)}  # node -> its step
    for episode in range(4):
        step = env.reset()
        rng = np.random.default_rng(episode)
        while not step.is_last():  # always a device other than 0, so every visited class moves
            step = env.step(np.int32(rng.choice(np.flatnonzero(step.observation[F.ACTION_MASK][1:]) + 1)))
        moved = sorted(position[int(n)] for n in np.flatnonzero(env.placement != start))
        assert len(moved) == 5 and moved[-1] - moved[0] == 4


def test_a_polished_episode_returns_the_polished_improvement():
    from tfplaceto.baselines import local_search

    problem = layered(seed=3)

    def polish(p, placement):
        return local_search.climb(p, placement, np.random.default_rng(0), float("inf"))

    env = PlacementEnvironment(problem, initial="random", seed=5, window=4, polish=polish)
    for episode in range(3):
        rewards = _random_episode(env, episode)
        summary = env.episode_summary()
        t0, final = summary["initial_step_time_s"], summary["step_time_s"]
        assert sum(rewards) == pytest.approx((t0 - final) / t0, abs=1e-5)
        # The end placement is a local optimum: climbing it again changes nothing.
        np.testing.assert_array_equal(polish(problem, env.placement), env.placement)


def test_oom_is_penalized():
    problem = two_chains()
    small = tp.Cluster(_gpus(2, memory=2_500_000), name="small")
    problem = Problem(problem.graph, small, problem.compute_s, problem.allowed)
    env = PlacementEnvironment(problem, initial="single", seed=0)
    step = env.reset()
    assert env.oom  # 3 MB of outputs on one 2.5 MB device
    rewards = []
    for action in (1, 1, 1, 0, 0, 0):  # one chain per device: fits
        step = env.step(np.int32(action))
        rewards.append(float(step.reward))
    assert not env.oom and sum(rewards) > 0.5  # more than the step-time gain alone


def test_masked_devices_are_never_chosen():
    problem = layered(seed=2, cpu_only=[0, 5, 9, 13])
    env = PlacementEnvironment(problem, initial="random", seed=0)
    network = PlacetoNetwork(hidden=8, seed=0, lookahead_prior=0.0)
    network.warm_up(env.observation_spec())
    logits_fn = make_logits_fn(network, env.observation_spec())
    for seed in range(3):
        experience, weights, _ = rollout([env], logits_fn, np.random.default_rng(seed))
        mask = experience.observation[F.ACTION_MASK][weights > 0]
        assert mask[np.arange(len(mask)), experience.action[weights > 0]].all()
        assert (env.placement[[0, 5, 9, 13]] == 2).all()
    step = env.reset()
    while step.observation[F.CURRENT] != 5:
        step = env.step(np.int32(2))
    with pytest.raises(ValueError, match="masked"):
        env.step(np.int32(0))


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
    assert env.placement[2] == env.placement[7]


def _greedy_step_time(network, problem, initial="single"):
    env = PlacementEnvironment(problem, initial=initial, seed=0)
    rollout([env], make_logits_fn(network, env.observation_spec()), None)
    return env.step_time_s


def test_agent_learns_the_best_placement_of_two_chains():
    problem = two_chains()
    # No lookahead prior: what the policy knows it learns from the rewards.
    network = PlacetoNetwork(hidden=16, seed=0, lookahead_prior=0.0)
    result = train(problem, episodes=96, seed=0, rollouts_per_update=4, initial="single",
                   learning_rate=3e-2, network=network, progress=False)
    improvements = [h["improvement"] for h in result.history]
    assert np.mean(improvements[-16:]) > np.mean(improvements[:16]) + 0.1
    assert result.best[0].step_time_s == pytest.approx(3e-3)
    assert _greedy_step_time(result.network, problem) == pytest.approx(3e-3)


def test_training_is_deterministic_and_resumes_exactly(tmp_path):
    problem = layered(seed=4)

    def run(episodes, logdir=None):
        result = train(problem, episodes=episodes, seed=5, rollouts_per_update=2, hidden=8,
                       initial=("random", "single"), logdir=logdir, checkpoint_every=1,
                       progress=False)
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
    with open(os.path.join(logdir, "state.json")) as f:
        assert json.load(f)["episodes"] == 8


def test_saved_policy_reloads_to_identical_actions(tmp_path):
    problem = layered(seed=5)
    network = PlacetoNetwork(hidden=8, seed=9, lookahead_prior=0.0)
    env = PlacementEnvironment(problem, initial="random", seed=0)
    network.warm_up(env.observation_spec())
    placer.save_policy(network, str(tmp_path / "policy"))
    loaded = placer.load_policy(str(tmp_path / "policy"))
    experience, weights, _ = rollout([env], make_logits_fn(network, env.observation_spec()), None)
    observation = {k: tf.constant(v[0]) for k, v in experience.observation.items()}
    np.testing.assert_array_equal(network(observation).numpy(), loaded(observation).numpy())
    assert loaded.config == network.config


def test_placer_is_valid_deterministic_and_never_worse_than_its_start(tmp_path):
    problem = layered(seed=6, cpu_only=[3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = placer.place(problem, seed=0, policy_dir=str(tmp_path / "none"))
    assert any("freshly initialized" in str(w.message) for w in caught)
    second = placer.place(problem, seed=0, policy_dir=str(tmp_path / "none"))
    np.testing.assert_array_equal(first, second)
    assert problem.allowed[np.arange(problem.num_nodes), first].all()
    simulator = problem.simulator()
    start = next(iter(placer.starting_placements(problem).values()))
    assert simulator.run(first)[0] <= simulator.run(start)[0]


def test_placer_uses_the_shipped_policy_when_there_is_one():
    if placer.load_policy() is None:
        pytest.skip("no policy shipped in tfplaceto/policy/pretrained/")
    problem = two_chains()
    device_of = placer.place(problem, seed=0)
    assert problem.simulator().run(device_of)[0] <= 6e-3


def test_iterated_search_leaves_a_local_optimum_that_hill_climbing_cannot():
    # Chains of 3 with 100 MB between links (4 ms over NVLink, each op 1 ms): from "all on one
    # device" every single move adds a transfer (worse), only moving a whole chain helps.
    from tfplaceto.baselines import local_search
    from tfplaceto.rl.environment import Best

    problem = two_chains(megabytes=100)
    simulator = problem.simulator()
    start = np.zeros(problem.num_nodes, np.int32)
    assert simulator.run(start)[0] == pytest.approx(6e-3)
    climbed = local_search.climb(problem, start, np.random.default_rng(0), float("inf"))
    assert simulator.run(climbed)[0] == pytest.approx(6e-3)  # stuck
    best = Best()
    best.offer(simulator.run(start)[0], False, start)
    network = PlacetoNetwork(hidden=8, seed=0)
    no_blocks = local_search.Moves([], np.zeros(0, np.int32))  # the perturbations alone
    found = placer.improve(problem, network, best, seed=0, window=3, patience=50,
                           perturb=placer.random_window_moves(problem, 3),
                           neighbourhoods=placer.prepare_neighbourhoods(problem, no_blocks))
    assert found.step_time_s == pytest.approx(3e-3)
    assert simulator.run(found.placement)[0] == pytest.approx(3e-3)


def test_block_moves_move_a_chain_that_single_moves_cannot():
    from tfplaceto.baselines import local_search

    problem = two_chains(length=4, megabytes=100)  # every single move from one device is worse
    simulator = problem.simulator()
    start = np.zeros(problem.num_nodes, np.int32)
    rng = np.random.default_rng(0)
    assert simulator.run(local_search.climb(problem, start, rng, float("inf")))[0] == pytest.approx(8e-3)
    blocks = placer.block_moves(problem)
    assert {len(nodes) for nodes in blocks.nodes} == {2, 4}  # runs of 2 and 4 classes (of 8)
    climbed = local_search.climb(problem, start, rng, float("inf"), moves=blocks)
    assert simulator.run(climbed)[0] == pytest.approx(4e-3)  # one chain per device
    assert len(set(climbed[:4])) == 1 and len(set(climbed[4:])) == 1 and climbed[0] != climbed[4]


def test_search_role_episodes_perturb_a_local_optimum_and_end_climbed():
    # Training in the search's role: episodes start where the search does (the best fast baseline,
    # climbed) or from the best found so far, re-place a window, and are climbed; the return is
    # the climbed improvement where positive.
    problem = layered(seed=6, width=5, depth=6)
    simulator = problem.simulator()
    role = placer.SearchRole(seed=0)
    start = role.start(problem, None).copy()
    fast = next(iter(placer.starting_placements(problem).values()))
    assert simulator.run(start)[0] <= simulator.run(fast)[0]
    np.testing.assert_array_equal(placer.polish(problem, start, np.random.default_rng(1)), start)
    ends = []
    result = train(problem, episodes=12, seed=0, network=PlacetoNetwork(hidden=8, seed=0), progress=False,
                   callback=lambda entry: ends.append(entry["step_time_s"]), **role.train_kwargs())
    assert len(ends) == 12 and result.episodes == 12
    np.testing.assert_array_equal(role.start(problem, None), start)
    best = simulator.run(role.best(problem, None))[0]
    assert best == pytest.approx(min([simulator.run(start)[0]] + ends))
    assert best < simulator.run(start)[0]  # the perturbations left the optimum
    assert result.best[0].step_time_s <= best


def test_gains_only_rewards_the_positive_improvement_at_the_end():
    problem = layered(seed=3)
    finals = []
    for seed in range(6):
        env = PlacementEnvironment(problem, initial="single", seed=seed, window=4, gains_only=True)
        rng = np.random.default_rng(seed)
        step = env.reset()
        rewards = []
        while not step.is_last():
            step = env.step(rng.choice(np.flatnonzero(step.observation[F.ACTION_MASK])))
            rewards.append(float(step.reward))
        summary = env.episode_summary()
        assert rewards[:-1] == [0.0] * (len(rewards) - 1)
        assert rewards[-1] == pytest.approx(max(0.0, summary["improvement"]), abs=1e-6)
        finals.append(summary["improvement"])
    assert min(finals) < 0 < max(finals)  # both kinds of episode were seen
