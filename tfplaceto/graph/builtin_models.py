"""The built-in benchmark models (`builtin.py` registers them) and their memory estimate.

Map of the file:
  inception_v3, nasnet_large, nasnet_mobile   Keras applications, weights=None, SGD+momentum.
  gnmt                 a GNMT-style encoder-decoder (unrolled LSTMs, or while loops), Adam;
                       nmt / nmt_loop its registered sizes (nmt_2l, nmt_4l, nmt_8l, nmt_2l_loop).
  estimate_memory_bytes, GB   the memory estimate quoted in the descriptions (below).
  tf_keras, sparse_ce, adam, sgd_momentum    what the builders here and in
                       `builtin_families.py` share (TensorFlow is imported when one is called).

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

import functools

GB = 1e9


def tf_keras():
    # TensorFlow takes seconds to import: only builders need it, `tfplaceto models` does not.
    import tensorflow as tf

    return tf.keras


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

    keras = tf_keras()
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

    keras = tf_keras()
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


def sparse_ce():
    return tf_keras().losses.SparseCategoricalCrossentropy()


# Optimizers are built with jit_compile=False: with the default, Keras XLA-compiles the update
# only when a GPU is visible, and the imported graph would depend on the machine.
def adam(learning_rate: float = 1e-3):
    return tf_keras().optimizers.Adam(learning_rate, jit_compile=False)


def sgd_momentum(learning_rate: float = 0.1):
    # For the CNNs rather than the papers' RMSProp: one slot either way (same memory), but
    # RMSProp's update is ~1.4x the ops (NASNet-A Mobile: 19.8k vs 14.6k ops in the step), and
    # per-variable update ops are what dominates the op count of these graphs.
    return tf_keras().optimizers.SGD(learning_rate, momentum=0.9, jit_compile=False)


# -- benchmark models -------------------------------------------------------------------------------

def inception_v3():
    """Inception-v3, 299x299x3, 1000 classes, SGD with momentum; batch 32.

    23.9 M weights; layer outputs 32.3 M floats (129 MB) per example. Estimate at batch 32:
    state 23.9 M * 4 B * 3 = 0.29 GB + activations 32 * 129 MB = 4.1 GB: 4.4 GB (simulated
    single-K80 peak 5.7 GB). Fits one K80: batch 32 is its usual per-GPU batch, and this is the
    benchmark where memory does not bind, only speed.
    """
    keras = tf_keras()
    model = keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3), classes=1000)
    model.compile(optimizer=sgd_momentum(), loss=sparse_ce())
    return model


def nasnet_large():
    """NASNet-A Large, 331x331x3, 1000 classes, SGD with momentum; batch 16.

    Chosen over NASNet-A Mobile (also registered, `nasnet_mobile`) as the ImageNet-scale NASNet:
    ~20k vs ~15k ops in the training step, import ~35-40 s each on a loaded 2-core machine, both
    manageable. 88.9 M weights; layer outputs 290 M floats (1.16 GB) per example. Estimate at
    batch 16: state 88.9 M * 4 B * 3 = 1.07 GB + activations 16 * 1.16 GB = 18.6 GB: 19.6 GB
    (simulated single-K80 peak 21.7 GB). Does not fit one 12 GB K80, fits 2 (24 GB) only when
    well balanced and 4 (48 GB) comfortably; batch 8 (10.4 GB) would fit one K80, and batch 32
    (38.2 GB, so ~42 GB at the simulator's ratio) would leave 4 K80s almost no slack.
    """
    keras = tf_keras()
    model = keras.applications.NASNetLarge(weights=None, input_shape=(331, 331, 3), classes=1000)
    model.compile(optimizer=sgd_momentum(), loss=sparse_ce())
    return model


def nasnet_mobile():
    """NASNet-A Mobile, 224x224x3, 1000 classes, SGD with momentum; batch 128.

    5.3 M weights; layer outputs 27.5 M floats (110 MB) per example. Estimate at batch 128:
    state 0.06 GB + activations 14.1 GB: 14.2 GB (simulated single-K80 peak 15.3 GB): does not fit
    one K80, fits 2.
    """
    keras = tf_keras()
    model = keras.applications.NASNetMobile(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(optimizer=sgd_momentum(), loss=sparse_ce())
    return model


def gnmt(name: str, num_layers: int, units: int = 1024, vocab: int = 32000, steps: int = 40,
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
    keras = tf_keras()
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
    model.compile(optimizer=optimizer or adam(), loss=sparse_ce())
    return model


def nmt(num_layers: int):
    """nmt_2l / nmt_4l / nmt_8l: `gnmt` at GNMT size (1024 units, 32k vocabularies), 40 steps.

    Batch 128 (GNMT's). Estimates (module docstring; simulated single-K80 peak in brackets):
      nmt_2l  146.6 M weights, 15.6k ops: 13.3 GB (13.7): just over one K80, fits 2.
      nmt_4l  180.2 M weights, 27.8k ops: 20.3 GB (20.4): fits 2 K80s only when well balanced.
      nmt_8l  247.3 M weights, 52.0k ops: 34.1 GB (33.8): needs 3+ K80s (fits 4 and 8).
    Most of it is the unrolled LSTMs' per-step weight gradients (1.3 GB per LSTM), which do not
    shrink with the batch, so a smaller batch would not make them fit one K80 either.
    """
    return functools.partial(gnmt, f"nmt_{num_layers}l", num_layers)


def nmt_loop(num_layers: int):
    """nmt_2l_loop: `nmt(num_layers)`'s model with Keras' default LSTMs (while loops, not
    unrolled): the same mathematics and weights, 40 iterations of each loop per step. Imported
    for a cluster with GPUs (`import_graph(..., cluster=)`, as the bench does) each LSTM is
    cuDNN's fused op instead, as TensorFlow runs it there (`tfplaceto.graph.implementations`).

    Estimate 6.0 GB: nmt_2l's 13.3 GB without the unrolled per-step weight gradients (a loop
    accumulates its weight gradient in place); the simulated single-device peak of the grouped
    graph is 16.7 GB on a V100 (nmt_2l's: 24.0 GB), transient backward tensors included.
    4.7k ops, 10 loops (5 LSTMs, a gradient loop each), all with static trip counts.
    """
    return functools.partial(gnmt, f"nmt_{num_layers}l_loop", num_layers, unroll=False)
