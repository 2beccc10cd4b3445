"""The Placeto policy network: Sonnet modules over graph_nets GraphsTuples, device-count agnostic.

  Encoder             node and edge features -> embeddings (snt.nets.MLP each).
  DirectedPropagation `rounds` rounds of message passing in one direction of the DAG (an EdgeBlock
                      computing messages from the sending node and the edge, a NodeBlock averaging
                      the received messages into the node); shared weights across rounds, residual.
                      Run top-down (parents to children) and bottom-up (on the reversed edges).
  ContextPooling      for the class being placed: the mean embedding of its nodes, and of its
                      ancestors, descendants and parallel (neither) nodes, each set through its own
                      learned aggregator (an MLP after the mean), as in the paper.
  DeviceScorer        MLP on [context, (class, device) features, mean embedding of the nodes on the
                      device (zero with the "placed" view)], plus a linear term of the device
                      features -> one logit per device slot; not allowed -> MASKED_LOGIT.
  PlacetoNetwork      the whole: (packed statics, observation batch) -> logits (B, D).

Inputs are computed by `features.compute_features` from the packed per-graph statics and the
per-step observation, so the network itself holds weights only: the same weights score any graph
on 2, 4 or 8 devices (a device is described by its features and the nodes on it; there is no
one-hot of device identity). Weights are drawn from a numpy Generator seeded at construction, so a
seed fixes the network independently of TensorFlow's global random state.
"""

from __future__ import annotations

import inspect

import numpy as np
import sonnet as snt
import tensorflow as tf
from graph_nets import graphs

from tfplaceto import errors
from tfplaceto.policy import features as F
from tfplaceto.policy.observation import ACTION_MASK, Dims, empty_observations, pack

MASKED_LOGIT = -1e9
GREEDY = ("device", "outcome")  # what a greedy step takes: `PlacetoNetwork`'s `greedy`


class _SeededInit(snt.initializers.Initializer):
    """Glorot-uniform (weights) drawn from a numpy Generator: deterministic per construction."""

    def __init__(self, rng: np.random.Generator):
        self._rng = rng

    def __call__(self, shape, dtype):
        fan_in, fan_out = (shape[0], shape[-1]) if len(shape) > 1 else (shape[0], shape[0])
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return tf.constant(self._rng.uniform(-limit, limit, size=shape), dtype=dtype)


def _mlp(sizes, rng, name, activate_final=False) -> snt.nets.MLP:
    return snt.nets.MLP(list(sizes), w_init=_SeededInit(rng), activate_final=activate_final, name=name)


class Encoder(snt.Module):
    """Embeds node and edge features (one MLP each)."""

    def __init__(self, hidden: int, rng: np.random.Generator, name: str = "encoder"):
        super().__init__(name=name)
        self._nodes = _mlp([hidden, hidden], rng, "nodes", activate_final=True)
        self._edges = _mlp([hidden], rng, "edges", activate_final=True)

    def __call__(self, graph: graphs.GraphsTuple) -> graphs.GraphsTuple:
        return graph.replace(nodes=self._nodes(graph.nodes), edges=self._edges(graph.edges))


class DirectedPropagation(snt.Module):
    """`rounds` rounds of message passing along the graph's edges (sender -> receiver).

    A round: each node takes the mean of relu(embedding) over the nodes that send to it, and adds
    relu(linear([itself, that mean]) + linear(the mean embedding of its received edges))
    (residual, weights shared across rounds). Both means are sparse-dense products with the batch's block-diagonal
    mean-aggregation matrices (the edges' once, the nodes' once a round). Why not an EdgeBlock
    per round, or graph_nets' segment-mean aggregators: the
    network runs at every step of every episode, and gathering and segment-averaging per-edge
    messages cost ~6 ms a round on 2 CPU cores for 64 graphs of 600 edges, 20x the sparse product.
    Run it on the reversed graph for messages against the DAG edges (children -> parents).
    """

    def __init__(self, hidden: int, rounds: int, rng: np.random.Generator, name: str = "propagation"):
        super().__init__(name=name)
        self._rounds = rounds
        self._update = snt.Linear(hidden, w_init=_SeededInit(rng), name="update")
        self._edge_term = snt.Linear(hidden, with_bias=False, w_init=_SeededInit(rng), name="edge_term")

    def __call__(self, graph: graphs.GraphsTuple) -> tf.Tensor:
        nodes = graph.nodes
        num_nodes = tf.shape(nodes, out_type=tf.int64)[0]
        num_edges = tf.shape(graph.edges, out_type=tf.int64)[0]
        receivers = tf.cast(graph.receivers, tf.int64)
        degree = tf.math.unsorted_segment_sum(tf.ones_like(receivers, tf.float32), receivers, num_nodes)
        weights = 1.0 / tf.gather(degree, receivers)

        def mean_over(columns, width):  # (nodes x width) mean-aggregation matrix, row = receiver
            return tf.sparse.SparseTensor(tf.stack([receivers, columns], axis=1), weights,
                                          tf.stack([num_nodes, width]))

        by_sender = mean_over(tf.cast(graph.senders, tf.int64), num_nodes)
        # The received edges' term (and the update's bias) is the same every round: added once.
        edge_term = self._edge_term(tf.sparse.sparse_dense_matmul(
            mean_over(tf.range(num_edges), num_edges), graph.edges))
        w_node, w_received, bias = self._update_weights(nodes.shape[-1])  # after: seeded in this order
        constant = edge_term + bias
        for _ in range(self._rounds):
            received = tf.sparse.sparse_dense_matmul(by_sender, tf.nn.relu(nodes))
            nodes = nodes + tf.nn.relu(tf.matmul(nodes, w_node) + tf.matmul(received, w_received) + constant)
        return nodes

    def _update_weights(self, width: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The update layer's matrix as (its node half, its received half) and its bias: the
        layer applied to [node, received] is the sum of the halves' products, without copying
        both into one array every round (a memory pass that costs as much as the product)."""
        if not hasattr(self._update, "w"):  # Sonnet creates them on the layer's first call
            self._update(tf.zeros([1, 2 * width]))
        return self._update.w[:width], self._update.w[width:], self._update.b


def pooled_means(weights: tf.Tensor, embeddings: tf.Tensor) -> tf.Tensor:
    """Weighted means of node embeddings (B, M, H): sum_n weights[b, m, n] * embeddings[g, n] /
    max(sum_n weights[b, m, n], 1), where embeddings (G, N, H) serve consecutive observations:
    row g those of observations g*k .. g*k + k - 1 (k = B / G; 1 when acting, the steps of one
    `embed` in the loss). One batched matmul per embedding row: gathering the embeddings per
    observation instead costs a (B, N, H) copy and its gradient, the largest part of an update."""
    groups = tf.shape(embeddings)[0]
    shape = tf.shape(weights)  # (B, M, N)
    grouped = tf.reshape(weights, [groups, -1, shape[2]])  # (G, k * M, N)
    sums = tf.reshape(tf.matmul(grouped, embeddings), [shape[0], shape[1], embeddings.shape[-1]])
    return sums / tf.maximum(tf.reduce_sum(weights, -1, keepdims=True), 1.0)


class ContextPooling(snt.Module):
    """[own, ancestors, descendants, parallel] embeddings of the class being placed (B, 4H)."""

    def __init__(self, hidden: int, rng: np.random.Generator, name: str = "context_pooling"):
        super().__init__(name=name)
        self._aggregators = [_mlp([hidden], rng, f"aggregate_{kind}", activate_final=True)
                             for kind in ("ancestors", "descendants", "parallel")]

    def __call__(self, embeddings: tf.Tensor, features: F.Features) -> tf.Tensor:
        """`embeddings` (G, N, H) as `pooled_means` reads them."""
        mask, current = features.node_mask, features.current
        ancestors, descendants = features.ancestors, features.descendants
        parallel = mask * (1.0 - ancestors) * (1.0 - descendants) * (1.0 - current)
        means = tf.unstack(pooled_means(tf.stack([current, ancestors, descendants, parallel], 1), embeddings),
                           axis=1)
        pooled = [aggregate(mean) for aggregate, mean in zip(self._aggregators, means[1:])]
        return tf.concat([means[0]] + pooled, axis=-1)


class DeviceScorer(snt.Module):
    """One logit per device slot: an MLP of [context, device features, nodes-on-device embedding]
    plus a linear function of the device features alone (wide and deep: simple rules over the
    device features, such as "where its inputs are", are learned in few updates).

    The nodes-on-device embedding is the mean embedding of the nodes the view shows on each device
    (every node with the "full" view, the visited ones with "placed"). `nodes_on_device=False`
    (the "placed" view's default) zeroes it: it tells the policy where most of the visited nodes
    are, a cue to pile everything on one device that overrides where the class's own inputs are.
    Without it, though, the placed view's scorer does not single out the classes a split moves:
    cloning m-SCT's placement of cifar10-cells/0 on its own replay path (supervised only, 400
    updates) left 13-18 of its 177 steps wrong, the ones that leave their inputs' device; with the
    embedding over the visited nodes, 9 after 250 updates and falling (issue 18).

    `device_context=True`: the devices are scored together rather than each alone (Deep Sets):
    the MLP's first layer is computed per device as before, and its second sees that layer's
    output beside its difference from the mean and from the maximum over the allowed devices.
    Why: scored alone, a device's logit depends on its own features only, so "this device is the
    least loaded" or "every other device is idle" (whether a split pays) can enter only as the
    softmax's comparison of independent utilities."""

    def __init__(self, hidden: int, rng: np.random.Generator, nodes_on_device: bool = True,
                 device_context: bool = False, name: str = "device_scorer"):
        super().__init__(name=name)
        self._nodes_on_device = nodes_on_device
        self._device_context = device_context
        if device_context:
            self._first = _mlp([hidden], rng, "first", activate_final=True)
            self._mlp = _mlp([hidden, 1], rng, "mlp")
        else:
            self._mlp = _mlp([hidden, hidden, 1], rng, "mlp")
        self._linear = snt.Linear(1, w_init=snt.initializers.Zeros(), name="linear")

    def __call__(self, context: tf.Tensor, embeddings: tf.Tensor, features: F.Features) -> tf.Tensor:
        """`embeddings` (G, N, H) as `pooled_means` reads them."""
        devices = features.devices  # (B, D, F)
        num_devices = tf.shape(devices)[1]
        if self._nodes_on_device:
            on_device = (tf.cast(tf.equal(features.placement[:, None, :], tf.range(num_devices)[None, :, None]),
                                 tf.float32) * features.seen[:, None, :])  # (B, D, N) one-hot
            device_nodes = pooled_means(on_device, embeddings)  # (B, D, H)
        else:  # zeros of that shape, without computing what they replace
            device_nodes = tf.zeros([tf.shape(devices)[0], num_devices, embeddings.shape[-1]])
        tiled = tf.tile(context[:, None, :], tf.stack([1, num_devices, 1]))
        inputs = tf.concat([tiled, devices, device_nodes], axis=-1)
        if self._device_context:
            hidden = self._first(inputs)  # (B, D, H), >= 0
            allowed = tf.cast(features.action_mask, tf.float32)[..., None]  # (B, D, 1)
            mean = tf.reduce_sum(hidden * allowed, 1, keepdims=True) / tf.maximum(
                tf.reduce_sum(allowed, 1, keepdims=True), 1.0)
            maximum = tf.reduce_max(hidden * allowed, 1, keepdims=True)
            inputs = tf.concat([hidden, hidden - mean, hidden - maximum], axis=-1)
        logits = tf.squeeze(self._mlp(inputs) + self._linear(devices), -1)
        return tf.where(features.action_mask, logits, MASKED_LOGIT)


def _batched_graph(features: F.Features) -> graphs.GraphsTuple:
    """The batch as one GraphsTuple of B graphs (node slot b*N + i is node i of observation b)."""
    nodes = features.nodes
    batch, n = tf.shape(nodes)[0], tf.shape(nodes)[1]
    e = tf.shape(features.senders)[1]
    offsets = (tf.range(batch, dtype=tf.int32) * n)[:, None]
    return graphs.GraphsTuple(
        nodes=tf.reshape(nodes, [-1, nodes.shape[-1]]),
        edges=tf.reshape(features.edges, [-1, features.edges.shape[-1]]),
        senders=tf.reshape(features.senders + offsets, [-1]),
        receivers=tf.reshape(features.receivers + offsets, [-1]),
        globals=None, n_node=tf.fill([batch], n), n_edge=tf.fill([batch], e))


class PlacetoNetwork(snt.Module):
    """(packed statics, observation batch) -> masked logits over device slots (B, D).

    `embed` (the message passing: what costs) and `score` (the current class's context and
    device features: ~10x cheaper) are separate, so a policy may reuse one `embed` for the next
    `refresh_every` steps of an episode (`rl.agent.PlacetoPolicy`); calling the network is both.

    Args:
      hidden: embedding width.
      rounds: message-passing rounds in each direction of the DAG.
      seed: fixes the initial weights.
      refresh_every: how many consecutive steps of an episode the policy scores from one
        `embed` (1: a fresh embedding every step, the paper's). Part of the config because a
        policy acts as it was trained: it is saved with the weights.
      view: what of the current placement the policy sees (`features.VIEWS`): "full", every
        node's device and the simulated schedule (the paper's), "placed", only the devices
        the episode has chosen, or "scheduled", those and the schedule of the nodes placed so
        far by themselves. Part of the config for the same reason (a policy saved without
        it was trained on "full").
      nodes_on_device: the scorer sees the mean embedding of the nodes the view shows on each
        device (`DeviceScorer`); None: as the view says (with "full" only).
      passes: how many times an episode of this policy places each class
        (`PlacementEnvironment(passes=...)`): not a part of the network, but of how it acts, so
        saved with it like `view` (a policy saved without it made one pass).
      transfer_costs: the network also sees what moving a tensor off a device costs whatever
        the placement (`features.compute_features`): one edge and one device feature more.
      device_context: the scorer scores the devices together (`DeviceScorer`).
      unvisited_work: the network also sees the work not yet visited that may run beside the class
        and below it (`features.compute_features`): two device features more.
      ensemble: an ensemble of that many networks of this config (`members`), member k seeded
        `seed + k`; its logits are the mean of the members' log-probabilities, so its greedy
        choice is the device the members agree on most. Each member is cloned on its own
        (`rl.cloning.clone`): networks fitted to the same teachers from different seeds err on
        different rows, and the mean cancels part of it (docs/RESULTS.md, session 37).
      greedy: what a greedy step of this policy takes (`GREEDY`; `rl.agent.greedy_actions`):
        "device", the likeliest device (the argmax of the logits), or "outcome", the likeliest
        outcome, the devices it scores alike counted as one. Not a part of the network either,
        but of how it acts, so saved with it (a policy saved without it takes the likeliest
        device). "outcome" is the shipped ensemble's: its clones give a teacher's move to "some
        idle device" and split it among the idle devices alike (on validation members 1.015x
        the best fast baseline by device, 1.003x by outcome; session 37's three clones 1.020x
        and 1.004x). A policy trained by reinforcement learning alone and selected by its
        "device" episodes may do worse with "outcome" (session 19's shipped policy: 1.019x and
        1.033x; one of four per-graph policies; docs/RESULTS.md, session 42).
    """

    def __init__(self, hidden: int = 32, rounds: int = 8, seed: int = 0, refresh_every: int = 1,
                 view: str = "full", nodes_on_device: bool | None = None, passes: int = 1,
                 transfer_costs: bool = False, device_context: bool = False, unvisited_work: bool = False,
                 ensemble: int = 1, greedy: str = "device", name: str = "placeto_network"):
        super().__init__(name=name)
        for arg, value in (("refresh_every", refresh_every), ("passes", passes), ("ensemble", ensemble)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.InvalidArgumentError(f"{arg} must be an integer >= 1, got {value!r}")
        if greedy not in GREEDY:
            raise errors.InvalidArgumentError(f"greedy must be one of {GREEDY}, got {greedy!r}")
        if view not in F.VIEWS:
            raise errors.InvalidArgumentError(f"view must be one of {F.VIEWS}, got {view!r}")
        self._config = {"hidden": hidden, "rounds": rounds, "seed": seed, "refresh_every": refresh_every,
                        "view": view, "nodes_on_device": nodes_on_device, "passes": passes,
                        "transfer_costs": bool(transfer_costs), "device_context": bool(device_context),
                        "unvisited_work": bool(unvisited_work), "ensemble": ensemble, "greedy": greedy}
        self._built = False
        self._members = [PlacetoNetwork(**{**self._config, "seed": seed + k, "ensemble": 1}, name=f"member_{k}")
                         for k in range(ensemble)] if ensemble > 1 else []
        if self._members:
            return  # the members hold the weights
        rng = np.random.default_rng(seed)
        self._encoder = Encoder(hidden, rng)
        self._down = DirectedPropagation(hidden, rounds, rng, name="top_down")
        self._up = DirectedPropagation(hidden, rounds, rng, name="bottom_up")
        self._combine = _mlp([hidden], rng, "combine", activate_final=True)
        self._normalize = snt.LayerNorm(-1, create_scale=True, create_offset=True, name="normalize")
        self._pooling = ContextPooling(hidden, rng)
        self._scorer = DeviceScorer(hidden, rng, nodes_on_device=view == "full" if nodes_on_device is None
                                    else nodes_on_device, device_context=device_context)

    @property
    def config(self) -> dict:
        """The constructor's arguments (a plain dict: what a saved policy records)."""
        return dict(self._config)

    @classmethod
    def completed_config(cls, config: dict) -> dict:
        """A recorded config with the constructor's defaults for the arguments it lacks: a network
        recorded before an argument existed was built as its default says (before `view`,
        "full"; before `passes`, one pass; ...), so this is its `config` today. Hence a new
        argument's default must be what networks did before it existed."""
        defaults = {name: parameter.default for name, parameter in inspect.signature(cls.__init__).parameters.items()
                    if name not in ("self", "name")}
        return {**defaults, **config}

    @property
    def hidden(self) -> int:
        return self._config["hidden"]

    @property
    def members(self) -> list[PlacetoNetwork]:
        """The ensemble's member networks ([] for one network)."""
        return list(self._members)

    @property
    def embedding_width(self) -> int:
        """The width of `embed`'s embeddings: `hidden`, times the members of an ensemble."""
        return self.hidden * max(1, len(self._members))

    @property
    def refresh_every(self) -> int:
        return self._config["refresh_every"]

    @property
    def passes(self) -> int:
        return self._config["passes"]

    @property
    def acting(self) -> dict:
        """The `PlacementEnvironment` arguments this policy acts under: its passes, and the
        schedule its view reads (`features.SCHEDULE_OF`)."""
        return {"passes": self.passes, "schedule": F.SCHEDULE_OF[self._config["view"]]}

    @property
    def feature_widths(self) -> dict[str, int]:
        """The widths of the features this network reads (`features.widths`)."""
        return F.widths(self._config["transfer_costs"], self._config["unvisited_work"])

    def features(self, statics: dict, observation: dict) -> F.Features:
        """The features this network reads of a batch of observations (its view, its columns)."""
        return F.compute_features(statics, observation, self._config["view"], self._config["transfer_costs"],
                                  self._config["unvisited_work"])

    def __call__(self, statics: dict, observation: dict) -> tf.Tensor:
        features = self.features(statics, observation)
        return self.score(statics, observation, self.embed(statics, observation, features), features)

    def embed(self, statics: dict, observation: dict, features: F.Features | None = None) -> tf.Tensor:
        """Node embeddings (B, N, H) of a batch of observations: the message passing (the
        expensive part, which `score` can reuse for the next few steps of an episode); an
        ensemble's are its members' side by side (B, N, members * H).

        `features`: `self.features(statics, observation)` when the caller has them already. An
        ensemble computes them once for all its members (their configs differ only in the seed,
        so they read the same features): computed per member, they were half the ops of an
        ensemble's traced function, so half of building an `rl.acting.Actor`."""
        if features is None:
            features = self.features(statics, observation)
        if self._members:
            return tf.concat([m.embed(statics, observation, features) for m in self._members], axis=-1)
        graph = self._encoder(_batched_graph(features))
        reversed_graph = graph.replace(senders=graph.receivers, receivers=graph.senders)
        # Residual rounds grow the embeddings' scale with depth: normalized before pooling.
        nodes = self._normalize(self._combine(tf.concat([self._down(graph), self._up(reversed_graph)], axis=-1)))
        shape = tf.shape(features.node_mask)
        embeddings = tf.reshape(nodes, [shape[0], shape[1], nodes.shape[-1]])
        return embeddings * features.node_mask[..., None]

    def score(self, statics: dict, observation: dict, embeddings: tf.Tensor,
              features: F.Features | None = None) -> tf.Tensor:
        """Masked logits (B, D) of the current class of each observation, from node embeddings
        (`embed` of this observation, or of one a few steps earlier in the same episode) and the
        observation's own (class, device) features. `embeddings` is (B, N, H), one row per
        observation, or (G, N, H) with B = G * k: row g for observations g*k .. g*k + k - 1
        (the loss scores the steps of one `embed` together without copying it per step). An
        ensemble's are the mean of its members' log-probabilities. `features`: as in `embed`,
        of `observation` (not of the observation the embeddings were made from)."""
        self._built = True
        if features is None:
            features = self.features(statics, observation)
        if self._members:
            parts = tf.split(embeddings, len(self._members), axis=-1)
            return tf.add_n([tf.nn.log_softmax(m.score(statics, observation, e, features))
                             for m, e in zip(self._members, parts)]) / len(self._members)
        context = self._pooling(embeddings, features)
        return self._scorer(context, embeddings, features)

    def warm_up(self) -> None:
        """Creates the variables (Sonnet creates them on the first call) with a dummy input;
        nothing when they exist."""
        if self._built:
            return
        dims = Dims(nodes=2, edges=1, devices=2, steps=1)
        statics = {k: tf.zeros((1,) + v.shape[1:], v.dtype) for k, v in pack([], dims).items()}
        observation = {k: tf.constant(v) for k, v in empty_observations(dims, 1).items()}
        observation[ACTION_MASK] = tf.ones_like(observation[ACTION_MASK])
        self(statics, observation)

