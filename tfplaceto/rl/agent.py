"""`PlacetoPolicy` and `PlacetoAgent`: REINFORCE over the Sonnet network, in TF-Agents' shapes.

- `PlacetoPolicy(TFPolicy)`: `_distribution` is a Categorical over device slots with the network's
  masked logits; `GreedyPolicy(PlacetoPolicy)` (TF-Agents) is the deterministic policy.
- `PlacetoAgent(TFAgent)`: `_loss` is REINFORCE with a per-step baseline and an entropy bonus;
  `_train` applies Adam on the clipped (global norm) gradient, then records the batch's returns in
  the baseline buffer. The train step is a `tf.function`.

Experience is a `Trajectory` of shape [B, T, ...] (B episodes padded to T steps) with `weights`
[B, T]: 1 on the episodes' steps, 0 on padding. Per-step baseline: b_t = mean return-to-go at step
index t over the last `baseline_window` episodes (this batch's mean when none is recorded yet).
To bound the cost of an update, at most `max_train_steps` valid steps (sampled uniformly, seeded)
enter the gradient: an unbiased estimate of the full-batch mean.
`variables_to_checkpoint()` is what `tf.train.Checkpoint` should track to resume training.
"""

from __future__ import annotations

import collections

import sonnet as snt
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.agents import tf_agent
from tf_agents.policies import greedy_policy, tf_policy
from tf_agents.trajectories import policy_step

from tfplaceto.policy import features as F

PlacetoLossInfo = collections.namedtuple(
    "PlacetoLossInfo", ("policy_loss", "entropy", "mean_return", "train_steps"))


class PlacetoPolicy(tf_policy.TFPolicy):
    """Samples a device for the current node from the network's masked softmax."""

    def __init__(self, time_step_spec, action_spec, network: snt.Module, name: str | None = None):
        super().__init__(time_step_spec, action_spec, clip=False, validate_args=False, name=name)
        self._network = network

    @property
    def network(self) -> snt.Module:
        return self._network

    def _variables(self):
        return self._network.variables

    def _distribution(self, time_step, policy_state):
        logits = self._network(time_step.observation)
        return policy_step.PolicyStep(
            tfp.distributions.Categorical(logits=logits, dtype=self.action_spec.dtype), policy_state)


class PlacetoAgent(tf_agent.TFAgent):
    """REINFORCE with a per-step baseline (module docstring).

    Args:
      time_step_spec, action_spec: the environment's specs (TensorSpecs).
      network: a `PlacetoNetwork` (its variables must exist: call `warm_up` first).
      learning_rate: Adam's step size.
      entropy_coefficient: weight of the entropy bonus.
      gradient_clipping: global-norm clip of the gradient.
      baseline_window: episodes kept for the per-step baseline.
      max_train_steps: at most this many steps per update enter the gradient (None: all).
      normalize_advantages: divide advantages by their standard deviation in the batch.
      seed: seeds the step subsampling.
    """

    def __init__(self, time_step_spec, action_spec, network: snt.Module, learning_rate: float = 3e-3,
                 entropy_coefficient: float = 0.01, gradient_clipping: float = 1.0,
                 baseline_window: int = 16, max_train_steps: int | None = 512,
                 normalize_advantages: bool = True, seed: int = 0,
                 train_step_counter: tf.Variable | None = None, name: str | None = None):
        tf.Module.__init__(self, name=name)
        self._network = network
        # Keras' Adam can build its slots eagerly, so the train step is traced once.
        self._optimizer = tf.keras.optimizers.Adam(learning_rate)
        self._optimizer.build(network.trainable_variables)
        self._entropy_coefficient = entropy_coefficient
        self._gradient_clipping = gradient_clipping
        self._max_train_steps = max_train_steps
        self._normalize = normalize_advantages
        self._seed = seed
        max_steps = time_step_spec.observation[F.NODE_MASK].shape[0]
        self._returns = tf.Variable(tf.zeros([baseline_window, max_steps]), trainable=False,
                                    name="baseline_returns")
        self._recorded = tf.Variable(tf.zeros([baseline_window, max_steps]), trainable=False,
                                     name="baseline_recorded")
        self._next_row = tf.Variable(0, trainable=False, name="baseline_next_row")
        collect_policy = PlacetoPolicy(time_step_spec, action_spec, network, name="collect_policy")
        policy = greedy_policy.GreedyPolicy(collect_policy, name="greedy_policy")
        if train_step_counter is None:
            train_step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        super().__init__(time_step_spec, action_spec, policy, collect_policy,
                         train_sequence_length=None, train_step_counter=train_step_counter)
        self._train_fn = tf.function(self._train, reduce_retracing=True, autograph=False)

    @property
    def network(self) -> snt.Module:
        return self._network

    def variables_to_checkpoint(self) -> dict:
        """Network, optimizer state, baseline buffer and step counter."""
        return {"network": self._network, "optimizer": self._optimizer,
                "baseline_returns": self._returns, "baseline_recorded": self._recorded,
                "baseline_next_row": self._next_row, "train_step": self.train_step_counter}

    def _initialize(self):
        return tf.no_op()

    # -- loss ------------------------------------------------------------------------------------
    def _returns_to_go(self, rewards: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        return tf.cumsum(rewards * valid, axis=1, reverse=True) * valid

    def _baseline(self, returns: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        steps = tf.shape(returns)[1]
        recorded = self._recorded[:, :steps]
        count = tf.reduce_sum(recorded, axis=0)
        history = tf.reduce_sum(self._returns[:, :steps] * recorded, axis=0) / tf.maximum(count, 1.0)
        batch_count = tf.reduce_sum(valid, axis=0)
        batch = tf.reduce_sum(returns, axis=0) / tf.maximum(batch_count, 1.0)
        return tf.where(count > 0, history, batch)[None, :]

    def _select(self, valid: tf.Tensor) -> tf.Tensor:
        """Flat indices of the steps entering the gradient (all valid ones, or a seeded sample)."""
        flat = tf.reshape(valid, [-1])
        if self._max_train_steps is None:
            return tf.where(flat > 0)[:, 0]
        seed = tf.stack([tf.constant(self._seed, tf.int64), tf.cast(self.train_step_counter, tf.int64)])
        scores = tf.random.stateless_uniform(tf.shape(flat), seed=seed) + 2.0 * flat
        k = tf.minimum(tf.cast(tf.reduce_sum(flat), tf.int32), self._max_train_steps)
        return tf.cast(tf.math.top_k(scores, k=k, sorted=True).indices, tf.int64)

    def _loss(self, experience, weights=None, training: bool = False):
        rewards = tf.cast(experience.reward, tf.float32)
        valid = tf.ones_like(rewards) if weights is None else tf.cast(weights, tf.float32)
        returns = self._returns_to_go(rewards, valid)
        advantages = (returns - self._baseline(returns, valid)) * valid
        if self._normalize:
            count = tf.maximum(tf.reduce_sum(valid), 1.0)
            std = tf.sqrt(tf.reduce_sum(tf.square(advantages)) / count)
            advantages = advantages / (std + 1e-8)
        chosen = self._select(valid)

        def flat_gather(x):
            return tf.gather(tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0)), chosen)

        observation = tf.nest.map_structure(flat_gather, experience.observation)
        logits = self._network(observation)
        distribution = tfp.distributions.Categorical(logits=logits)
        actions = flat_gather(experience.action)
        log_prob = distribution.log_prob(actions)
        probabilities = tf.nn.softmax(logits)
        entropy = -tf.reduce_sum(tf.where(probabilities > 0, probabilities * tf.math.log(
            tf.maximum(probabilities, 1e-30)), 0.0), axis=-1)
        policy_loss = -tf.reduce_mean(flat_gather(advantages) * log_prob)
        mean_entropy = tf.reduce_mean(entropy)
        total = policy_loss - self._entropy_coefficient * mean_entropy
        first_returns = returns[:, 0]
        return tf_agent.LossInfo(total, PlacetoLossInfo(
            policy_loss=policy_loss, entropy=mean_entropy, mean_return=tf.reduce_mean(first_returns),
            train_steps=tf.size(chosen)))

    # -- train step ------------------------------------------------------------------------------
    def _train(self, experience, weights=None):
        variables = self._network.trainable_variables
        with tf.GradientTape() as tape:
            loss_info = self._loss(experience, weights, training=True)
        gradients = tape.gradient(loss_info.loss, variables)
        gradients, _ = tf.clip_by_global_norm(gradients, self._gradient_clipping)
        self._optimizer.apply_gradients(zip(gradients, variables))
        self._record_returns(experience, weights)
        self.train_step_counter.assign_add(1)
        return loss_info

    def _record_returns(self, experience, weights):
        rewards = tf.cast(experience.reward, tf.float32)
        valid = tf.ones_like(rewards) if weights is None else tf.cast(weights, tf.float32)
        window, width = self._returns.shape[0], self._returns.shape[1]
        returns = self._returns_to_go(rewards, valid)[-window:]  # a batch wider than the window
        valid = valid[-window:]  # keeps its last episodes (rows must be distinct)
        steps = tf.shape(returns)[1]
        pad = [[0, 0], [0, width - steps]]
        batch = tf.shape(returns)[0]
        rows = tf.math.floormod(self._next_row + tf.range(batch), window)[:, None]
        self._returns.scatter_nd_update(rows, tf.pad(returns, pad))
        self._recorded.scatter_nd_update(rows, tf.pad(valid, pad))
        self._next_row.assign(tf.math.floormod(self._next_row + batch, window))
