"""Training the Placeto policy with TF-Agents.

- `environment.py`: `PlacementEnvironment`, the MDP (a `PyEnvironment`) over one or several Problems:
  one episode re-places every colocation class once; rewards are simulated runtime improvements.
- `agent.py`: `PlacetoPolicy` (a `TFPolicy` around the Sonnet network) and `PlacetoAgent` (a
  `TFAgent`: REINFORCE with a per-step baseline, entropy bonus, Adam, global-norm clipping).
- `train.py`: collection, the training loop with TensorBoard summaries, tqdm and checkpoints that
  resume; `train`, the embedded collector.
- `distributed.py`: collection in actor processes through a Reverb server (a queue of whole
  lockstep batches, weights through TF-Agents' `ReverbVariableContainer`), the launcher that
  starts and restarts local actors, the actor (`tfplaceto actor`), and `train_sources`
  (`tfplaceto.train`: the embedded engine or actors).
`rl/` meets `sim/` and `policy/` only through specs and plain arrays.
"""

import tfplaceto.policy  # noqa: F401,E402  (first: it silences gym's import notice before tf_agents loads it)
