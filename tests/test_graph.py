"""GraphDef -> OpGraph: edge bytes against TF's own shapes, memory, kernels, colocation, errors."""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.graph.from_graph_def import colocated_kernels, op_graph_from_graph_def


def _tf1_mlp(layers=3, width=16):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        h = x
        for i in range(layers):
            w = tf.compat.v1.get_variable(f"w{i}", [width, width], use_resource=True)
            h = tf.nn.relu(tf.matmul(h, w), name=f"relu{i}")
        loss = tf.reduce_sum(h, name="loss")
        tf.compat.v1.train.AdamOptimizer().minimize(loss, name="train")
    return graph


def test_edge_bytes_match_tensorflow_shapes():
    graph = _tf1_mlp()
    op_graph = tp.import_graph(graph.as_graph_def(), fetches=["train"], batch_size=8)
    # Re-import with the batch filled and compare every edge against TF's own static shapes.
    with tf.Graph().as_default() as check:
        tf.compat.v1.import_graph_def(op_graph.graph_def, name="")
    ops = {op.name: op for op in check.get_operations()}
    for tensor, consumer in zip(op_graph.edge_tensor, op_graph.edge_consumer):
        producer = op_graph.names[op_graph.tensor_producer[tensor]]
        inputs = [t for t in ops[op_graph.names[consumer]].inputs if t.op.name == producer]
        assert inputs
        t = inputs[0]
        if t.dtype in (tf.resource, tf.variant):
            assert op_graph.tensor_bytes[tensor] == 0
            continue
        expected = int(np.prod(t.shape.as_list())) * t.dtype.size
        sizes = {int(np.prod(i.shape.as_list())) * i.dtype.size for i in inputs}
        assert op_graph.tensor_bytes[tensor] in sizes | {expected}
    assert op_graph.output_bytes[op_graph.index_of("relu0")] == 8 * 16 * 4
    assert op_graph.persistent_bytes[op_graph.index_of("w0")] == 16 * 16 * 4
    assert op_graph.persistent_bytes[op_graph.index_of("w0/Adam")] == 16 * 16 * 4


def test_pruned_to_fetches_and_sinks_by_default():
    graph = _tf1_mlp()
    full = tp.import_graph(graph.as_graph_def(), batch_size=2)
    pruned = tp.import_graph(graph.as_graph_def(), fetches="loss:0", batch_size=2)
    assert pruned.fetches == ("loss",)
    assert pruned.num_ops < full.num_ops
    assert "w0/Adam" not in pruned.names and "train" in full.fetches


def test_resource_variables_are_colocated_with_their_readers_and_updates():
    op_graph = tp.import_graph(_tf1_mlp().as_graph_def(), fetches=["train"], batch_size=2)
    colocation = op_graph.colocation
    var = colocation[op_graph.index_of("w1")]
    update = [i for i, n in enumerate(op_graph.names) if n.endswith("update_w1/ResourceApplyAdam")][0]
    assert colocation[update] == var
    assert colocation[op_graph.index_of("relu1")] != var


def test_kernels_come_from_the_registry():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        s = tf.strings.as_string(x, name="s")
        tf.strings.length(s, name="n")
    op_graph = tp.import_graph(graph.as_graph_def())
    gpu = tp.cluster.DEVICE_TYPES.index("GPU")
    assert not op_graph.kernels[op_graph.index_of("s"), gpu]
    assert op_graph.kernels[op_graph.index_of("x")].all()
    assert colocated_kernels(op_graph).shape == op_graph.kernels.shape


def test_topological_order_and_tf1_while_loops():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.disable_control_flow_v2()
        try:
            i = tf.constant(0)
            tf.compat.v1.while_loop(lambda i: i < 10, lambda i: i + 1, [i], name="loop")
        finally:
            tf.compat.v1.enable_control_flow_v2()
    op_graph = tp.import_graph(graph.as_graph_def())
    assert "NextIteration" in op_graph.types
    position = np.empty(op_graph.num_ops, int)
    position[op_graph.topo_order] = np.arange(op_graph.num_ops)
    assert (position[op_graph.senders] < position[op_graph.receivers]).all()


def test_cycles_fetches_and_unknown_sizes_are_refused():
    graph_def = tf.compat.v1.GraphDef()
    a = graph_def.node.add(name="a", op="Identity", input=["b"])
    a.attr["T"].type = tf.float32.as_datatype_enum
    b = graph_def.node.add(name="b", op="Identity", input=["a"])
    b.attr["T"].type = tf.float32.as_datatype_enum
    with pytest.raises(tp.errors.InvalidGraphError):
        op_graph_from_graph_def(graph_def)
    with pytest.raises(tp.errors.InvalidGraphError, match="batch_size"):
        tp.import_graph(_tf1_mlp().as_graph_def(), fetches=["train"])
    with pytest.raises(tp.errors.InvalidGraphError, match="trian"):
        tp.import_graph(_tf1_mlp().as_graph_def(), fetches=["trian"], batch_size=1)
    with pytest.raises(tp.errors.InvalidGraphError):
        tp.import_graph(tf.compat.v1.GraphDef())
    with pytest.raises(tp.errors.InvalidGraphError):
        tp.import_graph(_tf1_mlp().as_graph_def(), fetches=["train"], batch_size=0)


def test_fingerprint_is_stable_and_sensitive_to_batch():
    graph_def = _tf1_mlp().as_graph_def()
    a = tp.import_graph(graph_def, fetches=["train"], batch_size=4)
    b = tp.import_graph(graph_def, fetches=["train"], batch_size=4)
    c = tp.import_graph(graph_def, fetches=["train"], batch_size=8)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_joined_classes_number_classes_by_their_first_item():
    from tfplaceto.graph.op_graph import joined_classes

    assert joined_classes(5, [(3, 1), (4, 0)]).tolist() == [0, 1, 2, 1, 0]
    assert joined_classes(6, [(5, 2), (2, 4), (1, 1)]).tolist() == [0, 1, 2, 3, 2, 2]
    assert joined_classes(3, []).tolist() == [0, 1, 2]


def test_csr_groups_values_by_key_in_their_order():
    from tfplaceto.graph.op_graph import csr

    ptr, positions = csr([2, 0, 2, 1, 0], 4)
    assert ptr.tolist() == [0, 2, 3, 5, 5] and positions.tolist() == [1, 4, 3, 0, 2]
    ptr, grouped = csr(np.array([1, 0, 1], np.int32), 2, np.array([7, 8, 9]), np.int32)
    assert grouped.dtype == np.int32 and grouped.flags.c_contiguous and grouped.flags.writeable
    assert [grouped[ptr[k]:ptr[k + 1]].tolist() for k in range(2)] == [[8], [7, 9]]
    ptr, grouped = csr(np.zeros(0, np.int32), 3)
    assert ptr.tolist() == [0, 0, 0, 0] and grouped.size == 0
