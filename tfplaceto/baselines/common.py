"""Shared pieces of the baseline placers: the DAG as node pairs, transfer times, ties, memory.

Every placer here works on a `Problem` (tfplaceto/problem.py) through one precomputed `Instance`:
- node pairs: data edges merged per (producer, consumer) node pair (bytes summed, one latency per
  tensor, since the simulator sends every tensor separately) plus control edges (no bytes, no
  latency: they only order), with CSR indices by consumer (`parents`) and by producer (`children`);
- candidate devices: kernel-allowed accelerators (the host CPU of a GPU cluster only for nodes that
  have no accelerator kernel), the same rule as the random and round-robin placers; the other
  allowed devices (the host) are a fallback the memory-aware placers use only when no candidate
  has room left;
- tie classes: compact colocation class ids with per-class totals, so a list scheduler can place
  a whole class when it meets its first member ("pre-merged costs");
- Baechi's memory estimate (Jeon et al., "Baechi: Fast Device Placement of Machine Learning
  Graphs", SoCC 2020): a placed node holds its persistent bytes plus all its output bytes for the
  whole step. It is conservative (nothing is freed), which is what makes the greedy memory-aware
  placers safe without simulating.

`repair` turns any assignment (a partition, a name-based guess) into a feasible one; it is used by
the placers that do not build their answer device by device (METIS, expert).

Communication models of the list schedulers (m-ETF, m-SCT, HEFT), `COMM_MODELS`:
- "link": a queue per directed link (src, dst), one transfer at a time: the simulator's model;
- "channel": Baechi's (`placer/device.py`): one channel per device, shared by all its sends and
  receives; a transfer starts sending when the producer is done and the sender's channel is free,
  starts receiving when that has happened and the receiver's channel is free, and ends a transfer
  time later; it holds the sender's channel for a transfer time from its send start and the
  receiver's until it ends. More pessimistic under fan-out/fan-in, so it splits less.
Neither model is right for every graph (the simulator has the link queues, but a placer that
believes them splits too eagerly where its other approximations are optimistic), so the placers
try several and `best_of` keeps the placement the simulator scores best: the published
algorithm's model never beats ours on the same problem.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from tfplaceto import errors
from tfplaceto.graph.op_graph import csr
from tfplaceto.problem import Problem

# Relative tolerance under which two start/finish times count as equal (float sums of different
# paths differ in the last bits; ties are then broken by a deterministic rule instead).
TIME_TOLERANCE = 1e-9
# See the module docstring; the index of a name is its code in the compiled schedulers.
COMM_MODELS = ("link", "channel")


def earlier(a: float, b: float) -> bool:
    """a is earlier than b by more than the tolerance (so near-equal times count as equal)."""
    return a < b - TIME_TOLERANCE * abs(b) if np.isfinite(b) else a < b


def close_to(values: np.ndarray, least: float) -> np.ndarray:
    """Mask of values within the tolerance of `least` (their minimum)."""
    return values <= least + TIME_TOLERANCE * max(abs(least), 1e-12)


@dataclasses.dataclass(frozen=True, eq=False)
class Instance:
    """Placement-independent arrays of one Problem (see the module docstring)."""

    num_nodes: int
    num_devices: int
    order: np.ndarray  # topological order
    # node pairs
    pair_src: np.ndarray  # (P,) producer node
    pair_dst: np.ndarray  # (P,) consumer node
    pair_bytes: np.ndarray  # (P,) float bytes sent per step when the pair is split across devices
    pair_tensors: np.ndarray  # (P,) transfers per step (each pays a link latency); 0 = control only
    parent_ptr: np.ndarray  # CSR over pairs by consumer
    parent_pairs: np.ndarray
    child_ptr: np.ndarray  # CSR over pairs by producer
    child_pairs: np.ndarray
    # tensors, for schedulers that model each transfer (one per tensor and destination device)
    tensor_producer: np.ndarray  # (T,)
    tensor_bytes: np.ndarray  # (T,) float, one transfer's
    tensor_trips: np.ndarray  # (T,) float, transfers per step (> 1 in a loop body, as simulated)
    input_ptr: np.ndarray  # CSR over tensors read by each node (data edges by consumer)
    input_tensors: np.ndarray
    control_ptr: np.ndarray  # CSR over control parents of each node
    control_parents: np.ndarray
    # links, with zero cost on the diagonal (a tensor used where it is made moves nowhere)
    latency: np.ndarray  # (D, D) seconds
    inverse_bandwidth: np.ndarray  # (D, D) seconds per byte
    # devices and costs
    candidates: np.ndarray  # (N, D) bool, constant over each tie class
    allowed: np.ndarray  # (N, D) bool: candidates plus the fallback devices (problem.allowed)
    fastest: np.ndarray  # (N,) seconds on the node's fastest candidate device
    memory: np.ndarray  # (D,) float bytes
    node_memory: np.ndarray  # (N,) Baechi estimate: persistent + output bytes
    # tie classes
    tie: np.ndarray  # (N,) compact class id
    num_classes: int
    class_ptr: np.ndarray  # CSR: members of each class, in topological order
    class_members: np.ndarray
    class_memory: np.ndarray  # (C,) sum of node_memory
    class_persistent: np.ndarray  # (C,) sum of persistent bytes
    class_compute: np.ndarray  # (C,) sum of fastest

    def parents_of(self, node: int) -> np.ndarray:
        return self.parent_pairs[self.parent_ptr[node]:self.parent_ptr[node + 1]]

    def inputs_of(self, node: int) -> np.ndarray:
        return self.input_tensors[self.input_ptr[node]:self.input_ptr[node + 1]]

    def control_parents_of(self, node: int) -> np.ndarray:
        return self.control_parents[self.control_ptr[node]:self.control_ptr[node + 1]]

    def children_of(self, node: int) -> np.ndarray:
        return self.child_pairs[self.child_ptr[node]:self.child_ptr[node + 1]]

    def members(self, tie_class: int) -> np.ndarray:
        return self.class_members[self.class_ptr[tie_class]:self.class_ptr[tie_class + 1]]

    def transfer_s(self, pairs: np.ndarray, src_devices: np.ndarray) -> np.ndarray:
        """(k, D) seconds to move pair k's tensors from src_devices[k] to each device."""
        return (self.pair_tensors[pairs, None] * self.latency[src_devices]
                + self.pair_bytes[pairs, None] * self.inverse_bandwidth[src_devices])

    def mean_transfer_s(self, pairs: np.ndarray | None = None) -> np.ndarray:
        """Transfer time of each pair over an average link between two candidate accelerators
        (HEFT's and the SCT LP's device-independent communication cost)."""
        pairs = np.arange(len(self.pair_src)) if pairs is None else pairs
        used = np.flatnonzero(self.candidates.any(0))
        off = ~np.eye(len(used), dtype=bool)
        if not off.any():  # one device: nothing ever moves
            return np.zeros(len(pairs))
        latency = self.latency[np.ix_(used, used)][off].mean()
        inverse_bandwidth = self.inverse_bandwidth[np.ix_(used, used)][off].mean()
        return self.pair_tensors[pairs] * latency + self.pair_bytes[pairs] * inverse_bandwidth

    def bottom_level(self, weight: np.ndarray, pair_cost: np.ndarray | None = None) -> np.ndarray:
        """Longest path from each node to an exit: its weight plus the heaviest child path
        (plus pair_cost[pair] per edge when given)."""
        level = np.zeros(self.num_nodes)
        for node in self.order[::-1]:
            kids = self.children_of(node)
            if len(kids):
                tail = level[self.pair_dst[kids]]
                if pair_cost is not None:
                    tail = tail + pair_cost[kids]
                level[node] = weight[node] + tail.max()
            else:
                level[node] = weight[node]
        return level


def accelerator_indices(problem: Problem) -> np.ndarray:
    """Cluster indices of the accelerators (every device on a CPU-only cluster)."""
    names = {d.name for d in problem.cluster.accelerators}
    return np.array([i for i, d in enumerate(problem.cluster.devices) if d.name in names], np.int64)


def candidate_devices(problem: Problem) -> np.ndarray:
    """(N, D): allowed accelerators, or the allowed devices for nodes no accelerator can run."""
    candidates = np.zeros_like(problem.allowed, dtype=bool)
    candidates[:, accelerator_indices(problem)] = True
    candidates &= problem.allowed
    stuck = ~candidates.any(1)
    candidates[stuck] = problem.allowed[stuck]
    return candidates


def prepare(problem: Problem) -> Instance:
    """The Instance of a problem (O(N + E), computed once per placer call)."""
    graph = problem.graph
    n, d = problem.num_nodes, problem.num_devices
    # Data pairs: one per (producer, consumer) with the bytes and the number of transfers per
    # step: a tensor in a loop body moves every iteration (graph.tensor_iterations), as the
    # simulator charges it.
    src = np.concatenate([graph.senders, graph.control_senders]).astype(np.int64)
    dst = np.concatenate([graph.receivers, graph.control_receivers]).astype(np.int64)
    trips = np.asarray(graph.tensor_iterations, float)
    edge_trips = trips[graph.edge_tensor]
    nbytes = np.concatenate([graph.edge_bytes * edge_trips, np.zeros(len(graph.control_senders))]).astype(float)
    ntensors = np.concatenate([edge_trips, np.zeros(len(graph.control_senders))])
    keep = src != dst
    keys, inverse = np.unique(src[keep] * n + dst[keep], return_inverse=True)
    pair_src, pair_dst = keys // n, keys % n
    pair_bytes = np.bincount(inverse, weights=nbytes[keep], minlength=len(keys))
    pair_tensors = np.bincount(inverse, weights=ntensors[keep], minlength=len(keys))
    parent_ptr, parent_pairs = csr(pair_dst, n)
    child_ptr, child_pairs = csr(pair_src, n)
    input_ptr, by_consumer = csr(graph.edge_consumer, n)
    control_ptr, by_receiver = csr(graph.control_receivers, n)

    latency = np.array(problem.cluster.latency, float)
    with np.errstate(divide="ignore"):
        inverse_bandwidth = 1.0 / np.array(problem.cluster.bandwidth, float)
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(inverse_bandwidth, 0.0)

    candidates = candidate_devices(problem)
    compute = np.asarray(problem.compute_s, float)
    fastest = np.where(candidates, compute, np.inf).min(1)
    node_memory = (graph.persistent_bytes + graph.output_bytes).astype(float)

    _, tie = np.unique(graph.colocation, return_inverse=True)
    tie = tie.astype(np.int64)
    num_classes = int(tie.max()) + 1 if n else 0
    position = np.empty(n, np.int64)
    position[graph.topo_order] = np.arange(n)
    by_class = np.lexsort((position, tie))
    class_ptr = np.zeros(num_classes + 1, np.int64)
    np.cumsum(np.bincount(tie, minlength=num_classes), out=class_ptr[1:])
    return Instance(
        num_nodes=n, num_devices=d, order=np.asarray(graph.topo_order, np.int64),
        pair_src=pair_src, pair_dst=pair_dst, pair_bytes=pair_bytes, pair_tensors=pair_tensors,
        parent_ptr=parent_ptr, parent_pairs=parent_pairs, child_ptr=child_ptr,
        child_pairs=child_pairs,
        tensor_producer=np.asarray(graph.tensor_producer, np.int64),
        tensor_bytes=np.asarray(graph.tensor_bytes, float), tensor_trips=trips, input_ptr=input_ptr,
        input_tensors=np.asarray(graph.edge_tensor, np.int64)[by_consumer], control_ptr=control_ptr,
        control_parents=np.asarray(graph.control_senders, np.int64)[by_receiver], latency=latency, inverse_bandwidth=inverse_bandwidth,
        candidates=candidates, allowed=np.asarray(problem.allowed, bool), fastest=fastest, memory=problem.memory_bytes.astype(float),
        node_memory=node_memory, tie=tie, num_classes=num_classes, class_ptr=class_ptr,
        class_members=by_class,
        class_memory=np.bincount(tie, weights=node_memory, minlength=num_classes),
        class_persistent=np.bincount(tie, weights=graph.persistent_bytes, minlength=num_classes),
        class_compute=np.bincount(tie, weights=fastest, minlength=num_classes))


# -- errors ------------------------------------------------------------------------------------

def unplaceable(problem: Problem, node: int, need_bytes: float, what: str, room: str) -> errors.UnplaceableError:
    """An UnplaceableError naming the node, the memory it needs and where it was looked for."""
    return errors.UnplaceableError(
        f"{problem.graph.names[node]!r} (op type {problem.graph.types[node]}) needs "
        f"{errors.format_bytes(need_bytes)} of {what} (with the ops colocated with it) but {room}; use "
        "devices with more memory, more devices, or a smaller batch size")


def check_persistent_fits(problem: Problem, inst: Instance) -> None:
    """UnplaceableError if some tie class's persistent bytes exceed every allowed device."""
    room = np.where(problem.allowed, inst.memory, 0.0)  # any allowed device, not only candidates
    biggest = np.zeros(inst.num_classes)
    np.maximum.at(biggest, inst.tie, room.max(1))
    over = np.flatnonzero(inst.class_persistent > biggest)
    if len(over):
        members = inst.members(int(over[0]))
        node = int(members[np.argmax(problem.graph.persistent_bytes[members])])
        raise unplaceable(problem, node, inst.class_persistent[over[0]], "persistent memory",
                          f"the largest device it can run on has {errors.format_bytes(biggest[over[0]])}")


def out_of_room(problem: Problem, inst: Instance, node: int, used: np.ndarray) -> errors.UnplaceableError:
    """The error of a greedy memory-aware placer that found no candidate device with room."""
    allowed = np.flatnonzero(inst.allowed[node])
    free = ", ".join(f"{problem.cluster.devices[d].name.rsplit('/', 1)[-1]} "
                     f"{errors.format_bytes(inst.memory[d] - used[d])}" for d in allowed)
    return unplaceable(problem, node, inst.class_memory[inst.tie[node]],
                       "memory (persistent + outputs, Baechi's estimate)",
                       f"the devices it can run on have only this much left: {free}")


def choice(what: str, value, choices: tuple) -> int:
    """The index of value in choices; ValueError naming the choices otherwise."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose from {', '.join(map(str, choices))}")
    return choices.index(value)


def combinations(options: dict[str, tuple], fixed: dict[str, object]) -> list[dict[str, object]]:
    """Every combination of the options (name -> choices), with the names fixed to a value other
    than None taking that value only: the variants a best-of placer schedules."""
    combos = [{}]
    for name, choices in options.items():
        values = choices if fixed.get(name) is None else (fixed[name],)
        combos = [dict(combo, **{name: value}) for combo in combos for value in values]
    return combos


def best_variant(problem: Problem, make: Callable[..., np.ndarray], options: dict[str, tuple],
                 fixed: dict[str, object]) -> np.ndarray:
    """The placement `make(problem, inst, **variant)` the simulator scores best (`best_of`) over
    every combination of `options` not `fixed` (`combinations`); the Instance is prepared and
    checked once for them all. The shape of a deterministic best-of placer's `place`."""
    inst = prepare(problem)
    check_persistent_fits(problem, inst)
    return best_of(problem, {
        tuple(variant.values()): functools.partial(make, problem, inst, **variant)
        for variant in combinations(options, fixed)})[1]


def best_of(problem: Problem, variants: dict[str, Callable[[], np.ndarray]]) -> tuple[str, np.ndarray]:
    """(name, placement) of the variant the simulator scores best: no OOM first, then the
    shortest step, then the first listed. A variant that raises UnplaceableError is skipped;
    the first such error is raised again when every variant raised one."""
    simulator = problem.simulator()
    best, best_key, failure = None, None, None
    for name, make in variants.items():
        try:
            placement = make()
        except errors.UnplaceableError as error:
            failure = failure or error
            continue
        step_time, _, oom = simulator.run(placement)
        key = (bool(oom), float(step_time))
        if best_key is None or key < best_key:
            best, best_key = (name, placement), key
    if best is None:
        raise failure
    return best


# -- repair ------------------------------------------------------------------------------------

def repair(problem: Problem, inst: Instance, device_of: np.ndarray, simulate: bool = True,
           max_rounds: int = 12) -> np.ndarray:
    """A feasible placement close to device_of: kernels, ties, persistent memory, then peaks.

    1. Each tie class goes to the candidate device holding most of its compute (its "majority":
       weighted by compute so a layer's cheap optimizer updates follow the layer, not vice versa).
    2. While a device's persistent bytes overflow it, its smallest-compute class moves to the
       candidate device with the most free memory, or failing that to another allowed device
       (the host) with the most (UnplaceableError when none has room).
    3. With `simulate`, the same moves driven by the simulator's peak memory, for at most
       max_rounds simulations; the placement with the least overflow is kept.
    """
    device_of = np.asarray(device_of, np.int64).copy()
    class_of = inst.tie
    # 1. ties and kernels in one vote: only candidate devices collect votes.
    weight = inst.fastest / max(inst.fastest.max(initial=0.0), 1e-30) + 1e-6
    votes = np.zeros((inst.num_classes, inst.num_devices))
    legal = inst.candidates[np.arange(inst.num_nodes), device_of]
    np.add.at(votes, (class_of[legal], device_of[legal]), weight[legal])
    first = inst.class_members[inst.class_ptr[:-1]]
    class_candidates = inst.candidates[first]
    class_allowed = inst.allowed[first]
    # A class with no legal member goes to its least loaded candidate device (by compute so far).
    load = np.bincount(device_of[legal], weights=inst.fastest[legal], minlength=inst.num_devices)
    votes = np.where(class_candidates, votes, -np.inf)
    unvoted = ~(votes > 0).any(1)
    class_device = votes.argmax(1)
    if unvoted.any():
        class_device[unvoted] = np.where(class_candidates[unvoted], -load, -np.inf).argmax(1)
    # 2. persistent memory, the hard constraint.
    persistent = problem.graph.persistent_bytes
    class_persistent = inst.class_persistent

    def move_off(device: int, excess: float, held: np.ndarray, sizes: np.ndarray) -> bool:
        """Moves the smallest-compute classes off `device` until `excess` bytes are freed."""
        on_device = np.flatnonzero((class_device == device) & (sizes > 0))
        moved = False
        for cls in on_device[np.lexsort((-sizes[on_device], inst.class_compute[on_device]))]:
            target = -1
            for devices in (class_candidates[cls], class_allowed[cls]):
                free = np.where(devices, inst.memory - held, -np.inf)
                free[device] = -np.inf
                if free.max() >= sizes[cls]:
                    target = int(free.argmax())
                    break
            if target < 0:
                continue
            class_device[cls] = target
            held[device] -= sizes[cls]
            held[target] += sizes[cls]
            excess -= sizes[cls]
            moved = True
            if excess <= 0:
                break
        return moved

    held = np.bincount(class_device, weights=class_persistent, minlength=inst.num_devices)
    for device in np.flatnonzero(held > inst.memory):
        move_off(int(device), held[device] - inst.memory[device], held, class_persistent)
    if (held > inst.memory).any():
        device = int(np.argmax(held - inst.memory))
        node = int(np.argmax(np.where(class_device[class_of] == device, persistent, -1)))
        raise unplaceable(problem, node, persistent[node], "persistent memory",
                          "no device has room for it after spreading the persistent memory")
    if not simulate:
        return class_device[class_of].astype(np.int32)
    # 3. peaks: move by Baechi's estimate of what a class holds, as measured by the simulator.
    simulator = problem.simulator()
    best, best_excess = None, np.inf
    for _ in range(max_rounds):
        placed = class_device[class_of].astype(np.int32)
        _, peak, _ = simulator.run(placed)
        overflow = np.maximum(peak - inst.memory, 0.0)
        if overflow.sum() < best_excess:
            best, best_excess = placed, overflow.sum()
        if best_excess == 0:
            break
        held = peak.astype(float)
        moved = False
        for device in np.flatnonzero(overflow > 0):
            moved |= move_off(int(device), overflow[device], held, inst.class_memory)
        if not moved:
            break
    return best
