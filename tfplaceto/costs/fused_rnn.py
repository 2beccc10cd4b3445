"""Analytical costs of cuDNN's fused RNN ops (CudnnRNN*, CudnnRNNBackprop*), which grappler lacks.

A Keras LSTM or GRU imported for a GPU cluster is one CudnnRNN op (and one CudnnRNNBackprop op in
a training step; `tfplaceto.graph.implementations`). grappler's OpLevelCostEstimator has no
model for them and charges only their bytes, so a layer's whole recurrence would cost about as
much as copying its input. Here they are costed the way grappler costs a MatMul: FLOPs at the
device's peak plus bytes read and written at its memory bandwidth (grappler's default of not
overlapping the two), with the peak grappler itself derives for the device. The bytes: the
op's inputs and outputs once, and the recurrent weights once per time step (each step's product
with the hidden state reads them, as each step's MatMul of the standard loop does; caches are
not modelled, as grappler does not model them).

FLOPs of the forward op: for every layer and direction, every time step multiplies the batch's
[input, hidden state] by the gates' weights: T x B x (gates x H) x 2 x (I + H), gates = 4 (LSTM),
3 (GRU), 1 (plain RNN); the input of layers after the first is the previous layer's output
(directions x H). The backward op computes the gradients of the inputs and states (the same
products transposed) and of the weights (as many again): twice the forward FLOPs. The gates'
elementwise work (a few FLOPs per unit against 2 x gates x (I + H) for the products) is left out.
"""

from __future__ import annotations

import numpy as np

FORWARD_OPS = frozenset({"CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"})
BACKWARD_OPS = frozenset({"CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3"})
RNN_OPS = FORWARD_OPS | BACKWARD_OPS
_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def rnn_flops(op) -> float | None:
    """FLOPs of one execution of a tf.Operation of a type in RNN_OPS, or None when its input
    shapes are not static."""
    inputs, hidden = op.inputs[0].shape, op.inputs[1].shape
    if not (inputs.is_fully_defined() and hidden.is_fully_defined()) or inputs.rank != 3 or hidden.rank != 3:
        return None
    time_major = op.get_attr("time_major") if "time_major" in op.node_def.attr else True
    steps, batch, features = inputs.as_list() if time_major else (inputs[1], inputs[0], inputs[2])
    directions = 2 if op.get_attr("direction") == b"bidirectional" else 1
    layers = max(hidden[0] // directions, 1)
    units = hidden[2]
    gates = _GATES.get(op.get_attr("rnn_mode").decode(), 4)
    flops = 0.0
    for layer in range(layers):
        width = features if layer == 0 else directions * units
        flops += directions * steps * batch * gates * units * 2.0 * (width + units)
    return flops * (2.0 if op.type in BACKWARD_OPS else 1.0)


def recurrent_weight_bytes(op) -> int:
    """Bytes of recurrent weights read per execution: every time step's product with the hidden
    state reads the [H, gates x H] weights of each layer and direction again (twice in the
    backward op: for the state's gradient and to accumulate the weights' gradient)."""
    inputs, hidden = op.inputs[0].shape, op.inputs[1].shape
    time_major = op.get_attr("time_major") if "time_major" in op.node_def.attr else True
    steps = inputs[0] if time_major else inputs[1]
    units = hidden[2]
    gates = _GATES.get(op.get_attr("rnn_mode").decode(), 4)
    per_step = hidden[0] * units * gates * units * op.inputs[0].dtype.size
    return int(steps * per_step * (2 if op.type in BACKWARD_OPS else 1))


def rnn_work(op_graph) -> dict[int, tuple[float, int]]:
    """(FLOPs, bytes read and written) per op index of the graph's fused RNN ops (ops whose
    shapes are not static are left out: they keep grappler's estimate)."""
    targets = [i for i, kind in enumerate(op_graph.types) if kind in RNN_OPS]
    if not targets or op_graph.graph_def is None:
        return {}
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(op_graph.graph_def, name="")
    work = {}
    for i in targets:
        op = graph.get_operation_by_name(op_graph.names[i])
        flops = rnn_flops(op)
        if flops is not None:
            moved = sum(_bytes(t) for t in list(op.inputs) + list(op.outputs))
            work[i] = (flops, moved + recurrent_weight_bytes(op))
    return work


def seconds(work: tuple[float, int], peak_flops: float, bandwidth_bytes_s: float) -> float:
    """An op's time on a device: its FLOPs at the peak plus its bytes at the memory bandwidth."""
    flops, moved = work
    return flops / peak_flops + moved / bandwidth_bytes_s


def _bytes(tensor) -> int:
    shape = tensor.shape
    if not shape.is_fully_defined() or tensor.dtype.base_dtype.size == 0:
        return 0
    return int(np.prod(shape.as_list(), dtype=np.int64)) * tensor.dtype.base_dtype.size
