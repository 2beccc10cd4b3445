"""The built-in graph families (`builtin.py` registers them): random ENAS-like cells and
GNMT-style variants, one member per seed, for training and testing a policy across graphs.

Map of the file:
  cifar10_cells_plan, cifar10_cells   random convolutional cells on CIFAR-10 images (CNN_OPS).
  ptb_cells_plan, ptb_cells           random recurrent cells unrolled over PTB-like sequences
                                      (RNN_ACTIVATIONS).
  nmt_variant_plan, nmt_variant       a GNMT-style model (`builtin_models.gnmt`) of random size.
Structure choices come from a local `random.Random(seed)`; global seeds are never touched. A
family's plan function returns a member's first random choices (its size and kind) without
building it: what `builtin.covering_members` picks training members by.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from tfplaceto.graph.builtin_models import adam, gnmt, sgd_momentum, sparse_ce, tf_keras

CNN_OPS = ("conv3x3", "conv5x5", "sep_conv3x3", "sep_conv5x5", "max_pool3x3", "avg_pool3x3",
           "identity")
RNN_ACTIVATIONS = ("tanh", "relu", "sigmoid", "identity")


def _cifar10_cells_size(rng: random.Random) -> dict[str, int]:
    """The first draws of a cifar10-cells member: its base channels and number of cells."""
    channels = rng.choice((16, 24, 32))
    return {"channels": channels, "num_cells": rng.randint(3, 6)}


def cifar10_cells_plan(seed: int) -> dict[str, int]:
    """The size of cifar10-cells member `seed`: base channels (16, 24 or 32), cells (3..6). The
    cells' ops are drawn while the model is built."""
    return _cifar10_cells_size(random.Random(seed))


def cifar10_cells(seed: int):
    """A random ENAS-like convolutional network for 32x32x3 CIFAR-10 images, 10 classes.

    stem conv -> N cells (3..6; the cells at 1/3 and 2/3 of the depth are reduction cells: stride
    2, twice the channels) -> global average pool -> dense softmax. A cell takes the outputs of the
    two previous cells (projected by 1x1 convs to a common shape when they differ) and computes
    2..4 nodes; each node applies one op from CNN_OPS to each of two earlier values of the cell
    (the cell inputs or earlier nodes) and sums them; the nodes no other node uses are
    concatenated and projected back to the cell's channels. Convs are ReLU-conv-batchnorm.
    SGD with momentum.
    """
    keras = tf_keras()
    layers = keras.layers
    rng = random.Random(seed)
    size = _cifar10_cells_size(rng)
    channels, num_cells = size["channels"], size["num_cells"]
    reductions = {num_cells // 3, (2 * num_cells) // 3} - {0}

    def conv_bn(x, filters, kernel, strides, prefix, separable=False):
        x = layers.ReLU(name=f"{prefix}_relu")(x)
        conv = layers.SeparableConv2D if separable else layers.Conv2D
        x = conv(filters, kernel, strides=strides, padding="same", use_bias=False,
                 name=f"{prefix}_conv")(x)
        return layers.BatchNormalization(name=f"{prefix}_bn")(x)

    def apply_op(op, x, strides, prefix):
        if op.startswith("conv") or op.startswith("sep_conv"):
            kernel = int(op[-1])
            return conv_bn(x, channels, kernel, strides, prefix, separable=op.startswith("sep"))
        if op == "max_pool3x3":
            return layers.MaxPooling2D(3, strides=strides, padding="same", name=prefix)(x)
        if op == "avg_pool3x3":
            return layers.AveragePooling2D(3, strides=strides, padding="same", name=prefix)(x)
        if strides == 1:
            return x
        return conv_bn(x, channels, 1, strides, prefix)  # a strided identity: factorized reduce

    def calibrate(x, size, prefix):
        if int(x.shape[1]) > size:
            return conv_bn(x, channels, 1, 2, prefix)
        if int(x.shape[-1]) != channels:
            return conv_bn(x, channels, 1, 1, prefix)
        return x

    images = layers.Input((32, 32, 3), name="images")
    x = layers.Conv2D(channels, 3, padding="same", use_bias=False, name="stem_conv")(images)
    x = layers.BatchNormalization(name="stem_bn")(x)
    previous = [x, x]
    for cell in range(num_cells):
        reduction = cell in reductions
        if reduction:
            channels *= 2
        size = int(previous[1].shape[1])
        values = [calibrate(previous[0], size, f"cell{cell}_in0"),
                  calibrate(previous[1], size, f"cell{cell}_in1")]
        used = set()
        for node in range(rng.randint(2, 4)):
            terms = []
            for side in "ab":
                source = rng.randrange(len(values))
                op = rng.choice(CNN_OPS)
                # Ops on the cell inputs of a reduction cell halve the resolution.
                strides = 2 if reduction and source < 2 else 1
                used.add(source)
                terms.append(apply_op(op, values[source], strides,
                                      f"cell{cell}_node{node}_{side}_{op}"))
            values.append(layers.Add(name=f"cell{cell}_node{node}_sum")(terms))
        # Every node of a reduction cell is at half resolution (ops on the cell inputs have
        # stride 2, later nodes are already halved), so the loose ends can be concatenated.
        loose = [v for i, v in enumerate(values) if i >= 2 and i not in used]
        out = loose[0] if len(loose) == 1 else layers.Concatenate(name=f"cell{cell}_concat")(loose)
        out = conv_bn(out, channels, 1, 1, f"cell{cell}_out")
        previous = [previous[1], out]
    x = layers.ReLU(name="head_relu")(previous[1])
    x = layers.GlobalAveragePooling2D(name="head_pool")(x)
    probabilities = layers.Dense(10, activation="softmax", name="softmax")(x)
    model = keras.Model(images, probabilities, name=f"cifar10_cells_{seed}")
    model.compile(optimizer=sgd_momentum(0.05), loss=sparse_ce())
    return model


@functools.cache
def _random_rnn_cell_class():
    """The Keras RNN cell class of ptb-cells (defined lazily: it needs TensorFlow)."""
    keras = tf_keras()
    import tensorflow as tf

    activations = {"tanh": tf.tanh, "relu": tf.nn.relu, "sigmoid": tf.sigmoid,
                   "identity": tf.identity}

    class RandomRNNCell(keras.layers.Layer):
        """An ENAS-style recurrent cell: a random DAG of nodes, one matmul + activation each.

        node 0: act0(x W_x + h W_h); node i > 0: act_i(node_{p_i} W_i) with p_i < i. The new
        state is the mean of the nodes no other node reads (the loose ends).
        """

        def __init__(self, units: int, node_inputs, node_activations, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.node_inputs = tuple(node_inputs)
            self.node_activations = tuple(node_activations)
            self.state_size = units
            self.output_size = units

        def build(self, input_shape):
            units = self.units
            self.input_kernel = self.add_weight(name="input_kernel",
                                                shape=(int(input_shape[-1]), units))
            self.node_kernels = [self.add_weight(name=f"node{i}_kernel", shape=(units, units))
                                 for i in range(len(self.node_activations))]
            self.built = True

        def call(self, inputs, states):
            previous = states[0]
            nodes = []
            for i, name in enumerate(self.node_activations):
                if i == 0:
                    pre = tf.matmul(inputs, self.input_kernel) + tf.matmul(previous,
                                                                           self.node_kernels[0])
                else:
                    pre = tf.matmul(nodes[self.node_inputs[i]], self.node_kernels[i])
                nodes.append(activations[name](pre))
            read = set(self.node_inputs[1:])
            loose = [node for i, node in enumerate(nodes) if i not in read]
            output = loose[0] if len(loose) == 1 else tf.add_n(loose) / float(len(loose))
            return output, [output]

        def get_config(self):
            return {**super().get_config(), "units": self.units,
                    "node_inputs": self.node_inputs, "node_activations": self.node_activations}

    return RandomRNNCell


def ptb_cells_plan(seed: int) -> dict[str, Any]:
    """The random choices of ptb-cells member `seed`: unrolled steps (20..35), units (128, 256 or
    512), cell nodes (3..6), the earlier node each node reads and each node's activation."""
    rng = random.Random(seed)
    steps = rng.randint(20, 35)
    units = rng.choice((128, 256, 512))
    num_nodes = rng.randint(3, 6)
    node_inputs = [0] + [rng.randrange(i) for i in range(1, num_nodes)]
    node_activations = [rng.choice(RNN_ACTIVATIONS) for _ in range(num_nodes)]
    return {"steps": steps, "units": units, "num_nodes": num_nodes, "node_inputs": node_inputs,
            "node_activations": node_activations}


def ptb_cells(seed: int):
    """A random ENAS-like recurrent language model (PTB-sized: 10k vocabulary).

    embedding -> one random cell (3..6 nodes, activations from RNN_ACTIVATIONS, 128..512 units)
    unrolled over 20..35 steps -> dense softmax over the vocabulary at every step. Adam.
    """
    keras = tf_keras()
    layers = keras.layers
    plan = ptb_cells_plan(seed)
    steps, units = plan["steps"], plan["units"]
    tokens = layers.Input((steps,), dtype="int32", name="tokens")
    x = layers.Embedding(10000, units, name="embedding")(tokens)
    cell = _random_rnn_cell_class()(units, plan["node_inputs"], plan["node_activations"], name="cell")
    x = layers.RNN(cell, return_sequences=True, unroll=True, name="rnn")(x)
    probabilities = layers.Dense(10000, activation="softmax", name="softmax")(x)
    model = keras.Model(tokens, probabilities, name=f"ptb_cells_{seed}")
    model.compile(optimizer=adam(), loss=sparse_ce())
    return model


def nmt_variant_plan(seed: int) -> dict[str, Any]:
    """The random choices of nmt-variants member `seed`: keyword arguments of `gnmt`.

    Depth 2..6, width 256..1024, attention or not, vocabulary 8k or 16k (32k would double the
    weights of the largest members, which every import for training pays for). An unrolled LSTM
    step costs ~75 ops in the training step, so sequences are short: at most 48 LSTM steps in all
    ((2 * depth + 1) LSTMs, the bidirectional one counting twice), i.e. 3..9 steps at depth 2
    and 3 at depth 6, for 3k-5k ops per member.
    """
    rng = random.Random(seed)
    depth = rng.randint(2, 6)
    units = rng.choice((256, 512, 768, 1024))
    attention = rng.random() < 0.5
    vocab = rng.choice((8000, 16000))
    steps = rng.randint(3, max(3, 48 // (2 * depth + 1)))
    return {"name": f"nmt_variant_{seed}", "num_layers": depth, "units": units, "vocab": vocab,
            "steps": steps, "attention": attention}


def nmt_variant(seed: int):
    """A random GNMT-style model (`gnmt` with `nmt_variant_plan(seed)`); Adam."""
    return gnmt(**nmt_variant_plan(seed))
