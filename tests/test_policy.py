"""Policy features and network: node-level edges, reachability, observations, features, any device count."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.cli import main
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.policy import features as F
from tfplaceto.policy.checkpoint import ensemble_policies, load_policy, save_policy
from tfplaceto.policy.network import MASKED_LOGIT, DeviceScorer, PlacetoNetwork
from tfplaceto.policy.observation import (
    Dims,
    dims_for,
    graph_statics,
    node_edges,
    observation,
    observation_spec,
    pack,
    step_edges,
)
from tfplaceto.problem import Problem, allowed_devices, make_problem


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


def test_device_features_sum_over_the_edges_of_the_class_as_over_all_edges():
    # The (class, device) features read each step's edge lists (`step_edges`); here against sums
    # over every edge weighted by "into / out of the class", on a graph with colocation classes.
    op_graph = tp.import_graph("builtin:cifar10-cells/0")
    cluster = tp.Cluster.preset("4xV100")
    problem = make_problem(op_graph, cluster, tp.profile(op_graph, cluster))
    statics = graph_statics(problem)
    into, out_of = step_edges(statics)
    sender_class, receiver_class = statics.classes[statics.senders], statics.classes[statics.receivers]
    for step, c in enumerate(statics.step_class):
        assert into[step].tolist() == [e for e in range(len(statics.senders))
                                       if receiver_class[e] == c and sender_class[e] != c]
        assert out_of[step].tolist() == [e for e in range(len(statics.senders))
                                         if sender_class[e] == c and receiver_class[e] != c]
    assert max(len(edges) for edges in into) > 1  # classes with several inputs are checked
    d = statics.num_devices
    placement = problem.tie(np.random.default_rng(0).integers(0, d, problem.num_nodes).astype(np.int32))
    steps = [int(np.argmax([len(edges) for edges in into])), int(np.argmax([len(edges) for edges in out_of])), 0, 5]
    p = {k: v[0] for k, v in pack([statics], dims_for([statics])).items()}
    for step in steps:
        packed, obs = _observation(problem, step=step, placement=placement)
        devices = F.compute_features(packed, obs).devices.numpy()[0]
        end, start = obs["end"].numpy()[0], obs["start"].numpy()[0]
        e_in, e_out = into[step], out_of[step]
        src, dst = placement[statics.senders[e_in]], placement[statics.receivers[e_out]]
        to_device = p["latency"][src] + p["transfer_bytes"][e_in, None] * p["inverse_bandwidth"][src]  # (K, D)
        from_device = p["latency"][:, dst].T + p["transfer_bytes"][e_out, None] * p["inverse_bandwidth"][:, dst].T
        ready = np.max(np.concatenate([np.zeros((1, d)), end[statics.senders[e_in], None] + to_device]), 0)
        in_bytes, out_bytes = p["edge_bytes"][e_in], p["edge_bytes"][e_out]
        expected = {4: np.clip(to_device.sum(0), 0, F.CLIP), 5: np.clip(from_device.sum(0), 0, F.CLIP),
                    6: np.clip(ready - start[statics.steps[step]], -F.CLIP, F.CLIP),
                    10: np.bincount(src, in_bytes, d) / max(in_bytes.sum(), 1e-9),
                    11: np.bincount(dst, out_bytes, d) / max(out_bytes.sum(), 1e-9)}
        allowed = obs["action_mask"].numpy()[0, :d]
        for column, values in expected.items():
            np.testing.assert_allclose(devices[:d, column], values * allowed, rtol=1e-5, atol=1e-6)


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


def test_on_a_later_pass_the_placed_view_also_sees_the_class_own_device_and_counts_its_memory_once():
    # A second pass (`PlacementEnvironment(passes=2)`) places b again with every node visited:
    # the (class, device) features are those of b not yet placed, with the same devices for the
    # others, but for the first column, which now says where b is (on the first pass: nothing).
    problem = diamond_problem("4xV100")
    statics = graph_statics(problem)
    packed = {k: tf.constant(v) for k, v in pack([statics], dims_for([statics])).items()}
    b = statics.steps.tolist().index(1)
    placement = np.array([1, 2, 0, 3], np.int32)
    first_pass = F.compute_features(packed, _observed(problem, b, placement, np.array([1.0, 0, 1, 1])), "placed")
    second_pass = F.compute_features(packed, _observed(problem, b, placement, np.ones(4)), "placed")
    first, second = first_pass.devices.numpy()[0], second_pass.devices.numpy()[0]
    assert first[:, 0].tolist() == [0, 0, 0, 0, 0] and second[:, 0].tolist() == [0, 0, 1, 0, 0]
    np.testing.assert_array_equal(first[:, 1:], second[:, 1:])  # its memory counted once (column 2)
    assert first[:, 2].max() > 0


def test_transfer_costs_price_every_edge_and_the_class_outputs_whatever_the_view_shows(tmp_path):
    # a (the current class) sends 12 kB to b and 4 kB to c; in the placed view, before anything
    # is visited, the other features price none of it; the transfer-cost columns do.
    problem = diamond_problem("2xV100")
    statics = graph_statics(problem)
    packed, obs = _observation(problem, step=0, placement=np.array([0, 1, 0, 1], np.int32))
    plain = F.compute_features(packed, obs, "placed")
    priced = F.compute_features(packed, obs, "placed", transfer_costs=True)
    assert priced.edges.shape[-1] == F.widths(True)["edge"] == plain.edges.shape[-1] + 1
    assert priced.devices.shape[-1] == F.widths(True)["device"] == plain.devices.shape[-1] + 1
    np.testing.assert_array_equal(priced.devices.numpy()[..., :-1], plain.devices.numpy())
    assert plain.devices.numpy()[0, :, 5].tolist() == [0, 0, 0]  # "send": its consumers are not seen
    latency, bandwidth, scale = problem.cluster.latency, problem.cluster.bandwidth, statics.time_scale
    d = problem.num_devices
    others = [[o for o in range(d) if o != device] for device in range(d)]
    send = [np.mean([2 * latency[device, o] + 16000 / bandwidth[device, o] for o in others[device]]) / scale
            for device in range(d)]
    np.testing.assert_allclose(priced.devices.numpy()[0, :d, -1], send, rtol=1e-4)
    pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
    for e, nbytes in enumerate(statics.edge_bytes):
        cross = (np.mean([latency[i, j] for i, j in pairs]) + nbytes * np.mean([1 / bandwidth[i, j] for i, j in pairs]))
        assert priced.edges.numpy()[0, e, -1] == pytest.approx(min(cross / scale, F.CLIP), rel=1e-4)
    # A network with them scores with them and is saved and loaded as such.
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0, view="placed", transfer_costs=True)
    logits = network(packed, obs).numpy()
    save_policy(network, str(tmp_path / "policy"))
    loaded = load_policy(str(tmp_path / "policy"))
    assert loaded.feature_widths == F.widths(True) and loaded.config["transfer_costs"]
    np.testing.assert_allclose(loaded(packed, obs).numpy(), logits, rtol=1e-5)
    assert PlacetoNetwork().feature_widths == {"node": F.NODE_FEATURES, "edge": F.EDGE_FEATURES,
                                               "device": F.DEVICE_FEATURES}


def test_unvisited_work_is_the_work_beside_and_below_the_class(tmp_path):
    # a (1 ms) -> (b 2 ms, c 3 ms) -> d (1 ms) on 2 GPUs and a CPU: a fair share is 7/3 ms.
    problem = diamond_problem("2xV100")
    statics = graph_statics(problem)
    packed = {k: tf.constant(v) for k, v in pack([statics], dims_for([statics])).items()}
    placement, b = np.zeros(4, np.int32), statics.steps.tolist().index(1)
    for step, visited, beside, below in ((0, [0, 0, 0, 0], 0.0, 6.0), (b, [1, 0, 0, 0], 3.0, 1.0)):
        obs = _observed(problem, step, placement, np.array(visited, float))
        plain = F.compute_features(packed, obs, "placed").devices.numpy()[0]
        with_work = F.compute_features(packed, obs, "placed", unvisited_work=True).devices.numpy()[0]
        assert with_work.shape[-1] == F.widths(unvisited_work=True)["device"] == plain.shape[-1] + 2
        np.testing.assert_array_equal(with_work[:, :-2], plain)
        d = problem.num_devices
        np.testing.assert_allclose(with_work[:d, -2:], [[beside / (7 / 3), below / (7 / 3)]] * d, rtol=1e-5)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0, view="placed", unvisited_work=True)
    network(packed, obs)
    save_policy(network, str(tmp_path / "policy"))
    assert load_policy(str(tmp_path / "policy")).config["unvisited_work"]


def _scorer_logits(scorer, devices, mask):
    """A `DeviceScorer`'s logits of one observation with these device features (B=1)."""
    features = F.Features(nodes=None, edges=None, senders=None, receivers=None, node_mask=None,
                          current=None, ancestors=None, descendants=None, placement=None, seen=None,
                          devices=tf.constant(devices[None], tf.float32),
                          action_mask=tf.constant(mask[None]))
    context = tf.constant(np.linspace(-1.0, 1.0, 8)[None], tf.float32)
    return scorer(context, tf.zeros([1, 3, 4]), features).numpy()[0]


def test_device_context_scores_each_device_beside_the_others_and_is_saved_with_the_policy(tmp_path):
    rng = np.random.default_rng(0)
    devices = rng.uniform(0.0, 1.0, (4, F.DEVICE_FEATURES))
    mask = np.array([True, True, True, False])
    together = DeviceScorer(8, np.random.default_rng(1), nodes_on_device=False, device_context=True)
    alone = DeviceScorer(8, np.random.default_rng(1), nodes_on_device=False)
    changed = devices.copy()
    changed[2] += 1.0  # another device's features change; device 0's own do not
    for scorer, interacts in ((together, True), (alone, False)):
        before, after = _scorer_logits(scorer, devices, mask), _scorer_logits(scorer, changed, mask)
        assert before[3] == after[3] == MASKED_LOGIT
        assert (abs(before[0] - after[0]) > 1e-4) == interacts
        # Devices have no identity: permuting them permutes their logits.
        order = np.array([2, 0, 1, 3])
        np.testing.assert_allclose(_scorer_logits(scorer, devices[order], mask[order]), before[order],
                                   rtol=1e-5, atol=1e-6)
    # A disallowed device's features do not reach the allowed ones' logits.
    hidden_change = devices.copy()
    hidden_change[3] += 5.0
    np.testing.assert_allclose(_scorer_logits(together, hidden_change, mask)[:3],
                               _scorer_logits(together, devices, mask)[:3], rtol=1e-6)
    # A network with it is saved and loaded as such, and scores as it did.
    problem = diamond_problem("2xV100")
    packed, obs = _observation(problem, step=1, placement=np.array([0, 1, 0, 1], np.int32))
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0, view="placed", device_context=True)
    logits = network(packed, obs).numpy()
    save_policy(network, str(tmp_path / "policy"))
    loaded = load_policy(str(tmp_path / "policy"))
    assert loaded.config["device_context"] and not PlacetoNetwork().config["device_context"]
    np.testing.assert_allclose(loaded(packed, obs).numpy(), logits, rtol=1e-5)


def test_an_ensemble_scores_the_mean_of_its_members_log_probabilities_and_is_saved_with_the_policy(tmp_path):
    problem = diamond_problem("4xV100")
    packed, obs = _observation(problem, step=2, placement=np.array([0, 1, 2, 1], np.int32))
    ensemble = PlacetoNetwork(hidden=8, rounds=2, seed=3, view="placed", ensemble=3)
    alone = [PlacetoNetwork(hidden=8, rounds=2, seed=3 + k, view="placed") for k in range(3)]
    logits = ensemble(packed, obs).numpy()
    # Member k is the network of seed 3 + k, so the ensemble is theirs.
    expected = np.mean([tf.nn.log_softmax(network(packed, obs)).numpy() for network in alone], axis=0)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(alone[0](packed, obs), alone[1](packed, obs))  # members of their own seeds
    assert ensemble.embed(packed, obs).shape[-1] == ensemble.embedding_width == 24
    assert len(ensemble.trainable_variables) == 3 * len(alone[0].trainable_variables)
    save_policy(ensemble, str(tmp_path / "policy"))
    loaded = load_policy(str(tmp_path / "policy"))
    assert loaded.config["ensemble"] == 3 and PlacetoNetwork.completed_config({})["ensemble"] == 1
    np.testing.assert_allclose(loaded(packed, obs).numpy(), logits, rtol=1e-6)
    with pytest.raises(tp.errors.InvalidArgumentError, match="ensemble"):
        PlacetoNetwork(ensemble=0)


def test_policies_trained_apart_make_one_ensemble_member_for_member_and_stay_as_they_were(tmp_path, capsys):
    problem = diamond_problem("4xV100")
    packed, obs = _observation(problem, step=2, placement=np.array([0, 1, 2, 1], np.int32))
    one = PlacetoNetwork(hidden=8, rounds=2, seed=5, view="placed")
    pair = PlacetoNetwork(hidden=8, rounds=2, seed=9, view="placed", ensemble=2)
    paths = [str(tmp_path / "one"), str(tmp_path / "pair")]
    save_policy(one, paths[0])
    save_policy(pair, paths[1])
    files = {p: open(os.path.join(p, "policy.json")).read() for p in paths}
    out = str(tmp_path / "ensemble")
    assert main(["ensemble", *paths, "--out", out]) == 0
    assert "an ensemble of 3 networks" in capsys.readouterr().out
    loaded = load_policy(out)
    assert loaded.config["ensemble"] == 3 and [m.config["seed"] for m in loaded.members] == [5, 6, 7]
    # Its members are the three networks as trained (not networks of its seeds), in order.
    expected = np.mean([tf.nn.log_softmax(network(packed, obs)).numpy()
                        for network in (one, *pair.members)], axis=0)
    np.testing.assert_allclose(loaded(packed, obs).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert {p: open(os.path.join(p, "policy.json")).read() for p in paths} == files
    assert main(["ensemble", *paths, "--out", out]) == 2  # exists: --overwrite replaces it
    assert "--overwrite" in capsys.readouterr().err
    assert ensemble_policies(paths[::-1], out, overwrite=True).members[0].config["seed"] == 9
    assert load_policy(out).config["seed"] == 9  # replaced: the pair's members first now
    save_policy(PlacetoNetwork(hidden=16, rounds=2, seed=5, view="placed"), str(tmp_path / "wide"))
    with pytest.raises(tp.errors.PolicyError, match="another network config .*hidden"):
        ensemble_policies([paths[0], str(tmp_path / "wide")], str(tmp_path / "mixed"))
    with pytest.raises(tp.errors.OutputExistsError, match="would overwrite its policy"):
        ensemble_policies(paths, paths[1] + "/inside")
    assert main(["ensemble", *paths, "--out", "/proc/ensemble"]) == 2  # not writable: one line, no traceback
    assert "/proc" in capsys.readouterr().err
    with pytest.raises(tp.errors.InvalidArgumentError, match="two networks or more"):
        ensemble_policies(paths[:1], str(tmp_path / "alone"))
    assert not os.path.exists(tmp_path / "mixed") and not os.path.exists(tmp_path / "alone")
