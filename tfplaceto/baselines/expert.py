"""Expert: what a person would do by hand, from the op names (the "human expert" of Mirhoseini et
al., ICML 2017, and of the Placeto and Baechi evaluations).

Three rules, tried in order, all keyed on generic layer-name patterns (never on a model's name):
1. Encoder-decoder RNNs (GNMT-style, Wu et al. 2016): ops whose name has a layer like
   "encoder_lstm_3" or "decoder_gru_2" go to accelerator (layer index) mod G, so encoder and
   decoder layer i share a device and consecutive layers pipeline; ops named "attention..." or
   "...softmax..." go to the last accelerator. Needs at least two distinct layer indices.
2. Image networks (most of the compute in layers named conv/mixed/inception/nasnet/cell): the
   whole model on one accelerator, as data-parallel practice does, if it fits there (simulated
   peak memory); otherwise rule 3.
3. Anything else: a pipeline. Layers are name scopes (gradient and optimizer ops belong to the
   layer they differentiate or update); in order of first appearance in the topological order,
   they are cut into G contiguous stages of equal compute (on the fastest device), at layer
   boundaries. The scope depth is the shallowest that yields at least 2 G layers.
Ops no rule names (inputs, optimizer bookkeeping, loss) take the label of the neighbour they
exchange the most bytes with: parents first (in topological order), then children.

Grouped problems are labelled through their ops (a group takes its ops' majority label). The
result is repaired for kernels, ties and memory (`common.repair`).
"""

from __future__ import annotations

import re

import numpy as np

from tfplaceto.baselines import common
from tfplaceto.problem import Problem

RNN_LAYER = re.compile(r"(encoder|decoder)[_/]?(?:lstm|gru|rnn)[_/]?(\d+)", re.IGNORECASE)
RNN_HEAD = re.compile(r"attention|softmax", re.IGNORECASE)
IMAGE_LAYER = re.compile(r"conv|mixed|inception|nasnet|cell", re.IGNORECASE)
GRADIENT_PREFIXES = ("gradient_tape/", "gradients/", "training/")
MAX_SCOPE_DEPTH = 6


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del seed, budget_s  # deterministic
    inst = common.prepare(problem)
    common.check_persistent_fits(problem, inst)
    accelerators = common.accelerator_indices(problem)
    op_names = problem.grouping.op_graph.names if problem.grouping is not None else problem.graph.names

    rnn = _rnn_labels(op_names)
    if len(set(rnn[rnn >= 0].tolist()) - {_HEAD}) >= 2:
        labels = _propagate(inst, _node_labels(problem, rnn))
        indices = sorted(set(labels[labels >= 0].tolist()) - {_HEAD})
        device_of = np.full(inst.num_nodes, accelerators[0])
        for i, index in enumerate(indices):
            device_of[labels == index] = accelerators[i % len(accelerators)]
        device_of[labels == _HEAD] = accelerators[-1]
        return common.repair(problem, inst, device_of)

    layers, keys = _layer_labels(op_names, 2 * len(accelerators))
    labels = _propagate(inst, _node_labels(problem, layers))
    work = np.where(np.isfinite(inst.fastest), inst.fastest, 0.0)
    layer_work = np.bincount(labels[labels >= 0], weights=work[labels >= 0], minlength=len(keys))
    image = np.array([bool(IMAGE_LAYER.search(k)) for k in keys], bool)
    if layer_work.sum() > 0 and layer_work[image].sum() >= 0.5 * layer_work.sum():
        placed = common.repair(problem, inst, np.full(inst.num_nodes, accelerators[0]), simulate=False)
        if not problem.simulator().run(placed)[2]:
            return placed

    # Pipeline: layers in order of first appearance, cut at the nearest boundary to k/G of the work.
    first_seen = np.full(len(keys), inst.num_nodes)
    position = np.empty(inst.num_nodes, np.int64)
    position[inst.order] = np.arange(inst.num_nodes)
    np.minimum.at(first_seen, labels[labels >= 0], position[labels >= 0])
    sequence = np.argsort(first_seen, kind="stable")
    cumulative = np.cumsum(layer_work[sequence])
    midpoints = cumulative - layer_work[sequence] / 2
    stage_of = np.minimum((midpoints / max(cumulative[-1] if len(cumulative) else 0.0, 1e-30)
                           * len(accelerators)).astype(np.int64), len(accelerators) - 1)
    layer_stage = np.zeros(len(keys), np.int64)
    layer_stage[sequence] = stage_of
    device_of = np.where(labels >= 0, accelerators[layer_stage[np.maximum(labels, 0)]], accelerators[0])
    return common.repair(problem, inst, device_of)


_HEAD = 1_000_000  # label of attention/softmax ops among RNN layer indices


def _rnn_labels(names) -> np.ndarray:
    """Per op: its encoder/decoder layer index, _HEAD for attention/softmax, or -1."""
    labels = np.full(len(names), -1, np.int64)
    for i, name in enumerate(names):
        match = RNN_LAYER.search(name)
        if match:
            labels[i] = int(match[2])
        elif RNN_HEAD.search(name):
            labels[i] = _HEAD
    return labels


def _strip(name: str) -> tuple[str, bool]:
    """The op name without gradient prefixes, and whether it had one."""
    for prefix in GRADIENT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):], True
    return name, False


def _layer_labels(names, min_layers: int) -> tuple[np.ndarray, list[str]]:
    """Per op: the index of its layer key in the returned key list, or -1 (no layer).

    The key is the op's name scope cut to a depth; the shallowest depth giving min_layers keys
    wins. In a training graph only scopes that have gradient ops are layers: that leaves out the
    optimizer's own scope, whose ops then follow the gradients they consume.
    """
    stripped = [_strip(name) for name in names]
    scopes = [name.split("/")[:-1] or [name] for name, _ in stripped]
    has_gradients = any(grad for _, grad in stripped)
    keys_at: list[str] = []
    for depth in range(1, MAX_SCOPE_DEPTH + 1):
        keys_at = ["/".join(scope[:depth]) for scope in scopes]
        layers = {k for k, (_, grad) in zip(keys_at, stripped) if grad or not has_gradients}
        if len(layers) >= min_layers:
            break
    keys = sorted(layers)
    index = {k: i for i, k in enumerate(keys)}
    return np.array([index.get(k, -1) for k in keys_at], np.int64), keys


def _node_labels(problem: Problem, op_labels: np.ndarray) -> np.ndarray:
    """Op labels as node labels: a group takes the most common label among its labelled ops."""
    if problem.grouping is None:
        return op_labels
    group = np.asarray(problem.grouping.op_to_group)
    known = op_labels >= 0
    if not known.any():
        return np.full(problem.num_nodes, -1, np.int64)
    values, codes = np.unique(op_labels[known], return_inverse=True)
    counts = np.zeros((problem.num_nodes, len(values)))
    np.add.at(counts, (group[known], codes), 1.0)
    return np.where(counts.any(1), values[counts.argmax(1)], -1)


def _propagate(inst: common.Instance, labels: np.ndarray) -> np.ndarray:
    """Unlabelled nodes take the label of their heaviest labelled parent, then child."""
    labels = labels.copy()
    for order, neighbours, other in ((inst.order, inst.parents_of, inst.pair_src),
                                     (inst.order[::-1], inst.children_of, inst.pair_dst)):
        for node in order:
            if labels[node] >= 0:
                continue
            pairs = neighbours(node)
            known = pairs[labels[other[pairs]] >= 0]
            if len(known):
                # Bytes first; the tensor count breaks ties between zero-byte (control) links.
                heaviest = known[np.lexsort((-inst.pair_tensors[known], -inst.pair_bytes[known]))[0]]
                labels[node] = labels[other[heaviest]]
    return labels
