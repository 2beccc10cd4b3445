"""Built-in benchmark graphs and graph families: what `"builtin:NAME"` resolves to.

Every entry is a real tf.keras model, compiled with its loss and optimizer, so importing it gives
the whole training step (forward, backward, optimizer update). `tfplaceto.graph.import_graph`
calls `build(NAME)` and imports the model it returns at the batch size it returns.

Map of the file:
  BuiltinModel, MODELS     the registry: name -> builder, default batch size, kind, description.
  build(name)              "inception_v3" -> (compiled model, batch); "cifar10-cells/7" -> family
                           member with seed 7 ("cifar10-cells" alone is seed 0).
  family(name, seed)       one member of a graph family.
  describe()               (name, description) rows for `tfplaceto models`.
  estimate_memory_bytes    the memory estimate quoted in the descriptions (formula below).
  _inception_v3, _nasnet_large, _nasnet_mobile, _gnmt   the benchmark models.
  _cifar10_cells, _ptb_cells, _nmt_variant              the family generators (ENAS-like).
  _fresh_layer_names       auto-generated Keras layer names restart from zero for each build.

Determinism: a name always gives the same graph (same op names, same structure). Weight values
are seeded for the GNMT-style models and random elsewhere (placement does not depend on them).
Random structure choices come from a local
`random.Random(seed)`; global seeds are never touched. Keras numbers auto-generated layer names
with process-wide counters (conv2d_37 ...), so a build runs with fresh counters and merges them
back afterwards (`_fresh_layer_names`): the second build of a name in a process matches the first.
Nothing is downloaded: Keras applications are built with weights=None.

Memory estimates (`estimate_memory_bytes`, quoted in each description, float32):
  state       = 4 B * (all weights + trainable weights * (1 gradient + optimizer slots));
                slots: Adam 2, RMSprop 1, SGD with momentum 1.
  activations = 4 B * batch * the elements of every layer output of the forward pass (all kept
                for the backward pass), plus the tensors an LSTM keeps per time step (4 gate
                pre-activations, 4 gate activations, cell state and its tanh: 10 x units) and an
                additive attention's [target len, source len, units] score tensor (x2: sum, tanh).
  unrolled RNN weight gradients = 4 B * steps * the RNN's weights: the gradient of a weight
                used at every step is one AddN over the steps' partial gradients, so all of
                them are alive at once (with 1024 units, 1.3 GB per LSTM over 40 steps: the
                largest term of the NMT models, independent of the batch).
  It ignores workspace and other transient backward tensors (e.g. the gradients of the
  [batch, 40, 32k] softmax), so a real peak is higher; the simulator's single-device peak
  (`tp.simulate`, everything on one K80) is quoted next to it where it was measured.
  A K80 has 12 GB. Batch sizes: inception_v3 32 (4.4 GB: fits one K80, memory does not bind);
  nasnet 16 (19.6 GB: not one K80, 2 or 4); the NMT models GNMT's 128 (13.3, 20.3, 34.1 GB: from
  just over one K80 to 3+); see each builder's docstring for the numbers.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

from tfplaceto import errors

GB = 1e9


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
    """One registry entry.

    builder: for kind "model", `builder()`; for kind "family", `builder(seed)`; both return a
      compiled tf.keras.Model.
    """

    name: str
    description: str
    builder: Callable[..., Any]
    batch_size: int
    kind: str = "model"  # "model" or "family"


# -- shared helpers -------------------------------------------------------------------------------

def _keras():
    # TensorFlow takes seconds to import: only builders need it, `tfplaceto models` does not.
    import tensorflow as tf

    return tf.keras


@contextlib.contextmanager
def _fresh_layer_names() -> Iterator[None]:
    """Auto-generated layer names restart at zero inside; the counters are merged back after.

    Keras keeps process-wide counters per name prefix, so the 2nd InceptionV3 built in a process
    would be named conv2d_94... instead of conv2d...; a benchmark graph must not depend on what
    was built before it. Merging back (max of both counters, union of the observed names) keeps
    names the caller builds later unique, as if nothing had been reset.
    """
    try:
        from keras.src import backend as keras_backend
        uid_maps = keras_backend.PER_GRAPH_OBJECT_NAME_UIDS
        observed = keras_backend.OBSERVED_NAMES
    except (ImportError, AttributeError):  # another Keras: names may depend on history
        yield
        return
    saved_maps = {graph: dict(uids) for graph, uids in uid_maps.items()}
    saved_observed = set(observed)
    uid_maps.clear()
    observed.clear()
    try:
        yield
    finally:
        for graph, uids in saved_maps.items():
            merged = uid_maps.get(graph)
            if merged is None:
                merged = uid_maps[graph] = collections.defaultdict(int)
            for prefix, count in uids.items():
                merged[prefix] = max(merged[prefix], count)
        observed.update(saved_observed)


def _optimizer_slots(optimizer) -> int:
    kind = type(optimizer).__name__.lower()
    config = optimizer.get_config()
    if "adam" in kind:
        return 2
    if "rmsprop" in kind:
        return 1 + int(bool(config.get("momentum"))) + int(bool(config.get("centered")))
    if "sgd" in kind:
        return int(bool(config.get("momentum")))
    return 2  # unknown optimizers: assume Adam-like


def _layer_memory_elements(layer) -> tuple[int, int]:
    """(elements per example, elements independent of the batch) `layer` keeps for backward."""
    import numpy as np

    keras = _keras()
    per_example = sum(int(np.prod(output.shape[1:])) for output in _flat(layer.output))
    fixed = 0
    rnns = []
    if isinstance(layer, keras.layers.Bidirectional):
        rnns = [layer.forward_layer, layer.backward_layer]
    elif isinstance(layer, keras.layers.RNN):
        rnns = [layer]
    for rnn in rnns:
        steps = int(_flat(layer.input)[0].shape[1])
        if isinstance(rnn, keras.layers.LSTM):
            per_example += steps * 10 * rnn.units
        if rnn.unroll:
            fixed += steps * sum(int(np.prod(w.shape)) for w in rnn.trainable_weights)
    if isinstance(layer, keras.layers.AdditiveAttention):
        query, value = _flat(layer.input)[:2]
        per_example += 2 * int(query.shape[1]) * int(value.shape[1]) * int(query.shape[2])
    return per_example, fixed


def _flat(structure) -> list:
    import tensorflow as tf

    return tf.nest.flatten(structure)


def estimate_memory_bytes(model, batch_size: int) -> int:
    """Training-step memory estimate of a compiled model on one device (module docstring)."""
    import numpy as np

    keras = _keras()
    weights = sum(int(np.prod(w.shape)) for w in model.weights)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    state = weights + trainable * (1 + _optimizer_slots(model.optimizer))
    per_example = fixed = 0
    for layer in model.layers:
        if not isinstance(layer, keras.layers.InputLayer):
            layer_per_example, layer_fixed = _layer_memory_elements(layer)
            per_example += layer_per_example
            fixed += layer_fixed
    return 4 * (state + fixed + batch_size * per_example)


def _sparse_ce():
    return _keras().losses.SparseCategoricalCrossentropy()


# Optimizers are built with jit_compile=False: with the default, Keras XLA-compiles the update
# only when a GPU is visible, and the imported graph would depend on the machine.
def _adam(learning_rate: float = 1e-3):
    return _keras().optimizers.Adam(learning_rate, jit_compile=False)


def _sgd_momentum(learning_rate: float = 0.1):
    # For the CNNs rather than the papers' RMSProp: one slot either way (same memory), but
    # RMSProp's update is ~1.4x the ops (NASNet-A Mobile: 19.8k vs 14.6k ops in the step), and
    # per-variable update ops are what dominates the op count of these graphs.
    return _keras().optimizers.SGD(learning_rate, momentum=0.9, jit_compile=False)


# -- benchmark models -------------------------------------------------------------------------------

def _inception_v3():
    """Inception-v3, 299x299x3, 1000 classes, SGD with momentum; batch 32.

    23.9 M weights; layer outputs 32.3 M floats (129 MB) per example. Estimate at batch 32:
    state 23.9 M * 4 B * 3 = 0.29 GB + activations 32 * 129 MB = 4.1 GB: 4.4 GB (simulated
    single-K80 peak 5.7 GB). Fits one K80: batch 32 is its usual per-GPU batch, and this is the
    benchmark where memory does not bind, only speed.
    """
    keras = _keras()
    model = keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3), classes=1000)
    model.compile(optimizer=_sgd_momentum(), loss=_sparse_ce())
    return model


def _nasnet_large():
    """NASNet-A Large, 331x331x3, 1000 classes, SGD with momentum; batch 16.

    Chosen over NASNet-A Mobile (also registered, `nasnet_mobile`) as the ImageNet-scale NASNet:
    ~20k vs ~15k ops in the training step, import ~35-40 s each on a loaded 2-core machine, both
    manageable. 88.9 M weights; layer outputs 290 M floats (1.16 GB) per example. Estimate at
    batch 16: state 88.9 M * 4 B * 3 = 1.07 GB + activations 16 * 1.16 GB = 18.6 GB: 19.6 GB
    (simulated single-K80 peak 21.7 GB). Does not fit one 12 GB K80, fits 2 (24 GB) only when
    well balanced and 4 (48 GB) comfortably; batch 8 (10.4 GB) would fit one K80, and batch 32
    (38.2 GB, so ~42 GB at the simulator's ratio) would leave 4 K80s almost no slack.
    """
    keras = _keras()
    model = keras.applications.NASNetLarge(weights=None, input_shape=(331, 331, 3), classes=1000)
    model.compile(optimizer=_sgd_momentum(), loss=_sparse_ce())
    return model


def _nasnet_mobile():
    """NASNet-A Mobile, 224x224x3, 1000 classes, SGD with momentum; batch 128.

    5.3 M weights; layer outputs 27.5 M floats (110 MB) per example. Estimate at batch 128:
    state 0.06 GB + activations 14.1 GB: 14.2 GB (simulated single-K80 peak 15.3 GB): does not fit
    one K80, fits 2.
    """
    keras = _keras()
    model = keras.applications.NASNetMobile(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(optimizer=_sgd_momentum(), loss=_sparse_ce())
    return model


def _gnmt(name: str, num_layers: int, units: int = 1024, vocab: int = 32000, steps: int = 40,
          attention: bool = True, optimizer=None, unroll: bool = True):
    """A GNMT-style encoder-decoder training model, unrolled over `steps` time steps.

    Encoder: embedding, `encoder_lstm_1` bidirectional, `encoder_lstm_2..N` unidirectional,
    residual connections from layer 3 on. Decoder: embedding of the (teacher-forced) target,
    `decoder_lstm_1..N` started from the final states of the encoder layer of the same depth
    (the backward direction of the bidirectional one), residual from layer 3 on. Attention
    (Luong-style placement, Bahdanau scoring as in GNMT): the top decoder output attends over the
    top encoder outputs; [output, context] -> tanh projection -> `softmax` over the vocabulary.
    Every LSTM is unrolled (`unroll=True`): the graph has one set of ops per time step and no
    While loop, which is what a placer needs to spread a layer's steps or pipeline layers.
    With unroll=False each LSTM is Keras' default: a while loop over the steps (and one more for
    its gradient), the form most Keras users train; `nmt_2l_loop` is nmt_2l in that form.
    Weights start uniform in [-0.1, 0.1] as in GNMT, seeded per weight so values are reproducible
    too (and Keras's default orthogonal recurrent init, a QR per LSTM, would dominate build time).
    """
    keras = _keras()
    layers = keras.layers
    seeds = iter(range(1, 1000))

    def uniform():
        return keras.initializers.RandomUniform(-0.1, 0.1, seed=next(seeds))

    def lstm(layer_name: str, return_state: bool):
        return layers.LSTM(units, return_sequences=True, return_state=return_state, unroll=unroll,
                           kernel_initializer=uniform(), recurrent_initializer=uniform(),
                           name=layer_name)

    source = layers.Input((steps,), dtype="int32", name="source_tokens")
    target = layers.Input((steps,), dtype="int32", name="target_tokens")
    x = layers.Embedding(vocab, units, embeddings_initializer=uniform(),
                         name="encoder_embedding")(source)
    x, _, _, backward_h, backward_c = layers.Bidirectional(
        lstm("encoder_lstm_1", True), name="encoder_lstm_1")(x)
    states = [[backward_h, backward_c]]
    for i in range(2, num_layers + 1):
        y, h, c = lstm(f"encoder_lstm_{i}", True)(x)
        x = layers.Add(name=f"encoder_residual_{i}")([y, x]) if i >= 3 else y
        states.append([h, c])
    encoder_outputs = x

    x = layers.Embedding(vocab, units, embeddings_initializer=uniform(),
                         name="decoder_embedding")(target)
    for i in range(1, num_layers + 1):
        y = lstm(f"decoder_lstm_{i}", False)(x, initial_state=states[i - 1])
        x = layers.Add(name=f"decoder_residual_{i}")([y, x]) if i >= 3 else y
    if attention:
        context = layers.AdditiveAttention(name="attention")([x, encoder_outputs])
        x = layers.Concatenate(name="attention_concat")([x, context])
        x = layers.Dense(units, activation="tanh", use_bias=False, kernel_initializer=uniform(),
                         name="attention_output")(x)
    probabilities = layers.Dense(vocab, activation="softmax", kernel_initializer=uniform(),
                                 name="softmax")(x)
    model = keras.Model([source, target], probabilities, name=name)
    model.compile(optimizer=optimizer or _adam(), loss=_sparse_ce())
    return model


def _nmt(num_layers: int):
    """nmt_2l / nmt_4l / nmt_8l: `_gnmt` at GNMT size (1024 units, 32k vocabularies), 40 steps.

    Batch 128 (GNMT's). Estimates (module docstring; simulated single-K80 peak in brackets):
      nmt_2l  146.6 M weights, 15.6k ops: 13.3 GB (13.7): just over one K80, fits 2.
      nmt_4l  180.2 M weights, 27.8k ops: 20.3 GB (20.4): fits 2 K80s only when well balanced.
      nmt_8l  247.3 M weights, 52.0k ops: 34.1 GB (33.8): needs 3+ K80s (fits 4 and 8).
    Most of it is the unrolled LSTMs' per-step weight gradients (1.3 GB per LSTM), which do not
    shrink with the batch, so a smaller batch would not make them fit one K80 either.
    """
    return functools.partial(_gnmt, f"nmt_{num_layers}l", num_layers)


def _nmt_loop(num_layers: int):
    """nmt_2l_loop: `_nmt(num_layers)`'s model with Keras' default LSTMs (while loops, not
    unrolled): the same mathematics and weights, 40 iterations of each loop per step. Imported
    for a cluster with GPUs (`import_graph(..., cluster=)`, as the bench does) each LSTM is
    cuDNN's fused op instead, as TensorFlow runs it there (`tfplaceto.graph.implementations`).

    Estimate 6.0 GB: nmt_2l's 13.3 GB without the unrolled per-step weight gradients (a loop
    accumulates its weight gradient in place); the simulated single-device peak of the grouped
    graph is 16.7 GB on a V100 (nmt_2l's: 24.0 GB), transient backward tensors included.
    4.7k ops, 10 loops (5 LSTMs, a gradient loop each), all with static trip counts.
    """
    return functools.partial(_gnmt, f"nmt_{num_layers}l_loop", num_layers, unroll=False)


# -- graph families ---------------------------------------------------------------------------------

CNN_OPS = ("conv3x3", "conv5x5", "sep_conv3x3", "sep_conv5x5", "max_pool3x3", "avg_pool3x3",
           "identity")
RNN_ACTIVATIONS = ("tanh", "relu", "sigmoid", "identity")


def _cifar10_cells(seed: int):
    """A random ENAS-like convolutional network for 32x32x3 CIFAR-10 images, 10 classes.

    stem conv -> N cells (3..6; the cells at 1/3 and 2/3 of the depth are reduction cells: stride
    2, twice the channels) -> global average pool -> dense softmax. A cell takes the outputs of the
    two previous cells (projected by 1x1 convs to a common shape when they differ) and computes
    2..4 nodes; each node applies one op from CNN_OPS to each of two earlier values of the cell
    (the cell inputs or earlier nodes) and sums them; the nodes no other node uses are
    concatenated and projected back to the cell's channels. Convs are ReLU-conv-batchnorm.
    SGD with momentum.
    """
    keras = _keras()
    layers = keras.layers
    rng = random.Random(seed)
    channels = rng.choice((16, 24, 32))
    num_cells = rng.randint(3, 6)
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
    model.compile(optimizer=_sgd_momentum(0.05), loss=_sparse_ce())
    return model


@functools.cache
def _random_rnn_cell_class():
    """The Keras RNN cell class of ptb-cells (defined lazily: it needs TensorFlow)."""
    keras = _keras()
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


def _ptb_cells(seed: int):
    """A random ENAS-like recurrent language model (PTB-sized: 10k vocabulary).

    embedding -> one random cell (3..6 nodes, activations from RNN_ACTIVATIONS, 128..512 units)
    unrolled over 20..35 steps -> dense softmax over the vocabulary at every step. Adam.
    """
    keras = _keras()
    layers = keras.layers
    rng = random.Random(seed)
    steps = rng.randint(20, 35)
    units = rng.choice((128, 256, 512))
    num_nodes = rng.randint(3, 6)
    node_inputs = [0] + [rng.randrange(i) for i in range(1, num_nodes)]
    node_activations = [rng.choice(RNN_ACTIVATIONS) for _ in range(num_nodes)]
    tokens = layers.Input((steps,), dtype="int32", name="tokens")
    x = layers.Embedding(10000, units, name="embedding")(tokens)
    cell = _random_rnn_cell_class()(units, node_inputs, node_activations, name="cell")
    x = layers.RNN(cell, return_sequences=True, unroll=True, name="rnn")(x)
    probabilities = layers.Dense(10000, activation="softmax", name="softmax")(x)
    model = keras.Model(tokens, probabilities, name=f"ptb_cells_{seed}")
    model.compile(optimizer=_adam(), loss=_sparse_ce())
    return model


def _nmt_variant_plan(seed: int) -> dict[str, Any]:
    """The random choices of nmt-variants member `seed`: keyword arguments of `_gnmt`.

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


def _nmt_variant(seed: int):
    """A random GNMT-style model (`_gnmt` with `_nmt_variant_plan(seed)`); Adam."""
    return _gnmt(**_nmt_variant_plan(seed))


# -- registry ---------------------------------------------------------------------------------------

def _entry(name: str, description: str, builder, batch_size: int, kind: str = "model"):
    return name, BuiltinModel(name, description, builder, batch_size, kind)


MODELS: dict[str, BuiltinModel] = dict([
    _entry("inception_v3", "Inception-v3 (299x299 ImageNet, SGD+momentum), batch 32; ~4.4 GB: "
           "fits one K80", _inception_v3, 32),
    _entry("nmt_2l", "GNMT-style NMT, 2+2 LSTM layers of 1024 (first bidirectional), attention, "
           "32k vocab, 40 steps unrolled (Adam), batch 128; ~13.3 GB: over one K80, fits 2",
           _nmt(2), 128),
    _entry("nmt_2l_loop", "nmt_2l with Keras' default LSTMs, not unrolled: imported for a GPU "
           "cluster, cuDNN's fused LSTM ops (what TensorFlow runs there), else while loops over "
           "the 40 steps (forward and gradient); same weights and batch 128; ~6.0 GB by the "
           "estimate for the loops (no per-step weight gradients held; simulated peaks are higher)",
           _nmt_loop(2), 128),
    _entry("nmt_4l", "GNMT-style NMT, 4+4 LSTM layers of 1024 (first bidirectional, residual from "
           "3), attention, 32k vocab, 40 steps unrolled (Adam), batch 128; ~20.3 GB: needs 2 "
           "K80s", _nmt(4), 128),
    _entry("nmt_8l", "GNMT-style NMT, 8+8 LSTM layers of 1024 (first bidirectional, residual from "
           "3), attention, 32k vocab, 40 steps unrolled (Adam), batch 128; ~34.1 GB: needs 3+ "
           "K80s", _nmt(8), 128),
    _entry("nasnet", "NASNet-A Large (331x331 ImageNet, SGD+momentum), batch 16; ~19.6 GB: does "
           "not fit one 12 GB K80, fits 2 to 4", _nasnet_large, 16),
    _entry("nasnet_mobile", "NASNet-A Mobile (224x224 ImageNet, SGD+momentum), batch 128; "
           "~14.2 GB: does not fit one K80, fits 2", _nasnet_mobile, 128),
    _entry("cifar10-cells", "family: random ENAS-like CNNs, 3-6 cells of 2-4 nodes (conv, sep-conv, "
           "pool, identity) on 32x32 CIFAR-10 images, batch 64, 1k-2.5k ops; NAME/SEED picks "
           "a member", _cifar10_cells, 64, "family"),
    _entry("ptb-cells", "family: random ENAS-like recurrent cells of 3-6 nodes unrolled over "
           "20-35 steps, 10k vocab, batch 64, 1k-2.5k ops; NAME/SEED picks a member",
           _ptb_cells, 64, "family"),
    _entry("nmt-variants", "family: GNMT-style models, depth 2-6, width 256-1024, attention or "
           "not, 3-9 unrolled steps, batch 64, 3k-5k ops; NAME/SEED picks a member",
           _nmt_variant, 64, "family"),
])


def _unknown(name: str) -> errors.InvalidGraphError:
    known = ", ".join(f"{n}/SEED" if m.kind == "family" else n for n, m in MODELS.items())
    return errors.InvalidGraphError(
        f"unknown built-in graph {name!r}; known: {known} (`tfplaceto models` describes them)")


def family(name: str, seed: int) -> tuple[Any, int]:
    """Member `seed` of graph family `name`: (compiled tf.keras.Model, batch size)."""
    entry = MODELS.get(name)
    if entry is None or entry.kind != "family":
        raise _unknown(name if entry is None else f"{name}/{seed}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise errors.InvalidGraphError(
            f"the seed of built-in family {name!r} must be an int >= 0, got {seed!r}")
    with _fresh_layer_names():
        return entry.builder(seed), entry.batch_size


def check_name(name) -> tuple[BuiltinModel, int | None]:
    """(entry, family seed or None) for a built-in name, without building anything.

    Raises InvalidGraphError listing the known names for anything that is not one.
    """
    if not isinstance(name, str):
        raise _unknown(repr(name))
    base, slash, seed_text = name.strip().partition("/")
    entry = MODELS.get(base)
    if entry is None:
        raise _unknown(name)
    if entry.kind == "family":
        if not slash:
            return entry, 0
        if not (seed_text.isascii() and seed_text.isdigit()):
            raise errors.InvalidGraphError(
                f"built-in graph {name!r}: the seed after '/' must be an int >= 0, "
                f"e.g. {base}/7")
        return entry, int(seed_text)
    if slash:
        raise errors.InvalidGraphError(
            f"built-in graph {name!r}: {base!r} is a single model, not a family; use {base!r}")
    return entry, None


def build(name: str) -> tuple[Any, int]:
    """The built-in graph `name`: (compiled tf.keras.Model, default batch size).

    `name` is a model ("nmt_4l"), a family member ("cifar10-cells/7") or a family alone (its
    member 0). Raises InvalidGraphError listing the known names for anything else.
    """
    entry, seed = check_name(name)
    if seed is not None:
        return family(entry.name, seed)
    with _fresh_layer_names():
        return entry.builder(), entry.batch_size


def describe() -> list[tuple[str, str]]:
    """(name, description) of every built-in model and family, for `tfplaceto models`."""
    return [(name, entry.description) for name, entry in MODELS.items()]


__all__ = ["MODELS", "BuiltinModel", "build", "check_name", "describe", "estimate_memory_bytes", "family"]
