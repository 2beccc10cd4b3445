"""HEFT: Heterogeneous Earliest Finish Time (Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002).

1. Upward rank: rank(i) = w(i) + max over children j of (c(i, j) + rank(j)), with w(i) the mean
   compute of i over its candidate devices and c(i, j) the pair's transfer time over an average
   link (mean latency per tensor + bytes x mean inverse bandwidth). Control pairs cost nothing.
2. Nodes in decreasing rank (a topological order; equal ranks keep the graph's topological order)
   each go to the device where they *finish* earliest, with insertion: a node may start in an
   idle gap between two nodes already on the device if it fits there after its inputs arrive.

Additions for placement: candidate devices are the kernel-allowed accelerators; ties (colocation
classes) are placed whole (the first member fixes the device for the rest); and devices without
room for a class under Baechi's memory estimate (see `common`) are skipped, as in m-ETF (the
host is used only when no accelerator has room), raising UnplaceableError when no device has room. Devices run one node at a time here (streams ignored).

Communication models (`COMM_MODELS`): "none", HEFT's own (transfers never wait for each other, a
pair's tensors cost one transfer time), and `common.COMM_MODELS` ("link", "channel"): each
tensor is sent once per destination device and queues on its link or on both devices' channels,
in the order of its producer's finish. `place` tries each and keeps the placement the simulator
scores best; `comm_model=` forces one.
"""

from __future__ import annotations

import numpy as np

from tfplaceto.baselines import common, m_etf
from tfplaceto.problem import Problem

COMM_MODELS = ("none",) + common.COMM_MODELS


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          comm_model: str | None = None) -> np.ndarray:
    """HEFT under `comm_model`, or under each of `COMM_MODELS` keeping the best."""
    del seed, budget_s  # deterministic, one pass per model
    return common.best_variant(problem, schedule, {"comm_model": COMM_MODELS}, {"comm_model": comm_model})


def schedule(problem: Problem, inst: common.Instance, comm_model: str = "none") -> np.ndarray:
    """HEFT's placement under one communication model (module docstring)."""
    comm = common.choice("communication model", comm_model, COMM_MODELS)
    compute = np.asarray(problem.compute_s, float)
    n, num_devices = inst.num_nodes, inst.num_devices

    counts = inst.candidates.sum(1)
    mean_compute = np.where(inst.candidates, compute, 0.0).sum(1) / np.maximum(counts, 1)
    rank = inst.bottom_level(mean_compute, inst.mean_transfer_s())
    position = np.empty(n, np.int64)
    position[inst.order] = np.arange(n)
    order = np.lexsort((position, -rank))

    # Busy intervals of each device, sorted by start (they never overlap).
    starts = [np.empty(0) for _ in range(num_devices)]
    ends = [np.empty(0) for _ in range(num_devices)]
    used = np.zeros(num_devices)
    class_device = np.full(inst.num_classes, -1)
    finish = np.zeros(n)
    device_of = np.full(n, -1, np.int64)  # int64 and float64: the compiled queues' types
    queues = _Queues(inst, comm_model) if comm else None

    for node in order:
        cls = inst.tie[node]
        if class_device[cls] >= 0:
            devices = np.array([class_device[cls]])
        else:
            room = used + inst.class_memory[cls] <= inst.memory
            devices = np.flatnonzero(inst.candidates[node] & room)
            if len(devices) == 0:  # the host (or other non-candidates) only when out of room
                devices = np.flatnonzero(inst.allowed[node] & room)
            if len(devices) == 0:
                raise common.out_of_room(problem, inst, int(node), used)
        if queues is not None:
            ready = queues.arrival_at(node, finish, device_of)
        else:
            parents = inst.parents_of(node)
            ready = np.zeros(num_devices)
            if len(parents):
                sources = inst.pair_src[parents]
                ready = (finish[sources, None] + inst.transfer_s(parents, device_of[sources])).max(0)
        best_finish, best_device, best_start = np.inf, -1, 0.0
        for device in devices:
            begin = _earliest_slot(starts[device], ends[device], ready[device], compute[node, device])
            end = begin + compute[node, device]
            if common.earlier(end, best_finish):
                best_finish, best_device, best_start = end, int(device), begin
        if queues is not None:  # queue the transfers (as the trial towards best_device did)
            queues.commit(node, best_device, finish, device_of)
        at = np.searchsorted(starts[best_device], best_start, side="right")
        starts[best_device] = np.insert(starts[best_device], at, best_start)
        ends[best_device] = np.insert(ends[best_device], at, best_finish)
        finish[node] = best_finish
        device_of[node] = best_device
        if class_device[cls] < 0:
            class_device[cls] = best_device
            used[best_device] += inst.class_memory[cls]
    return problem.tie(device_of.astype(np.int32))


def _earliest_slot(starts: np.ndarray, ends: np.ndarray, ready: float, duration: float) -> float:
    """Earliest t >= ready such that [t, t + duration) overlaps no busy interval."""
    first = np.searchsorted(ends, ready, side="right")  # intervals ending later than ready matter
    gap_starts = np.maximum(np.concatenate(([ready], ends[first:])), ready)
    gap_ends = np.concatenate((starts[first:], [np.inf]))
    fits = np.flatnonzero(gap_starts + duration <= gap_ends)
    return float(gap_starts[fits[0]])


class _Queues:
    """Link or channel occupancy and the tensors already received where, over m-ETF's compiled
    estimate (`m_etf.estimate_arrival`, inputs queued) and commit (`m_etf.queue_inputs`)."""

    def __init__(self, inst: common.Instance, comm_model: str):
        self.comm = common.COMM_MODELS.index(comm_model)
        n, d = inst.num_nodes, inst.num_devices
        self.link_free, self.channel_free = np.zeros((d, d)), np.zeros(d)
        self.received = np.full((len(inst.tensor_producer), d), np.inf)
        self.arrival = np.zeros((n, d))
        self.scratch = (np.empty((d, d)), np.empty((d, d)), np.zeros(len(inst.tensor_producer), np.int64),
                        np.zeros(1, np.int64))
        self.graph = tuple(m_etf.owned(a) for a in (
            inst.latency, inst.inverse_bandwidth, inst.input_ptr, inst.input_tensors,
            inst.tensor_producer, inst.tensor_bytes, inst.tensor_trips, inst.control_ptr, inst.control_parents))

    def arrival_at(self, node: int, finish: np.ndarray, device_of: np.ndarray) -> np.ndarray:
        """(D,) when the node's inputs could all be on each device."""
        latency, inverse_bandwidth, *csr = self.graph
        m_etf.estimate_arrival(node, self.arrival, finish, device_of, self.link_free, self.channel_free,
                               self.comm, True, self.received, latency, inverse_bandwidth, *csr,
                               *self.scratch)
        return self.arrival[node]

    def commit(self, node: int, device: int, finish: np.ndarray, device_of: np.ndarray) -> None:
        """Queues the node's transfers towards the device it was given."""
        latency, inverse_bandwidth, *csr = self.graph
        m_etf.queue_inputs(node, device, finish, device_of, self.link_free, self.channel_free,
                           self.comm, self.received, latency, inverse_bandwidth, *csr)
