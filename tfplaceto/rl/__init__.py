"""Training the Placeto policy with TF-Agents.

- `environment.py`: `PlacementEnvironment`, the MDP (a `PyEnvironment`) over one or several Problems:
  one episode re-places every colocation class once; rewards are simulated runtime improvements.
- `agent.py`: `PlacetoPolicy` (a `TFPolicy` around the Sonnet network) and `PlacetoAgent` (a
  `TFAgent`: REINFORCE with a per-step baseline, entropy bonus, Adam, global-norm clipping).
- `acting.py`: running a policy: lockstep collection of a batch (`collect`), `Actor` (a network's
  policy on one problem, greedy or sampled) and `greedy_placements` (the policy alone).
- `train.py`: the training loop with TensorBoard summaries, tqdm, model selection and
  checkpoints that resume; `train`, the embedded collector; `problems_for`.
- `logdir.py`: what a training logdir holds, restoring it, its JSON files.
- Reverb actors (`tfplaceto.train(..., actors=N)`, `tfplaceto actor`): `reverb_items.py`, what the
  learner and its actors exchange (tables, one item per lockstep batch, the job); `learner.py`,
  `train_sources` (`tfplaceto.train`: the embedded engine or actors) and the `Launcher` that
  serves Reverb, starts and restarts local actors and hands the loop their batches;
  `actor_process.py`, the actor (`run_actor`: pull the weights, collect, write).
`rl/` meets `sim/` and `policy/` only through specs and plain arrays.
"""

import tfplaceto.policy  # noqa: F401,E402  (first: it silences gym's import notice before tf_agents loads it)
