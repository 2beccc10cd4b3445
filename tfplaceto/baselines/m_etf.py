"""m-ETF: memory-constrained Earliest Task First (Baechi: Jeon et al., SoCC 2020, section 4.2).

ETF (Hwang, Chow, Anger and Lee, SIAM J. Comput. 1989) is list scheduling that, at every step,
starts the (ready node, device) pair with the earliest start time, where a node's start on device
d waits for d to be free and for every parent's output to arrive there: a parent on another device
adds the link's latency per tensor plus bytes / bandwidth. Ties go to the node with the longest
path to an exit (its static level), then to the earlier finish, then to the lower index.
Baechi's "m-" variant only considers devices with room for the node under its memory estimate
(persistent + output bytes of everything placed there, see `common`), and kernel-allowed ones:
the accelerators, and the host only for a node no accelerator has room for (or kernels).

Ties (colocation classes) are placed whole: the first member scheduled fixes the device of its
class and reserves the class's memory there; later members may only start on that device.

Transfers are modelled per tensor and destination device, under one of two communication models
(`common.COMM_MODELS`): "link", the simulator's (tfplaceto/sim/kernel.py: each directed link
carries one transfer at a time, in the order they are queued), or "channel", Baechi's (each
device has one channel shared by all its sends and receives). A node's input arrival times are
estimated when it becomes ready and re-estimated lazily: links and channels only fill up, so a
stale estimate is a lower bound, and re-estimating the apparent winner until it stays the winner
picks the earliest start under the estimate. The committed start queues the transfers.

Options (`OPTIONS`), each a different greedy, none best on every graph; `place` schedules every
combination and keeps the placement the simulator scores best (one schedule costs milliseconds
on a grouped graph), keyword arguments fix any of them:
- comm_model: "link" or "channel" (above). Baechi's channel is more pessimistic under fan-out
  and fan-in, so it splits less, which pays where ETF's greed would split too eagerly;
- tie_break among equal starts: "level" (the longer path to an exit first) or "topo" (the
  earlier in topological order, as Baechi's code does);
- inputs: "queued" estimates a node's own missing inputs queued behind each other, as the
  commit will queue them (exact under the model); "parallel" lets each arrive as if alone (the
  estimate of tfplaceto's earlier m-ETF, optimistic for a group that reads many tensors).

`schedule` is shared with m-SCT, which adds a preference for favourite children. The loop is
compiled with numba (O(ready nodes x devices) per step): the NASNet-Mobile training graph at op
level (~20,000 ops, 9 devices) schedules in a few seconds.
"""

from __future__ import annotations

import numba
import numpy as np

from tfplaceto.baselines import common
from tfplaceto.problem import Problem

TIE_BREAKS = ("level", "topo")
INPUTS = ("queued", "parallel")
# The schedule's options (module docstring); `place` tries every combination not fixed.
OPTIONS = {"comm_model": common.COMM_MODELS, "tie_break": TIE_BREAKS, "inputs": INPUTS}


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          comm_model: str | None = None, tie_break: str | None = None,
          inputs: str | None = None) -> np.ndarray:
    """m-ETF with the given options, trying every combination of those left None (`OPTIONS`)
    and keeping the placement the simulator scores best."""
    del seed, budget_s  # deterministic, one pass per variant
    fixed = {"comm_model": comm_model, "tie_break": tie_break, "inputs": inputs}
    return common.best_variant(problem, schedule, OPTIONS, fixed)


def schedule(problem: Problem, inst: common.Instance, favourite_child: np.ndarray | None = None,
             favourite_bonus: np.ndarray | None = None, comm_model: str = "link",
             awake: bool = False, tie_break: str = "level", inputs: str = "queued") -> np.ndarray:
    """Earliest-start list scheduling; returns the device of every node.

    favourite_child[p] (or -1) and favourite_bonus[p] (seconds): once p is placed on device d,
    its favourite child, when picked, goes to d if it starts there at most the bonus later than
    on its best device (m-SCT's preference; the bonus does not change which node goes next).
    awake: the SCT rule instead (Hanen and Munier; Baechi's `SCTDevice`): a device whose last
    node's favourite child is ready and starts earliest there is "awake" for it: any other node
    starts there no earlier than its urgent time (its latest start over its usable devices, when
    waiting for a device no longer helps it), so the device stays free for the child unless
    another node becomes urgent first.
    """
    n = inst.num_nodes
    comm = common.choice("communication model", comm_model, common.COMM_MODELS)
    common.choice("tie break", tie_break, TIE_BREAKS)
    common.choice("inputs estimate", inputs, INPUTS)
    if favourite_child is None:
        favourite_child, favourite_bonus = np.full(n, -1, np.int64), np.zeros(n)
    streams = np.array([d.streams for d in problem.cluster.devices], np.int64)
    if tie_break == "level":
        priority = inst.bottom_level(np.where(np.isfinite(inst.fastest), inst.fastest, 0.0))
    else:
        priority = np.empty(n)
        priority[inst.order] = -np.arange(n, dtype=float)
    device_of, used, stuck = _schedule(*(owned(a) for a in (
        problem.compute_s, inst.memory, streams, inst.latency, inst.inverse_bandwidth, inst.allowed,
        inst.candidates, inst.tie, inst.class_memory, priority,
        np.bincount(inst.pair_dst, minlength=n), inst.child_ptr, inst.child_pairs, inst.pair_dst,
        inst.input_ptr, inst.input_tensors, inst.tensor_producer, inst.tensor_bytes, inst.tensor_trips,
        inst.control_ptr, inst.control_parents, favourite_child, favourite_bonus)),
        comm, inputs == "queued", awake, common.TIME_TOLERANCE)
    if stuck >= 0:  # nothing placed later frees memory: it never fits
        raise common.out_of_room(problem, inst, int(stuck), used)
    return problem.tie(device_of.astype(np.int32))


def owned(array) -> np.ndarray:
    """A writable C-contiguous int64/float64/bool copy: one numba specialization serves every
    call (read-only or int32 arrays would each compile another)."""
    array = np.asarray(array)
    kind = np.bool_ if array.dtype == bool else np.float64 if array.dtype.kind == "f" else np.int64
    return np.array(array, dtype=kind, order="C", copy=True)


@numba.njit(cache=True)
def _close(a, b, tolerance):
    """a and b equal within the relative tolerance (b finite)."""
    return abs(a - b) <= tolerance * max(abs(b), 1e-12)


@numba.njit(cache=True)
def _send(comm, done, src, dst, took, links, channels, queue):
    """When a transfer of `took` seconds, ready at `done`, arrives: after the link (src, dst) is
    free (comm 0), or after both devices' channels are (comm 1). With `queue`, it occupies the
    link until it arrives, or the sender's channel from its send start and the receiver's until
    it arrives (Baechi's `send_tensor` / `recv_tensor`)."""
    if comm == 0:
        at = max(done, links[src, dst]) + took
        if queue:
            links[src, dst] = at
    else:
        at = max(done, channels[src], channels[dst]) + took
        if queue:
            channels[src] = max(done, channels[src]) + took
            channels[dst] = at
    return at


@numba.njit(inline="always")
def _arrival(tensor, src, dst, done, comm, received, latency, inverse_bandwidth, tensor_bytes, tensor_trips,
             links, channels, queue):
    """(when `tensor`, made on src at `done`, can be on dst, whether that takes a new transfer):
    at once on src, when it was received if dst has it, else a transfer (`_send`). Inlined at
    numba's IR level: no call in the placer's inner loops."""
    if dst == src:
        return done, False
    if received[tensor, dst] < np.inf:
        return received[tensor, dst], False
    took = tensor_trips[tensor] * (latency[src, dst] + tensor_bytes[tensor] * inverse_bandwidth[src, dst])
    return _send(comm, done, src, dst, took, links, channels, queue), True


@numba.njit(cache=True)
def estimate_arrival(node, arrival, finish, device_of, link_free, channel_free, comm, queued, received,
                      latency, inverse_bandwidth, input_ptr, input_tensors, tensor_producer,
                      tensor_bytes, tensor_trips, control_ptr, control_parents, trial_link, trial_channel, seen,
                      calls):
    """When the node's inputs could be on each device: its missing tensors, in the order their
    producers finished, queued behind the links' (channels') current transfers and, if `queued`,
    behind each other as the commit will queue them (else each as if alone). Transfers queued
    later by other nodes can only delay them: a stale estimate is a lower bound.
    trial_*, seen: scratch; calls[0]: a call counter. Shared with HEFT."""
    num_devices = arrival.shape[1]
    calls[0] += 1
    stamp = calls[0]
    latest = 0.0
    for k in range(control_ptr[node], control_ptr[node + 1]):
        latest = max(latest, finish[control_parents[k]])
    for d in range(num_devices):
        arrival[node, d] = latest
        for e in range(num_devices):
            trial_link[e, d] = link_free[e, d]
            trial_channel[d, e] = channel_free[e]  # row d: the channels as a trial towards d sees them
    order = _by_producer_finish(node, finish, input_ptr, input_tensors, tensor_producer)
    lo = input_ptr[node]
    for k in order:
        tensor = input_tensors[lo + k]
        if queued:
            if seen[tensor] == stamp:  # read twice: sent once
                continue
            seen[tensor] = stamp
        producer = tensor_producer[tensor]
        src = device_of[producer]
        done = finish[producer]
        for d in range(num_devices):
            at, _ = _arrival(tensor, src, d, done, comm, received, latency, inverse_bandwidth, tensor_bytes,
                             tensor_trips, trial_link, trial_channel[d], queued)
            if at > arrival[node, d]:
                arrival[node, d] = at


@numba.njit(cache=True)
def _by_producer_finish(node, finish, input_ptr, input_tensors, tensor_producer):
    """Positions of the node's inputs sorted by their producer's finish (insertion sort: a node
    has few inputs; stable on ties)."""
    lo, hi = input_ptr[node], input_ptr[node + 1]
    order = np.empty(hi - lo, np.int64)
    for k in range(hi - lo):
        j = k
        done = finish[tensor_producer[input_tensors[lo + k]]]
        while j > 0 and finish[tensor_producer[input_tensors[lo + order[j - 1]]]] > done:
            order[j] = order[j - 1]
            j -= 1
        order[j] = k
    return order


@numba.njit(cache=True)
def queue_inputs(node, device, finish, device_of, link_free, channel_free, comm, received, latency,
                 inverse_bandwidth, input_ptr, input_tensors, tensor_producer, tensor_bytes, tensor_trips,
                 control_ptr, control_parents):
    """Queues the node's missing inputs towards `device`, in the order their producers finished,
    on the links (comm 0) or channels (comm 1); returns (when all its inputs are there, how many
    transfers were queued). Shared with HEFT."""
    inputs_at = 0.0
    for k in range(control_ptr[node], control_ptr[node + 1]):
        inputs_at = max(inputs_at, finish[control_parents[k]])
    lo = input_ptr[node]
    sent = 0
    for k in _by_producer_finish(node, finish, input_ptr, input_tensors, tensor_producer):
        tensor = input_tensors[lo + k]
        producer = tensor_producer[tensor]
        src = device_of[producer]
        done = finish[producer]
        at, new = _arrival(tensor, src, device, done, comm, received, latency, inverse_bandwidth, tensor_bytes,
                           tensor_trips, link_free, channel_free, True)
        if new:
            received[tensor, device] = at
            sent += 1
        inputs_at = max(inputs_at, at)
    return inputs_at, sent


@numba.njit(cache=True)
def _schedule(compute, memory, streams, latency, inverse_bandwidth, allowed, candidates, tie,
              class_memory, priority, pending, child_ptr, child_pairs, pair_dst, input_ptr,
              input_tensors, tensor_producer, tensor_bytes, tensor_trips, control_ptr, control_parents,
              favourite_child, favourite_bonus, comm, queued, awake, tolerance):
    """The m-ETF loop; returns (device of each node, memory used per device, stuck node or -1)."""
    n, num_devices = compute.shape
    num_tensors = tensor_producer.shape[0]
    stream_free = np.full((num_devices, max(streams.max(), 1)), np.inf)
    for d in range(num_devices):
        stream_free[d, :streams[d]] = 0.0
    free = np.zeros(num_devices)
    used = np.zeros(num_devices)  # Baechi memory estimate of each device
    class_device = np.full(class_memory.shape[0], -1)
    arrival = np.zeros((n, num_devices))
    finish = np.zeros(n)
    device_of = np.full(n, -1)
    link_free = np.zeros((num_devices, num_devices))  # "link": one transfer at a time per link
    channel_free = np.zeros(num_devices)  # "channel": one per device, sends and receives
    received = np.full((num_tensors, num_devices), np.inf)  # when tensor t got to device d
    trial_link = np.empty((num_devices, num_devices))  # scratch of estimate_arrival
    trial_channel = np.empty((num_devices, num_devices))
    seen = np.zeros(num_tensors, np.int64)
    calls = np.zeros(1, np.int64)
    link_version = 0  # bumped when transfers are queued: arrival rows computed before are stale
    fresh = np.zeros(n, np.int64)  # link_version each arrival row was computed at
    preferred_device = np.full(n, -1)  # the favourite parent's device, once placed ...
    preferred_bonus = np.zeros(n)  # ... and how much later the node may start there
    last_node = np.full(num_devices, -1)  # the node last placed on each device (awake rule)
    awake_for = np.full(num_devices, -1)  # the favourite child each device is awake for, or -1
    is_ready = np.zeros(n, np.bool_)
    ready = np.empty(n, np.int64)  # the ready nodes, unordered
    num_ready = 0
    for node in range(n):
        if pending[node] == 0:
            ready[num_ready] = node
            is_ready[node] = True
            num_ready += 1
    best = np.empty(n)  # per ready slot: earliest usable start
    usable = np.zeros(num_devices, np.bool_)  # scratch: the devices _row_best allows

    for _ in range(n):
        if awake:  # which devices wait for their last node's favourite child
            for d in range(num_devices):
                awake_for[d] = -1
                child = favourite_child[last_node[d]] if last_node[d] >= 0 else -1
                if child < 0 or not is_ready[child]:
                    continue
                if fresh[child] != link_version:
                    estimate_arrival(child, arrival, finish, device_of, link_free, channel_free,
                                      comm, queued, received, latency, inverse_bandwidth, input_ptr,
                                      input_tensors, tensor_producer, tensor_bytes, tensor_trips, control_ptr,
                                      control_parents, trial_link, trial_channel, seen, calls)
                    fresh[child] = link_version
                least = _row_best(child, arrival, free, allowed, candidates, tie, class_device,
                                  class_memory, memory, used, usable, awake_for, False)
                if usable[d] and _close(max(arrival[child, d], free[d]), least, tolerance):
                    awake_for[d] = child
        # Earliest start of every ready node over its usable devices: allowed ones with room for
        # its class (or its class's device), accelerators first, the host only as a fallback.
        for slot in range(num_ready):
            node = ready[slot]
            best[slot] = _row_best(node, arrival, free, allowed, candidates, tie, class_device,
                                   class_memory, memory, used, usable, awake_for, awake)
            if best[slot] == np.inf:
                return device_of, used, node
        # Lazy exact selection: refresh the apparent winner's estimate until it stays the winner.
        while True:
            pick = 0
            for slot in range(1, num_ready):
                a, b = ready[slot], ready[pick]
                if _close(best[slot], best[pick], tolerance):
                    if priority[a] > priority[b] or (priority[a] == priority[b] and a < b):
                        pick = slot
                elif best[slot] < best[pick]:
                    pick = slot
            node = ready[pick]
            if fresh[node] == link_version:
                break
            estimate_arrival(node, arrival, finish, device_of, link_free, channel_free, comm,
                              queued, received, latency, inverse_bandwidth, input_ptr, input_tensors,
                              tensor_producer, tensor_bytes, tensor_trips, control_ptr, control_parents,
                              trial_link, trial_channel, seen, calls)
            fresh[node] = link_version
            best[pick] = _row_best(node, arrival, free, allowed, candidates, tie, class_device,
                                   class_memory, memory, used, usable, awake_for, awake)
        # The device: least key (start, delayed to the urgent time on a device awake for another
        # node, minus the bonus on the favourite parent's device), then earliest finish, then
        # lowest index.
        _row_best(node, arrival, free, allowed, candidates, tie, class_device, class_memory, memory,
                  used, usable, awake_for, False)
        urgent = 0.0
        for d in range(num_devices):
            if usable[d]:
                urgent = max(urgent, max(arrival[node, d], free[d]))
        device, device_key, device_finish = -1, np.inf, np.inf
        for d in range(num_devices):
            if not usable[d]:
                continue
            start = max(arrival[node, d], free[d])
            key = start - (preferred_bonus[node] if d == preferred_device[node] else 0.0)
            if awake and awake_for[d] >= 0 and awake_for[d] != node:
                key = max(key, urgent)
            end = start + compute[node, d]
            if device < 0 or (not _close(key, device_key, tolerance) and key < device_key) or (
                    _close(key, device_key, tolerance) and end < device_finish):
                device, device_key, device_finish = d, key, end
        # Commit: queue the missing inputs on the links to the device, in the order they were made.
        inputs_at, sent = queue_inputs(node, device, finish, device_of, link_free, channel_free,
                                       comm, received, latency, inverse_bandwidth, input_ptr,
                                       input_tensors, tensor_producer, tensor_bytes, tensor_trips, control_ptr,
                                       control_parents)
        link_version += sent
        stream = np.argmin(stream_free[device])
        begin = max(inputs_at, stream_free[device, stream])
        finish[node] = begin + compute[node, device]
        stream_free[device, stream] = finish[node]
        free[device] = stream_free[device].min()
        device_of[node] = device
        last_node[device] = node
        is_ready[node] = False
        num_ready -= 1
        ready[pick] = ready[num_ready]

        cls = tie[node]
        if class_device[cls] < 0:  # the first member places the class and reserves its memory
            class_device[cls] = device
            used[device] += class_memory[cls]
        if favourite_child[node] >= 0:
            preferred_device[favourite_child[node]] = device
            preferred_bonus[favourite_child[node]] = favourite_bonus[node]
        for k in range(child_ptr[node], child_ptr[node + 1]):
            child = pair_dst[child_pairs[k]]
            pending[child] -= 1
            if pending[child] == 0:
                estimate_arrival(child, arrival, finish, device_of, link_free, channel_free, comm,
                                  queued, received, latency, inverse_bandwidth, input_ptr, input_tensors,
                                  tensor_producer, tensor_bytes, tensor_trips, control_ptr, control_parents,
                                  trial_link, trial_channel, seen, calls)
                fresh[child] = link_version
                ready[num_ready] = child
                is_ready[child] = True
                num_ready += 1
    return device_of, used, -1


@numba.njit(cache=True)
def _row_best(node, arrival, free, allowed, candidates, tie, class_device, class_memory, memory,
              used, usable, awake_for, awake):
    """Earliest start of node over its usable devices (inf if none); fills `usable`. With
    `awake`, a device awake for another node counts no earlier than the node's urgent time."""
    num_devices = free.shape[0]
    cls = tie[node]
    pinned = class_device[cls]
    any_candidate = False
    for d in range(num_devices):
        if pinned >= 0:
            usable[d] = d == pinned
        else:
            usable[d] = allowed[node, d] and class_memory[cls] <= memory[d] - used[d]
        any_candidate |= usable[d] and candidates[node, d]
    least = np.inf
    urgent = 0.0
    for d in range(num_devices):
        if any_candidate and not candidates[node, d]:
            usable[d] = False
        if usable[d]:
            least = min(least, max(arrival[node, d], free[d]))
            urgent = max(urgent, max(arrival[node, d], free[d]))
    if awake and least < np.inf:
        least = np.inf
        for d in range(num_devices):
            if usable[d]:
                start = max(arrival[node, d], free[d])
                if awake_for[d] >= 0 and awake_for[d] != node:
                    start = max(start, urgent)
                least = min(least, start)
    return least
