"""Policy features and network: node-level edges, reachability, observations, features, any device count."""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.policy import features as F
from tfplaceto.policy.network import MASKED_LOGIT, PlacetoNetwork
from tfplaceto.policy.observation import (
    Dims,
    dims_for,
    graph_statics,
    node_edges,
    observation,
    observation_spec,
    pack,
)
from tfplaceto.problem import Problem, allowed_devices


def diamond_problem(cluster="2xV100", cpu_only=()):
    """a -> (b, c) -> d, with a duplicated a->b tensor; `cpu_only` nodes have no GPU kernel."""
    names = ["a", "b", "c", "d"]
    kernels = np.ones((4, 2), bool)
    for node in cpu_only:
        kernels[node, 1] = False
    graph = make_op_graph(names, ["MatMul"] * 4, tensor_producer=[0, 0, 1, 2],
                          tensor_bytes=[4000, 8000, 4000, 4000], edge_tensor=[0, 1, 0, 2, 3],
                          edge_consumer=[1, 1, 2, 3, 3], kernels=kernels)
    cluster = tp.Cluster.preset(cluster)
    compute = np.tile(np.array([1.0, 2.0, 3.0, 1.0])[:, None] * 1e-3, (1, cluster.num_devices))
    compute[:, -1] *= 10  # the host CPU is slower
    return Problem(graph, cluster, compute, allowed_devices(graph, cluster))


def _observation(problem, step=0, dims=None, placement=None):
    statics = graph_statics(problem)
    dims = dims or dims_for([statics])
    placement = np.zeros(problem.num_nodes, np.int32) if placement is None else placement
    start, end, peak = problem.simulator().schedule(placement)
    busy = np.bincount(placement, weights=end - start, minlength=problem.num_devices)
    obs = observation(statics, dims, 0, step, placement, np.zeros(problem.num_nodes), start, end,
                        busy, peak.astype(float), float(end.max()))
    packed = {k: tf.constant(v) for k, v in pack([statics], dims).items()}
    return packed, {k: tf.constant(v[None]) for k, v in obs.items()}


def test_node_edges_are_deduplicated_pairs_with_summed_bytes():
    graph = diamond_problem().graph
    senders, receivers, nbytes = node_edges(graph)
    pairs = dict(zip(zip(senders.tolist(), receivers.tolist()), nbytes.tolist()))
    assert pairs == {(0, 1): 12000, (0, 2): 4000, (1, 3): 4000, (2, 3): 4000}


def test_ancestors_and_descendants_of_each_step():
    statics = graph_statics(diamond_problem())
    assert statics.steps.tolist()[0] == 0 and statics.steps.tolist()[-1] == 3
    last, first = statics.num_steps - 1, 0
    assert statics.step_ancestors[last].tolist() == [True, True, True, False]
    assert statics.step_descendants[first].tolist() == [False, True, True, True]
    b = statics.steps.tolist().index(1)  # b and c are parallel: neither reaches the other
    assert not statics.step_ancestors[b, 2] and not statics.step_descendants[b, 2]


def test_observation_matches_its_spec():
    problem = diamond_problem("4xV100")
    statics = graph_statics(problem)
    dims = dims_for([statics])
    assert dims == Dims(nodes=5, edges=4, devices=5, steps=4)
    _, obs = _observation(problem)
    for key, array_spec in observation_spec(dims).items():
        assert obs[key].shape[1:] == array_spec.shape and obs[key].dtype == array_spec.dtype, key


def test_device_features_price_the_transfers_of_the_current_node():
    # a on GPU 0, b (current) anywhere: receiving a's 12 kB on GPU 1 costs latency + bytes / bandwidth.
    problem = diamond_problem("2xV100")
    statics = graph_statics(problem)
    b = statics.steps.tolist().index(1)
    packed, obs = _observation(problem, step=b)
    devices = F.compute_features(packed, obs).devices.numpy()[0]
    cluster = problem.cluster
    expected = (cluster.latency[0, 1] + 12000 / cluster.bandwidth[0, 1]) / statics.time_scale
    assert devices[0, 4] == pytest.approx(0.0)  # receive on GPU 0: nothing moves
    assert devices[1, 4] == pytest.approx(expected, rel=1e-4)
    assert devices[:, 0].tolist() == [1, 0, 0]  # b is on GPU 0 now
    assert devices[:, 10].tolist() == pytest.approx([1, 0, 0])  # all its input bytes are on GPU 0


def test_one_network_scores_2_4_and_8_devices():
    network = PlacetoNetwork(hidden=16, rounds=2, seed=3)
    for cluster, devices in (("2xV100", 3), ("4xV100", 5), ("8xV100", 9)):
        problem = diamond_problem(cluster, cpu_only=[1])
        statics = graph_statics(problem)
        b = statics.steps.tolist().index(1)  # node b: CPU only
        logits = network(*_observation(problem, step=b)).numpy()[0]
        assert logits.shape == (devices,)
        assert (logits[:-1] == MASKED_LOGIT).all() and logits[-1] > MASKED_LOGIT
        logits = network(*_observation(problem, step=0)).numpy()[0]
        assert np.isfinite(logits).all() and (logits > MASKED_LOGIT).all()
    assert len(network.trainable_variables) > 0


def test_padding_does_not_change_the_logits():
    problem = diamond_problem("4xV100")
    network = PlacetoNetwork(hidden=16, seed=1)
    placement = np.array([0, 1, 2, 1], np.int32)
    small = network(*_observation(problem, step=2, placement=placement)).numpy()[0]
    padded = _observation(problem, step=2, placement=placement, dims=Dims(nodes=12, edges=20, devices=9, steps=7))
    large = network(*padded).numpy()[0]
    np.testing.assert_allclose(large[:5], small, rtol=1e-5, atol=1e-5)
    assert (large[5:] == MASKED_LOGIT).all()


def test_same_seed_same_weights():
    first, second = PlacetoNetwork(seed=7), PlacetoNetwork(seed=7)
    first.warm_up()
    second.warm_up()
    for a, b in zip(first.trainable_variables, second.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _observed(problem, step, placement, visited):
    statics = graph_statics(problem)
    dims = dims_for([statics])
    start, end, peak = problem.simulator().schedule(placement)
    busy = np.bincount(placement, weights=end - start, minlength=problem.num_devices)
    obs = observation(statics, dims, 0, step, placement, visited, start, end, busy, peak.astype(float),
                      float(end.max()))
    return {k: tf.constant(v[None]) for k, v in obs.items()}


def test_the_placed_view_sees_the_visited_nodes_devices_and_nothing_of_the_others():
    problem = diamond_problem("4xV100")
    statics = graph_statics(problem)
    packed = {k: tf.constant(v) for k, v in pack([statics], dims_for([statics])).items()}
    b = statics.steps.tolist().index(1)
    visited = np.array([1.0, 0, 0, 0])  # a was placed (on GPU 1); b, c, d sit where the start put them
    one = _observed(problem, b, np.array([1, 0, 0, 0], np.int32), visited)
    other = _observed(problem, b, np.array([1, 3, 2, 1], np.int32), visited)
    moved_a = _observed(problem, b, np.array([2, 0, 0, 0], np.int32), visited)
    for view, same in (("placed", True), ("full", False)):
        first, second = F.compute_features(packed, one, view), F.compute_features(packed, other, view)
        for name in ("nodes", "edges", "devices"):
            equal = np.array_equal(getattr(first, name).numpy(), getattr(second, name).numpy())
            assert equal == same, (view, name)
        network = PlacetoNetwork(hidden=8, rounds=2, seed=1, view=view)
        assert np.array_equal(network(packed, one).numpy(), network(packed, other).numpy()) == same
    # What it sees of a: b's inputs are all on GPU 1 (and on GPU 2 once a moves there).
    assert F.compute_features(packed, one, "placed").devices.numpy()[0, :, 10].tolist() == [0, 1, 0, 0, 0]
    assert F.compute_features(packed, moved_a, "placed").devices.numpy()[0, :, 10].tolist() == [0, 0, 1, 0, 0]
    with pytest.raises(tp.errors.InvalidArgumentError, match="view"):
        PlacetoNetwork(view="partial")


def test_with_the_placed_view_a_greedy_episode_ends_where_it_ends_from_any_start():
    from tfplaceto.rl.acting import greedy_placements

    problem = diamond_problem("4xV100")
    # The nodes-on-device embedding, with the placed view, is over the visited nodes only.
    for view, nodes_on_device, one_end in (("placed", None, True), ("placed", True, True), ("full", None, False)):
        network = PlacetoNetwork(hidden=8, rounds=2, seed=2, view=view, nodes_on_device=nodes_on_device)
        ends = greedy_placements(problem, network, "random", starts=8, seed=0)
        assert (len({tuple(p) for p in ends}) == 1) == one_end, (view, nodes_on_device)
