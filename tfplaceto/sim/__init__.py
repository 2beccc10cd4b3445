"""The event simulator: one training/inference step of a placed graph, fast enough for RL.

- `simulator.py`: `simulate`, `Simulator` (compiled plan, `run`/`run_batch`/`result`), inputs.
- `plan.py`: `SimGraph`, the placement-independent CSR arrays built once per graph and cluster.
- `kernel.py`: the numba list-scheduling kernel and its semantics.
- `result.py`: `SimResult`; `trace.py` (Chrome trace JSON) and `gantt.py` (PNG) render it.
- `bounds.py`: `lower_bound`, the step time no placement can beat.
"""

from tfplaceto.sim.bounds import lower_bound
from tfplaceto.sim.result import SimResult
from tfplaceto.sim.simulator import Simulator, simulate

__all__ = ["SimResult", "Simulator", "lower_bound", "simulate"]
