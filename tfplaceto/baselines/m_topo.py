"""m-TOPO: fill devices in topological order (Baechi: Jeon et al., SoCC 2020, section 4.1).

Nodes are taken in the graph's topological order and given to the current device until it holds
its share; then the next device takes over. The result is a pipeline of contiguous stages with no
regard for parallelism: the reference "no scheduling" placer. Two rules for the share (`RULES`):
- "share", tfplaceto's: the equal share of the total compute (on the fastest candidate device) or
  of the total memory (Baechi's persistent + output estimate, see `common`), whichever comes
  first. The shares are cumulative targets, (k + 1) / G of the totals for the k-th of G devices, so
  a stage cut short by one resource is made up by the next; a node goes to the current device
  when its midpoint falls within the target (cuts land at the nearest node boundary).
- "fill", Baechi's (`placer/m_topo.py`, `TopoUniform`): memory only; each device takes nodes until
  the next would take it past total memory / G + the largest node's memory.
`place` runs both and keeps the placement the simulator scores best; `rule=` forces one.

Ties (colocation classes) are placed whole when their first member comes up, with their total
compute and memory. A class the current device cannot run, or has no room for, goes to the
candidate device with the most memory left that has room, or failing that to another allowed
device (the host); UnplaceableError when none has room.
"""

from __future__ import annotations

import numpy as np

from tfplaceto.baselines import common
from tfplaceto.problem import Problem

RULES = ("share", "fill")


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          rule: str | None = None) -> np.ndarray:
    """m-TOPO under `rule`, or under each of `RULES` keeping the best."""
    del seed, budget_s  # deterministic, one pass per rule
    if rule is not None:
        common.choice("m_topo rule", rule, RULES)
    return common.best_variant(problem, stages, {"rule": RULES}, {"rule": rule})


def stages(problem: Problem, inst: common.Instance, rule: str = "share") -> np.ndarray:
    """The pipeline placement under one rule (module docstring)."""
    order = common.accelerator_indices(problem)  # the stages' devices
    compute = np.where(np.isfinite(inst.class_compute), inst.class_compute, 0.0)
    total_compute = compute.sum()
    total_memory = inst.class_memory.sum()
    share = len(order)
    cap = total_memory / share + inst.class_memory.max(initial=0.0)  # "fill"

    used = np.zeros(inst.num_devices)
    class_device = np.full(inst.num_classes, -1)
    placed_compute = placed_memory = 0.0
    stage = 0
    for node in inst.order:
        cls = inst.tie[node]
        if class_device[cls] >= 0:
            continue
        size, work = inst.class_memory[cls], compute[cls]
        if rule == "fill":  # the next device once this one would pass the cap
            while stage < share - 1 and used[order[stage]] + size > cap:
                stage += 1
        else:  # advance while this class's midpoint lies past the current stage's targets
            while stage < share - 1 and (
                    placed_compute + work / 2 > total_compute * (stage + 1) / share
                    or placed_memory + size / 2 > total_memory * (stage + 1) / share):
                stage += 1
        device = int(order[stage])
        if not (inst.candidates[node, device] and used[device] + size <= inst.memory[device]):
            device = -1
            for devices in (inst.candidates[node], inst.allowed[node]):  # the host last
                room = np.where(devices, inst.memory - used, -np.inf)
                if room.max() >= size:
                    device = int(np.argmax(room))
                    break
            if device < 0:
                raise common.out_of_room(problem, inst, int(node), used)
        class_device[cls] = device
        used[device] += size
        placed_compute += work
        placed_memory += size
    return problem.tie(class_device[inst.tie].astype(np.int32))
