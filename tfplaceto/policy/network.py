"""The Placeto policy network: Sonnet modules over graph_nets blocks, device-count agnostic.

  Encoder             node and edge features -> embeddings (snt.nets.MLP each).
  DirectedPropagation k rounds of message passing in one direction of the DAG (an EdgeBlock
                      computing messages from the sending node and the edge, a NodeBlock averaging
                      received messages into the node); shared weights across rounds, residual.
  ContextPooling      for the current node: its own embedding and the sums of its ancestors',
                      descendants' and parallel (neither) nodes' embeddings, each divided by the
                      graph's node count (so the scale does not grow with the graph).
  DeviceScorer        MLP on [node context, device features, pooled embedding of the nodes on the
                      device] -> one logit per device slot, plus a learned multiple of the
                      lookahead feature (a prior towards what the simulator says is faster);
                      masked (not allowed -> -1e9).
  PlacetoNetwork      the whole: observation (padded batch, see features.py) -> logits (B, D).

There is no one-hot of device identity anywhere: a device is described by its per-(node, device)
features and by the nodes already on it, so the same weights score 2, 4 or 8 devices. Weights are
drawn from a numpy Generator seeded at construction (`seed`), so a seed fixes the network
independently of TensorFlow's global random state.
"""

from __future__ import annotations

import numpy as np
import sonnet as snt
import tensorflow as tf
from graph_nets import blocks

from tfplaceto.policy import features as F

MASKED_LOGIT = -1e9


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

    def __call__(self, graph):
        return graph.replace(nodes=self._nodes(graph.nodes), edges=self._edges(graph.edges))


class DirectedPropagation(snt.Module):
    """`rounds` rounds of message passing along the graph's edges (sender -> receiver).

    Run it on the reversed graph for messages against the DAG edges (children -> parents).
    """

    def __init__(self, hidden: int, rounds: int, rng: np.random.Generator, name: str = "propagation"):
        super().__init__(name=name)
        self._rounds = rounds
        self._messages = blocks.EdgeBlock(
            lambda: _mlp([hidden], rng, "message", activate_final=True),
            use_edges=True, use_receiver_nodes=False, use_sender_nodes=True, use_globals=False)
        self._update = blocks.NodeBlock(
            lambda: _mlp([hidden, hidden], rng, "update"),
            use_received_edges=True, use_sent_edges=False, use_nodes=True, use_globals=False,
            received_edges_reducer=tf.math.unsorted_segment_mean)

    def __call__(self, graph) -> tf.Tensor:
        nodes = graph.nodes
        for _ in range(self._rounds):
            messages = self._messages(graph.replace(nodes=nodes))
            nodes = nodes + self._update(messages.replace(nodes=nodes)).nodes
        return nodes


class ContextPooling(snt.Module):
    """[own, sum ancestors, sum descendants, sum parallel] / node count, for the current node."""

    def __call__(self, embeddings: tf.Tensor, obs: dict) -> tf.Tensor:
        # embeddings: (B, N, H)
        mask = obs[F.NODE_MASK]
        count = tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1.0)  # (B, 1)
        current = tf.one_hot(obs[F.CURRENT], tf.shape(mask)[1], dtype=embeddings.dtype)
        ancestors, descendants = obs[F.ANCESTORS], obs[F.DESCENDANTS]
        parallel = mask * (1.0 - ancestors) * (1.0 - descendants) * (1.0 - current)

        def pooled(weights, scale):
            return tf.einsum("bn,bnh->bh", weights, embeddings) / scale

        return tf.concat([pooled(current, 1.0), pooled(ancestors, count), pooled(descendants, count),
                          pooled(parallel, count)], axis=-1)


class DeviceScorer(snt.Module):
    """One logit per device slot from [context, device features, nodes-on-device embedding].

    Plus a learned multiple of the lookahead feature (the relative step-time change if the node
    moved to the device), initialized to `-lookahead_prior`: an untrained scorer already prefers
    the devices the simulator says are faster, and training learns when to deviate.
    """

    def __init__(self, hidden: int, rng: np.random.Generator, lookahead_prior: float = 0.0,
                 name: str = "device_scorer"):
        super().__init__(name=name)
        self._mlp = _mlp([hidden, hidden, 1], rng, "mlp")
        self._lookahead_weight = tf.Variable(-float(lookahead_prior), dtype=tf.float32,
                                             name="lookahead_weight")

    def __call__(self, context: tf.Tensor, embeddings: tf.Tensor, obs: dict) -> tf.Tensor:
        devices = obs[F.DEVICES]  # (B, D, F)
        num_devices = tf.shape(devices)[1]
        mask = obs[F.NODE_MASK]
        count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)[:, None, None]
        on_device = tf.one_hot(obs[F.PLACEMENT], num_devices, dtype=embeddings.dtype) * mask[..., None]
        device_nodes = tf.einsum("bnd,bnh->bdh", on_device, embeddings) / count  # (B, D, H)
        tiled = tf.tile(context[:, None, :], tf.stack([1, num_devices, 1]))
        logits = tf.squeeze(self._mlp(tf.concat([tiled, devices, device_nodes], axis=-1)), -1)
        logits += self._lookahead_weight * devices[..., F.LOOKAHEAD_COLUMN]
        return tf.where(obs[F.ACTION_MASK], logits, MASKED_LOGIT)


class PlacetoNetwork(snt.Module):
    """Observation (a padded batch, features.py) -> masked logits over device slots (B, D).

    Args:
      hidden: embedding width.
      rounds: message-passing rounds in each direction.
      lookahead_prior: initial weight of the lookahead feature in the logits (DeviceScorer).
      seed: fixes the initial weights.
    """

    def __init__(self, hidden: int = 32, rounds: int = 2, lookahead_prior: float = 50.0, seed: int = 0,
                 name: str = "placeto_network"):
        super().__init__(name=name)
        self.config = {"hidden": hidden, "rounds": rounds, "lookahead_prior": lookahead_prior,
                       "seed": seed}
        rng = np.random.default_rng(seed)
        self._encoder = Encoder(hidden, rng)
        self._down = DirectedPropagation(hidden, rounds, rng, name="top_down")
        self._up = DirectedPropagation(hidden, rounds, rng, name="bottom_up")
        self._combine = _mlp([hidden], rng, "combine", activate_final=True)
        self._pooling = ContextPooling()
        self._scorer = DeviceScorer(hidden, rng, lookahead_prior)

    def __call__(self, obs: dict) -> tf.Tensor:
        graph = self._encoder(F.batched_graphs_tuple(obs))
        reversed_graph = graph.replace(senders=graph.receivers, receivers=graph.senders)
        nodes = self._combine(tf.concat([self._down(graph), self._up(reversed_graph)], axis=-1))
        shape = tf.shape(obs[F.NODE_MASK])
        embeddings = tf.reshape(nodes, [shape[0], shape[1], nodes.shape[-1]])
        context = self._pooling(embeddings, obs)
        return self._scorer(context, embeddings, obs)

    def warm_up(self, spec: dict) -> None:
        """Creates the variables by calling the network on a zero observation of `spec`."""
        zeros = {k: tf.zeros((1,) + tuple(s.shape), s.dtype) for k, s in spec.items()}
        zeros[F.ACTION_MASK] = tf.ones_like(zeros[F.ACTION_MASK])
        self(zeros)
