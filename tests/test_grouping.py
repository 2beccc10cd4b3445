"""Grouping: acyclic, within budget, every op in one group, colocation kept as ties."""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.graph.grouping import scoped_topological_order
from tfplaceto.graph.op_graph import topological_order


@pytest.fixture(scope="module")
def training_graph():
    # Realistic sizes matter: at batch 32 the layers, not the optimizer's updates, carry the work.
    model = tf.keras.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None, classes=10, alpha=0.5)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return tp.import_graph(model, batch_size=32)


@pytest.mark.parametrize("max_groups", [1, 17, 64, 256])
def test_groups_are_acyclic_within_budget_and_cover_every_op(training_graph, max_groups):
    grouping = tp.group(training_graph, max_groups)
    grouped = grouping.graph
    assert 1 <= grouped.num_ops <= max_groups
    assert grouping.op_to_group.shape == (training_graph.num_ops,)
    assert set(np.unique(grouping.op_to_group)) == set(range(grouped.num_ops))
    topological_order(grouped.num_ops, np.concatenate([grouped.senders, grouped.control_senders]),
                      np.concatenate([grouped.receivers, grouped.control_receivers]))
    # Colocated ops end up in tied groups; persistent memory is conserved.
    ties = grouped.colocation[grouping.op_to_group]
    for cls in np.unique(training_graph.colocation):
        assert len(np.unique(ties[training_graph.colocation == cls])) == 1
    assert grouped.persistent_bytes.sum() == training_graph.persistent_bytes.sum()


def test_group_placement_expands_to_ops(training_graph):
    grouping = tp.group(training_graph, 32)
    device_of = np.arange(grouping.num_groups) % 3
    ops = grouping.expand(device_of)
    for op in range(0, training_graph.num_ops, 97):
        assert ops[op] == device_of[grouping.op_to_group[op]]


def test_scoped_order_is_topological(training_graph):
    order = scoped_topological_order(training_graph)
    position = np.empty(training_graph.num_ops, int)
    position[order] = np.arange(training_graph.num_ops)
    assert (position[training_graph.senders] < position[training_graph.receivers]).all()
    assert (position[training_graph.control_senders] < position[training_graph.control_receivers]).all()


def test_ties_stay_local_so_layers_can_be_spread(training_graph):
    # A variable is read by one layer and updated after its gradient: its tie class should join
    # a handful of groups (forward layer, update), not chain the whole graph onto one device.
    for max_groups in (64, 256):
        grouped = tp.group(training_graph, max_groups).graph
        largest = np.bincount(grouped.colocation).max()
        assert largest <= max(8, grouped.num_ops // 10), (max_groups, largest, grouped.num_ops)
        assert grouped.num_ops >= max_groups // 2


def test_recurrent_layers_are_not_tied_together():
    # An unrolled LSTM reads its weights at every step, each read colocated with the variable: a
    # group holding one layer's last steps and the next layer's first would tie the two layers,
    # and a run of such groups every layer (NMT-4l once had 38% of its compute in one tie class).
    tf.random.set_seed(0)
    tokens = tf.keras.Input((12,), dtype="int32")
    x = tf.keras.layers.Embedding(100, 32)(tokens)
    for i in range(3):
        x = tf.keras.layers.LSTM(32, return_sequences=True, unroll=True, name=f"lstm_{i}")(x)
    model = tf.keras.Model(tokens, tf.keras.layers.Dense(100)(x))
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    op_graph = tp.import_graph(model, batch_size=8)
    variables = [i for i in range(op_graph.num_ops) if op_graph.types[i] == "VarHandleOp"
                 and op_graph.names[i].split("/")[1].startswith("lstm_")]
    assert len(variables) == 9
    for max_groups in (16, 32, 64):
        grouping = tp.group(op_graph, max_groups)
        layers_of_tie: dict[int, set[str]] = {}
        for op in variables:
            tie = int(grouping.graph.colocation[grouping.op_to_group[op]])
            layers_of_tie.setdefault(tie, set()).add(op_graph.names[op].split("/")[1])
        assert all(len(layers) == 1 for layers in layers_of_tie.values()), (max_groups, layers_of_tie)


def test_optimizer_step_counter_stays_with_its_reads(training_graph):
    # Keras' Adam reads its step counter before the first update and increments it at the very
    # end, from a constant emitted there: left in the last group, the increment would tie that
    # group to the first update's, and through them the layers those groups update (NMT-4l: the
    # embedding, the first encoder layer and the softmax on one device).
    graph = training_graph
    class_size = np.bincount(graph.colocation)
    counter = [i for i in range(graph.num_ops) if graph.types[i] == "AssignAddVariableOp"
               and class_size[graph.colocation[i]] > 10]  # the one variable read by every update
    assert len(counter) == 1, [graph.names[i] for i in counter]
    members = graph.colocation == graph.colocation[counter[0]]
    for max_groups in (16, 64, 256):
        grouping = tp.group(graph, max_groups)
        assert len(np.unique(grouping.op_to_group[members])) == 1, max_groups


@pytest.mark.parametrize("max_groups", [32, 256])
def test_grouped_memory_is_close_to_the_ops(training_graph, max_groups):
    """A training step's peak memory on one device, simulated over its groups, is within 10% of
    the peak over its ops: a group holds each tensor that leaves it until that tensor's last
    reader (not all of them until the latest reader of any), and inside itself its largest
    output."""
    from tfplaceto.problem import make_problem
    from tfplaceto.sim.simulator import Simulator

    cluster = tp.Cluster.preset("2xV100")
    costs = tp.profile(training_graph, cluster)
    problem = make_problem(training_graph, cluster, costs, max_groups=max_groups)
    on_one = np.zeros(problem.num_nodes, np.int32)
    grouped_peak = problem.simulator().run(on_one)[1][0]
    op_peak = Simulator(training_graph, cluster, costs.per_device(training_graph, cluster)).run(
        problem.expand(on_one))[1][0]
    assert 0.9 < grouped_peak / op_peak < 1.1
