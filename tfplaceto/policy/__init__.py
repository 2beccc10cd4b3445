"""The Placeto policy: what it sees, how it scores devices, and the shipped weights.

- `observation.py`: what the policy sees, in numpy: per-graph static arrays (`GraphStatics`), their
  padded stack (`pack`), the per-step observation, its fields and its spec. Pure functions over arrays.
- `features.py`: the TensorFlow side: node / edge / (class, device) features of a batch of
  observations, computed from the packed statics.
- `network.py`: the Sonnet/graph_nets network: encoders, message passing along and against the DAG,
  ancestor / descendant / parallel pooling, a per-device scorer; one set of weights for any device
  count.
- `checkpoint.py`: saving and loading a policy directory (config, Sonnet weights and a TF-Agents
  `PolicySaver` SavedModel), and what `policy=` names: the shipped policy (`pretrained/`),
  untrained weights, a directory.
The placer that uses the policy (`method="placeto"` and `"placeto_policy"`) is
`tfplaceto/placeto.py`; training (environment, agent, loop, Reverb actors) lives in
`tfplaceto.rl`.
"""

import contextlib as _contextlib
import io as _io

# tf-agents pins gym 0.23, which prints a deprecation notice on stderr when imported; tfplaceto
# uses none of gym, and its users should not see the notice on every command.
with _contextlib.redirect_stderr(_io.StringIO()):
    import gym  # noqa: F401
