"""Policy features and network: node-level edges, reachability, padded observations, any device count."""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.policy import features as F
from tfplaceto.policy.network import MASKED_LOGIT, PlacetoNetwork
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


def _observation(problem, step=0, dims=None):
    statics = F.graph_statics(problem)
    dims = dims or F.dims_for([statics], [problem.num_devices])
    placement = np.zeros(problem.num_nodes, np.int32)
    result = problem.simulator().result(placement)
    names = result.device_names
    sim = F.SimState(result.step_time_s, result.node_start_s, result.node_end_s,
                     np.array([result.busy_s[n] for n in names]),
                     np.array([result.peak_memory_bytes[n] for n in names], float))
    node = statics.steps[step]
    return F.observation(statics, dims, placement, sim, step, np.zeros(problem.num_nodes),
                         problem.allowed[node])


def test_node_edges_are_deduplicated_pairs_with_summed_bytes():
    graph = diamond_problem().graph
    senders, receivers, nbytes = F.node_edges(graph)
    pairs = dict(zip(zip(senders.tolist(), receivers.tolist()), nbytes.tolist()))
    assert pairs == {(0, 1): 12000, (0, 2): 4000, (1, 3): 4000, (2, 3): 4000}
    gt = F.graphs_tuple(graph, np.zeros((4, 3)))
    assert gt.n_node.tolist() == [4] and gt.n_edge.tolist() == [4]


def test_reachability_of_a_diamond():
    statics = F.graph_statics(diamond_problem())
    assert statics.ancestors[3].tolist() == [True, True, True, False]
    assert statics.descendants[0].tolist() == [False, True, True, True]
    # b and c are parallel: neither reaches the other.
    assert not statics.ancestors[1, 2] and not statics.descendants[1, 2]


def test_observation_matches_its_spec_and_pads_with_a_dummy_node():
    problem = diamond_problem("4xV100")
    obs = _observation(problem)
    spec = F.observation_spec(F.dims_for([F.graph_statics(problem)], [5]))
    for key, array_spec in spec.items():
        assert obs[key].shape == array_spec.shape and obs[key].dtype == array_spec.dtype, key
    assert obs[F.NODE_MASK].tolist() == [1, 1, 1, 1, 0]
    assert np.isfinite(obs[F.NODES]).all() and np.isfinite(obs[F.DEVICES]).all()
    # The current node is on device 0, which is one of 5 device rows.
    assert obs[F.DEVICES][:, 0].tolist() == [1, 0, 0, 0, 0]


def test_one_network_scores_2_4_and_8_devices():
    network = PlacetoNetwork(hidden=16, rounds=2, seed=3)
    for cluster, devices in (("2xV100", 3), ("4xV100", 5), ("8xV100", 9)):
        problem = diamond_problem(cluster, cpu_only=[1])
        obs = _observation(problem, step=1)  # node b: CPU only
        logits = network({k: tf.constant(v[None]) for k, v in obs.items()}).numpy()[0]
        assert logits.shape == (devices,)
        assert (logits[:-1] == MASKED_LOGIT).all() and logits[-1] > MASKED_LOGIT
        obs = _observation(problem, step=0)
        logits = network({k: tf.constant(v[None]) for k, v in obs.items()}).numpy()[0]
        assert np.isfinite(logits).all() and (logits > MASKED_LOGIT).all()
    assert len(network.trainable_variables) > 0


def test_padding_does_not_change_the_logits():
    problem = diamond_problem("4xV100")
    network = PlacetoNetwork(hidden=16, seed=1)
    tight = _observation(problem)
    padded = _observation(problem, dims=F.Dims(nodes=12, edges=20, devices=9))
    small = network({k: tf.constant(v[None]) for k, v in tight.items()}).numpy()[0]
    large = network({k: tf.constant(v[None]) for k, v in padded.items()}).numpy()[0]
    np.testing.assert_allclose(large[:5], small, rtol=1e-5, atol=1e-5)
    assert (large[5:] == MASKED_LOGIT).all()


def test_same_seed_same_weights():
    spec = F.observation_spec(F.Dims(nodes=3, edges=2, devices=2))
    first, second = PlacetoNetwork(seed=7), PlacetoNetwork(seed=7)
    first.warm_up(spec)
    second.warm_up(spec)
    for a, b in zip(first.trainable_variables, second.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("bad", [F.Dims(nodes=4, edges=10, devices=5), F.Dims(nodes=8, edges=10, devices=2)])
def test_observation_refuses_dims_too_small(bad):
    with pytest.raises(ValueError, match="exceeds the padded sizes"):
        _observation(diamond_problem("4xV100"), dims=bad)
