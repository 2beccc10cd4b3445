"""`PlacetoPolicy` and `PlacetoAgent`: REINFORCE over the Sonnet network, in TF-Agents' shapes.

- `PlacetoPolicy(TFPolicy)`: `_distribution` is a Categorical over device slots with the network's
  masked logits; `_action` samples it by Gumbel-max with the policy's own `tf.random.Generator`
  (seeded, checkpointed: a resumed run draws the same actions), inside the compiled step.
  The policy holds the packed statics of the problems it acts on (`observation.pack`):
  observations carry only what changes during an episode.
- `greedy_actions(logits, greedy)`: the deterministic choice of a greedy step (the placer,
  `placeto_policy`, model selection), as the network's `greedy` says: the likeliest device, or
  the likeliest outcome, devices the policy scores alike counted as one.
  `PlacetoGreedyPolicy(PlacetoPolicy)` is TF-Agents' `GreedyPolicy` with that choice: what a
  training run exports as its SavedModel.
- `PlacetoAgent(TFAgent)`: `_loss` is REINFORCE with a per-step-index baseline and an entropy
  bonus (plus, given `imitation` weights per lane, the cloning of replayed lanes); `_train`
  applies Adam on the clipped (global norm) gradient. The train step is a `tf.function`.

Experience is a `Trajectory` of shape [B, T] (B lockstep episodes of one problem, T steps) with
`weights` [B, T]: 1 on the episodes' steps, 0 on boundaries and padding. Returns are discounted
returns-to-go (with `credit="episode"`, every step's return is its whole episode's). Per-step
baseline: b_t = the mean return at step index t of the *other* episodes of the batch
(leave-one-out: unbiased; the lanes share the problem and the start distribution, so they are
each other's reference). Advantages are divided by their standard deviation. To bound the cost
of an update, about `max_train_steps` valid steps (whole groups of steps scored from one
embedding, sampled uniformly, seeded) enter the gradient: an unbiased estimate of the full-batch
mean; a group costs one `embed` and one cheap `score` per step.
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
from tf_agents.trajectories import time_step as ts

from tfplaceto import errors
from tfplaceto.policy.network import MASKED_LOGIT

CREDITS = ("to_go", "episode")  # `PlacetoAgent`'s credit
ALIKE = 1e-5  # logits closer than this (relative) are one score up to float rounding: `greedy_actions`
PlacetoLossInfo = collections.namedtuple(
    "PlacetoLossInfo", ("policy_loss", "entropy", "mean_return", "train_steps"))


def as_tensors(packed: dict) -> dict:
    """Packed numpy statics (`observation.pack`) as constant tensors."""
    return {key: tf.constant(value) for key, value in packed.items()}


def greedy_actions(logits: tf.Tensor, greedy: str, dtype=tf.int32) -> tf.Tensor:
    """The greedy action (B,) of masked logits (B, D). `greedy` (`PlacetoNetwork`'s): "device",
    the likeliest device (the argmax); "outcome", the device of the likeliest outcome, the allowed
    devices the policy scores alike (within `ALIKE`) counted as one outcome. That is the argmax of
    the logits plus the log of how many allowed devices share each one's score: the probability
    of "one of these devices" is the sum of theirs.

    Why "outcome": devices the policy cannot tell apart (idle GPUs with the same links to the
    class's inputs) get the same logit, so what it gives to "a device of that kind" is split among
    them, and the argmax keeps the class on the device already used whenever that device's share
    is above each idle one's, even when most of the probability is on moving. The more devices,
    the more often: on 8 GPUs the shipped ensemble's greedy episodes used fewer devices than each
    of its members' own. With "outcome" the shipped policy alone placed 15 of 54 validation rows
    faster and 3 slower (none on 2 GPUs), and held out no row is more than 20% behind its
    per-graph policy any more (docs/RESULTS.md, session 42). Which of the alike devices is taken
    does not matter to the policy (it scores them alike): the first. Sampling is the same either
    way: it already draws each outcome with its whole probability.

    An ensemble's logits are the mean of its members' log-probabilities; devices alike to every
    member are alike to it, and the members' summed probabilities give the same count."""
    if greedy == "device":
        return tf.argmax(logits, axis=-1, output_type=dtype)
    allowed = logits > MASKED_LOGIT / 2
    alike = tf.abs(logits[:, :, None] - logits[:, None, :]) <= ALIKE * (1.0 + tf.abs(logits[:, :, None]))
    count = tf.reduce_sum(tf.cast(alike & allowed[:, None, :], tf.float32), -1)
    return tf.argmax(logits + tf.math.log(tf.maximum(count, 1.0)), axis=-1, output_type=dtype)


class PlacetoPolicy(tf_policy.TFPolicy):
    """Samples a device for the current class from the network's masked softmax.

    With a network whose `refresh_every` is k > 1 the policy has a state: the node embeddings of
    the latest `embed` and the steps since (`age`); it embeds again at each episode's first step
    and every k steps, and scores every step from its own observation and those embeddings (the
    loss recomputes exactly these, `PlacetoAgent.refresh_ages`).

    Args:
      time_step_spec, action_spec: the environment's specs (TensorSpecs).
      network: a `PlacetoNetwork`.
      statics: the packed statics (tensors) of the problems the observations index.
      seed: seeds the sampling generator.
      jit_score: sampled actions (`action`, what collection calls at every step) score through
        an XLA-compiled `network.score` (the same function up to float rounding: the ~300 small
        ops of the scoring path fused, ~1.3 ms less a step of 16 lanes on cifar10-cells/0). The
        logits and distribution (what `PlacetoGreedyPolicy`, a saved policy and `Actor` use) stay plain:
        XLA compiles once per input shape.
      exploration: the probability that a sampled action (`action`) is instead a uniformly random
        allowed device (0: never; then the generator draws exactly what it drew without it).
        Why: a policy that has put every class on one device samples that device with
        probability ~1 at every step, so no episode tries the single-class moves that make such a
        placement faster; a few uniform deviations per episode do (the loss scores them as
        actions like any other). The distribution, the greedy policy and saved policies are
        unaffected.
    """

    def __init__(self, time_step_spec, action_spec, network: snt.Module, statics: dict, seed: int = 0,
                 name: str | None = None, jit_score: bool = False, exploration: float = 0.0):
        self._exploration = float(exploration)
        self._refresh_every = network.refresh_every
        state_spec = ()
        if self._refresh_every > 1:
            nodes = statics["node_mask"].shape[1]
            state_spec = {"embeddings": tf.TensorSpec((nodes, network.embedding_width), tf.float32, "embeddings"),
                          "age": tf.TensorSpec((), tf.int32, "age")}
        super().__init__(time_step_spec, action_spec, policy_state_spec=state_spec, clip=False,
                         validate_args=False, name=name)
        self._network = network
        self._statics = statics
        self._generator = tf.random.Generator.from_seed(seed)
        self._jit_score = tf.function(network.score, jit_compile=True, autograph=False) if jit_score else None

    @property
    def network(self) -> snt.Module:
        return self._network

    @property
    def generator(self) -> tf.random.Generator:
        return self._generator

    def gumbel_noise(self, shape) -> tf.Tensor:
        """Standard Gumbel noise of `shape` from the policy's own generator: the argmax of logits
        plus it is a sample of their softmax (Gumbel-max)."""
        uniform = self._generator.uniform(shape, minval=1e-12, maxval=1.0)
        return -tf.math.log(-tf.math.log(uniform))

    def _variables(self):
        return self._network.variables

    def greedy_actions(self, logits: tf.Tensor) -> tf.Tensor:
        """The greedy actions of `logits` (of this policy) as its network's `greedy` says."""
        return greedy_actions(logits, self._network.config["greedy"], self.action_spec.dtype)

    def logits(self, time_step, policy_state=(), sampling: bool = False) -> tuple[tf.Tensor, object]:
        """(masked logits (B, D), the next policy state) for a batch of time steps (`sampling`:
        for `action`, scored as `jit_score` says)."""
        observation = time_step.observation
        # The step's features, computed once for the embedding (when refreshed) and the scoring;
        # not with the XLA-compiled scoring, which computes its own inside its cluster (`embed`
        # then computes its own inside the refresh branch, so a step that does not refresh skips them).
        jit = sampling and self._jit_score is not None
        features = None if jit else self._network.features(self._statics, observation)

        def score(embeddings):
            if jit:
                return self._jit_score(self._statics, observation, embeddings)
            return self._network.score(self._statics, observation, embeddings, features)

        def embed():
            return self._network.embed(self._statics, observation, features)

        if self._refresh_every == 1:
            return score(embed()), policy_state
        age, cached = policy_state["age"], policy_state["embeddings"]
        refresh = time_step.is_first() | (age + 1 >= self._refresh_every)
        # The episodes of a batch run in lockstep, so they refresh together: one `embed` call.
        embeddings = tf.cond(tf.reduce_any(refresh), lambda: tf.where(refresh[:, None, None], embed(), cached),
                             lambda: cached)
        state = {"embeddings": embeddings, "age": tf.where(refresh, 0, age + 1)}
        return score(embeddings), state

    def _distribution(self, time_step, policy_state):
        logits, state = self.logits(time_step, policy_state)
        return policy_step.PolicyStep(
            tfp.distributions.Categorical(logits=logits, dtype=self.action_spec.dtype), state)

    def _action(self, time_step, policy_state, seed):
        del seed  # the policy's own generator makes runs reproducible and resumable
        logits, state = self.logits(time_step, policy_state, sampling=True)
        action = tf.argmax(logits + self.gumbel_noise(tf.shape(logits)), axis=-1,
                           output_type=self.action_spec.dtype)
        if self._exploration > 0:
            allowed = logits > MASKED_LOGIT / 2
            anywhere = tf.argmax(tf.where(allowed, self.gumbel_noise(tf.shape(logits)), MASKED_LOGIT), axis=-1,
                                 output_type=self.action_spec.dtype)
            deviate = self._generator.uniform(tf.shape(action)) < self._exploration
            action = tf.where(deviate, anywhere, action)
        return policy_step.PolicyStep(action, state)


class PlacetoGreedyPolicy(greedy_policy.GreedyPolicy):
    """TF-Agents' `GreedyPolicy` of a `PlacetoPolicy`, acting by `greedy_actions` as the network
    says rather than by the distribution's mode (the argmax, whatever the network says): the
    greedy episodes of `rl.acting.Actor`, as a TFPolicy. What `PlacetoAgent.policy` is and a
    training run exports as a SavedModel."""

    def _distribution(self, time_step, policy_state):
        logits, state = self.wrapped_policy.logits(time_step, policy_state)
        action = self.wrapped_policy.greedy_actions(logits)
        return policy_step.PolicyStep(tfp.distributions.Deterministic(loc=action), state, ())


class PlacetoAgent(tf_agent.TFAgent):
    """REINFORCE with a per-step baseline (module docstring).

    Args:
      time_step_spec, action_spec: the environment's specs (TensorSpecs).
      network: a `PlacetoNetwork`.
      statics: the packed statics (tensors) of the training problems.
      learning_rate: Adam's step size.
      entropy_coefficient: initial weight of the entropy bonus (`entropy_coefficient` is a
        variable: the training loop decays it).
      gradient_clipping: global-norm clip of the gradient.
      discount: of the returns-to-go.
      credit: what each step's return is. "to_go" (the paper's): its return-to-go, the sum of
        its own and the later rewards, (C_{t-1} - C_T) / C_0. "episode": the whole episode's
        return, (C_0 - C_T) / C_0, the same for every step of it, so that only the end
        placement's cost rates an action. Why: from a random start the cost before step t,
        C_{t-1}, is that of the visited nodes over the random rest of the start, which the
        episode will place again; the return-to-go carries its noise into every later step's
        advantage, while the whole return drops it (the lanes of a batch share C_0, so the
        advantages compare end costs alone). Both are unbiased: the rewards before a step do not
        depend on its action.
      max_train_steps: about this many steps per update enter the gradient (None: all).
      seed: seeds the step subsampling and the collect policy's sampling.
      exploration: the collect policy's probability of a uniformly random allowed device
        (`PlacetoPolicy`).
      weight_decay: decoupled weight decay (AdamW's: each update also shrinks every weight by
        `learning_rate * weight_decay` of itself; 0: plain Adam).
    """

    def __init__(self, time_step_spec, action_spec, network: snt.Module, statics: dict,
                 learning_rate: float = 1e-3, entropy_coefficient: float = 0.01,
                 gradient_clipping: float = 1.0, discount: float = 1.0,
                 max_train_steps: int | None = 1024, seed: int = 0, exploration: float = 0.0,
                 weight_decay: float = 0.0, credit: str = "to_go",
                 train_step_counter: tf.Variable | None = None, name: str | None = None):
        tf.Module.__init__(self, name=name)
        if credit not in CREDITS:
            raise errors.InvalidArgumentError(f"credit must be one of {CREDITS}, got {credit!r}")
        self._credit = credit
        self._network = network
        self._statics = statics
        self._optimizer = tf.keras.optimizers.Adam(learning_rate, weight_decay=weight_decay or None)
        network.warm_up()
        self._optimizer.build(network.trainable_variables)
        self.entropy_coefficient = tf.Variable(entropy_coefficient, trainable=False, dtype=tf.float32,
                                               name="entropy_coefficient")
        self._gradient_clipping = gradient_clipping
        self._discount = discount
        self._max_train_steps = max_train_steps
        self._seed = seed
        collect_policy = PlacetoPolicy(time_step_spec, action_spec, network, statics, seed=seed,
                                       name="collect_policy", jit_score=True, exploration=exploration)
        policy = PlacetoGreedyPolicy(collect_policy, name="greedy_policy")
        if train_step_counter is None:
            train_step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        super().__init__(time_step_spec, action_spec, policy, collect_policy,
                         train_sequence_length=None, train_step_counter=train_step_counter)
        self._train_fn = tf.function(self._train, reduce_retracing=True, autograph=False)
        self._gradients_fn = tf.function(self._gradients, reduce_retracing=True, autograph=False)
        self._apply_fn = tf.function(self._apply, autograph=False)

    @property
    def network(self) -> snt.Module:
        return self._network

    def variables_to_checkpoint(self) -> dict:
        """Network, optimizer state, entropy coefficient, sampling generator and step counter."""
        return {"network": self._network, "optimizer": self._optimizer,
                "entropy_coefficient": self.entropy_coefficient,
                "generator": self.collect_policy.generator, "train_step": self.train_step_counter}

    def _initialize(self):
        return tf.no_op()

    # -- loss ------------------------------------------------------------------------------------
    def returns_to_go(self, rewards: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        """Discounted returns-to-go [B, T] (0 on invalid steps)."""
        rewards = tf.transpose(rewards * valid)  # [T, B]
        returns = tf.scan(lambda following, r: r + self._discount * following, rewards,
                          initializer=tf.zeros_like(rewards[0]), reverse=True)
        return tf.transpose(returns) * valid

    def step_returns(self, rewards: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        """Each step's return [B, T] as `credit` says (0 on invalid steps)."""
        returns = self.returns_to_go(rewards, valid)
        if self._credit == "episode":  # a row is one episode from its first step: its return
            returns = returns[:, :1] * valid
        return returns

    @staticmethod
    def baseline(returns: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
        """Leave-one-out mean return at each step index over the batch's episodes [B, T]."""
        total = tf.reduce_sum(returns, axis=0, keepdims=True)
        count = tf.reduce_sum(valid, axis=0, keepdims=True)
        others = tf.maximum(count - valid, 1.0)
        return tf.where(count - valid > 0, (total - returns) / others, 0.0)

    def refresh_ages(self, step_type: tf.Tensor) -> tf.Tensor:
        """Steps since the policy's latest `embed` [B, T] (0: it embedded at that step): at every
        FIRST step and every `refresh_every` steps, as `PlacetoPolicy` counts them."""
        k = self._network.refresh_every
        first = tf.transpose(tf.equal(step_type, ts.StepType.FIRST))  # [T, B]
        ages = tf.scan(lambda age, is_first: tf.where(is_first | (age + 1 >= k), 0, age + 1), first,
                       initializer=tf.fill(tf.shape(first[0]), k - 1))
        return tf.transpose(ages)

    def _select(self, valid: tf.Tensor, ages: tf.Tensor, kept: tf.Tensor):
        """Which steps enter the gradient, laid out by the embedding they are scored from: (the
        flat indices of the chosen groups' embedding steps (G,), the flat indices of their
        slots (G * k,), k = `refresh_every`: slot g * k + j is step groups[g] + j, and the mask of
        the slots that are steps of that group (G * k,): 0 past a group's end). A group is the
        steps scored from one `embed`: all groups, or a seeded sample of about `max_train_steps`
        steps' worth of them, in which the groups of `kept` steps (imitation lanes: a
        replayed placement differs from the policy's own in a few steps, which a sample would
        mostly miss) always are."""
        k = self._network.refresh_every
        flat, flat_age = tf.reshape(valid, [-1]), tf.reshape(ages, [-1])
        embedded = flat * tf.cast(tf.equal(flat_age, 0), tf.float32)
        if self._max_train_steps is None:
            groups = tf.where(embedded > 0)[:, 0]
        else:
            seed = tf.stack([tf.constant(self._seed, tf.int64), tf.cast(self.train_step_counter, tf.int64)])
            scores = (tf.random.stateless_uniform(tf.shape(flat), seed=seed)
                      + embedded * (2.0 + 2.0 * tf.reshape(kept, [-1])))
            count = -(-self._max_train_steps // k)
            chosen = tf.minimum(tf.cast(tf.reduce_sum(embedded), tf.int32), count)
            groups = tf.cast(tf.math.top_k(scores, k=chosen, sorted=True).indices, tf.int64)
        size = tf.size(flat, out_type=tf.int64)
        offsets = tf.range(k, dtype=tf.int64)
        slots = groups[:, None] + offsets  # (G, k)
        inside = slots < size
        slots = tf.minimum(slots, size - 1)
        # Step groups[g] + j belongs to group g when its age is j (no `embed` since) and it is valid.
        mask = inside & tf.equal(tf.cast(tf.gather(flat_age, slots), tf.int64), offsets) & (tf.gather(flat, slots) > 0)
        return groups, tf.reshape(slots, [-1]), tf.reshape(tf.cast(mask, tf.float32), [-1])

    def _loss(self, experience, weights=None, training: bool = False, imitation=None):
        rewards = tf.cast(experience.reward, tf.float32)
        valid = tf.ones_like(rewards) if weights is None else tf.cast(weights, tf.float32)
        # Lanes with an imitation weight w are not the policy's episodes but a better one replayed
        # (self-imitation, `train._SelfImitation`): they take no part in the baseline, and every
        # step of theirs has advantage w (cloning: a per-step comparison with the batch would
        # mostly compare the random rest of two different placements).
        imitated = tf.zeros_like(rewards[:, 0]) if imitation is None else tf.cast(imitation, tf.float32)
        own = valid * tf.cast(tf.equal(imitated, 0.0), tf.float32)[:, None]
        returns = self.step_returns(rewards, valid)
        advantages = returns - self.baseline(returns * own, own)
        count = tf.maximum(tf.reduce_sum(own), 1.0)
        std = tf.sqrt(tf.reduce_sum(tf.square(advantages * own)) / count)
        advantages = advantages * own / (std + 1e-8) + imitated[:, None] * (valid - own)
        groups, slots, mask = self._select(valid, self.refresh_ages(experience.step_type), valid - own)

        def flat_gather(x, indices):
            return tf.gather(tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0)), indices)

        # The embeddings the policy scored the chosen steps from, recomputed at their steps; each
        # scores the k slots after it (`PlacetoNetwork.score` with G embeddings for G * k steps).
        embeddings = self._network.embed(
            self._statics, tf.nest.map_structure(lambda x: flat_gather(x, groups), experience.observation))
        observation = tf.nest.map_structure(lambda x: flat_gather(x, slots), experience.observation)
        logits = self._network.score(self._statics, observation, embeddings)
        log_probabilities = tf.nn.log_softmax(logits)
        actions = flat_gather(experience.action, slots)
        log_prob = tf.gather(log_probabilities, actions, batch_dims=1)
        probabilities = tf.exp(log_probabilities)
        entropy = -tf.reduce_sum(probabilities * log_probabilities, axis=-1)
        steps = tf.maximum(tf.reduce_sum(mask), 1.0)
        policy_loss = -tf.reduce_sum(mask * flat_gather(advantages, slots) * log_prob) / steps
        mean_entropy = tf.reduce_sum(mask * entropy) / steps
        total = policy_loss - self.entropy_coefficient * mean_entropy
        return tf_agent.LossInfo(total, PlacetoLossInfo(
            policy_loss=policy_loss, entropy=mean_entropy,
            mean_return=tf.reduce_sum(returns[:, 0] * own[:, 0]) / tf.maximum(tf.reduce_sum(own[:, 0]), 1.0),
            train_steps=tf.cast(tf.reduce_sum(mask), tf.int32)))

    # -- train step ------------------------------------------------------------------------------
    def _gradients(self, experience, weights=None, imitation=None):
        with tf.GradientTape() as tape:
            loss_info = self._loss(experience, weights, training=True, imitation=imitation)
        return tape.gradient(loss_info.loss, self._network.trainable_variables), loss_info

    def _apply(self, gradients):
        gradients, _ = tf.clip_by_global_norm(gradients, self._gradient_clipping)
        self._optimizer.apply_gradients(zip(gradients, self._network.trainable_variables))
        self.train_step_counter.assign_add(1)

    def _train(self, experience, weights=None, imitation=None):
        gradients, loss_info = self._gradients(experience, weights, imitation)
        self._apply(gradients)
        return loss_info

    def train_averaged(self, batches: list[tuple]) -> tf_agent.LossInfo:
        """One update on the mean of the gradients of several batches, each (experience, weights,
        imitation or None): batches of different problems, each with its own baseline and
        advantage scale (`_loss`), whose shapes differ. Their mean loss info is returned."""
        summed, infos = None, []
        for experience, weights, imitation in batches:
            gradients, info = self._gradients_fn(experience, weights, imitation)
            summed = gradients if summed is None else [
                b if a is None else a if b is None else a + b for a, b in zip(summed, gradients)]
            infos.append(info)
        self._apply_fn([None if g is None else g / len(batches) for g in summed])
        return tf.nest.map_structure(lambda *x: tf.reduce_mean(tf.cast(tf.stack(x), tf.float32)), *infos)
