"""The compiled hot loop: list scheduling of one step over a `SimGraph`, given a device per node.

Everything here is `numba.njit(cache=True)` over flat arrays (no Python objects), so one
evaluation of a few hundred nodes costs tens of microseconds. `simulate_schedule` returns the full
schedule (for SimResult and traces); `simulate_step` only the step time and peaks (the RL loop);
`simulate_batch` evaluates many placements in one call (local search, batched rollouts);
`simulate_schedules` the start, end and peaks of many (the RL environment's lanes).

Semantics (the contract `tests/test_sim.py` checks against a plain-Python reference):
- Time advances from event to event. At an instant t, every completion at t is processed first
  (freeing devices, links and memory, making nodes and transfers ready), then every free device
  and link starts work. A zero-duration node started at t completes at t in a following round.
- A device runs up to `streams[d]` nodes at once; a node takes compute[n, d] whatever else runs.
  Ready nodes wait in a per-device queue ordered by (time they became ready, node index).
- A tensor read on another device is sent once per destination device when its producer ends,
  over link (src, dst): latency + bytes / bandwidth, zero-byte tensors included (a Send/Recv pair
  still costs a round of the runtime). A link carries one transfer at a time, latency included,
  queued by (time ready, tensor index). Control edges only order nodes: no bytes, no latency,
  except on a link with control_hop[src, dst] > 0 (a calibrated cluster): there the runtime sends
  a tiny tensor for them, so when a node ends, one control hop per other device holding control
  successors of it is queued on that link like a transfer (queued by (time ready, number of
  tensors + node index)), holds it control_hop[src, dst] seconds and moves no bytes; its
  successors there become ready when it ends. Hops are listed with tensor -1 - sender.
- Sends that wait for an idle source (wait_idle[src, dst], a calibrated cluster whose task
  serves its peers' tensor requests on its one inter-op thread): a transfer or control hop on
  such a link starts only at an instant when src runs no node and has none queued, after src's
  own dispatch at that instant (so a node ready at t goes first). All False: links start
  transfers whenever they are free, as before.
- Loops: compute[n, d] already holds all iterations of a loop-body node (costs are per step);
  a tensor moved every iteration (tensor_trips[t] > 1, a split loop body) is one transfer item
  taking tensor_trips[t] x (latency + bytes / bandwidth) and holding one iteration's bytes on
  the destination. So a loop's iterations are sequential on its nodes and links, while
  independent loops and ops overlap as any nodes do.
- Memory per device: persistent bytes of its nodes all step; each tensor a node makes
  (tensor_bytes) from the node's start until its end, the tensor's last local consumer's end and
  its last outgoing transfer's end, whichever is latest (a Send reads the producer's buffer); its
  scratch_bytes (the rest of its output bytes: outputs nobody reads; in a grouped graph, the
  largest output made inside the group; `OpGraph.scratch_bytes`) from its start until its end;
  a received copy (tensor_bytes) from the transfer's start until its last consumer on the
  destination ends. Frees at t happen before allocations at t.
- Contention (off when `group_slow` is empty): devices with the same `group_of[d] >= 0` share
  what computing needs. While k devices of group g are busy (a device is busy while it runs at
  least one node), each of their nodes progresses at 1 / (1 + (k - 1) * group_slow[g]) solo
  seconds per second; when k changes, every running node of the group keeps the work it has
  done and its end is recomputed at the new rate (processor sharing). Transfers are not slowed.
"""

from __future__ import annotations

import numba
import numpy as np

_NONE = -1


@numba.njit(cache=True)
def simulate_schedule(device_of, compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr, prod_tensors,
                      tensor_ptr, tensor_cons, tensor_cpos, cons_ptr, input_tensor, input_producer,
                      ctrl_ptr, ctrl_succ, indegree, scratch_bytes, persistent_bytes, streams,
                      bandwidth, latency, control_hop, wait_idle, group_of, group_slow):
    """Simulates one step; returns (node_start, node_end, transfer arrays, peak, ok).

    Transfer arrays are (tensor, src, dst, start, end) trimmed to the transfers made. `ok` is False
    only if some node never ran, which cannot happen on a DAG (the caller checks it anyway).

    Work items are nodes (ids 0..N-1) and transfers (ids N + r, created on demand, at most one
    per (tensor, destination) or (control sender, destination), so r < E + C). Queues are devices (0..D-1) and directed links
    (D + src * D + dst). The heap and the queues are written inline on purpose: a numba call
    that takes arrays increfs and decrefs each of them atomically, and with helper functions
    that refcounting was half of the run time.
    """
    n_nodes = device_of.shape[0]
    n_devices = streams.shape[0]
    n_edges = input_tensor.shape[0] + ctrl_succ.shape[0]  # transfers: data and control hops
    n_tensors = tensor_producer.shape[0]
    any_wait = False
    for src in range(n_devices):
        for dst in range(n_devices):
            any_wait = any_wait or wait_idle[src, dst]
    n_queues = n_devices + n_devices * n_devices
    n_items = n_nodes + n_edges

    node_start = np.full(n_nodes, -1.0)
    node_end = np.full(n_nodes, -1.0)
    pending = indegree.copy()
    # Each tensor's buffer lives while a local consumer edge or an outgoing transfer of it is
    # left; a node's scratch_bytes only while it runs.
    local_left = np.zeros(n_tensors, np.int32)
    sends_left = np.zeros(n_tensors, np.int32)
    for n in range(n_nodes):
        for k in range(cons_ptr[n], cons_ptr[n + 1]):
            if device_of[input_producer[k]] == device_of[n]:
                local_left[input_tensor[k]] += 1

    # Transfer r is item n_nodes + r.
    tr_tensor = np.empty(n_edges, np.int64)
    tr_src = np.empty(n_edges, np.int64)
    tr_dst = np.empty(n_edges, np.int64)
    tr_start = np.empty(n_edges)
    tr_end = np.empty(n_edges)
    tr_left = np.empty(n_edges, np.int32)  # consumer edges on the destination yet to finish
    input_tr = np.empty(n_edges, np.int64)  # transfer bringing input k, set before it is read
    n_tr = 0
    tr_for_dst = np.full(n_devices, _NONE, np.int64)

    # Every item waits in one queue, sorted by (ready time, tie): node index, or tensor index.
    item_ready = np.zeros(n_items)
    item_tie = np.empty(n_items, np.int64)
    item_queue = np.empty(n_items, np.int64)
    for n in range(n_nodes):
        item_tie[n] = n
        item_queue[n] = device_of[n]
    q_head = np.full(n_queues, _NONE, np.int64)
    q_tail = np.full(n_queues, _NONE, np.int64)
    q_next = np.empty(n_items, np.int64)
    q_prev = np.empty(n_items, np.int64)
    slots = np.ones(n_queues, np.int64)  # free streams of a device, 1 for an idle link
    for d in range(n_devices):
        slots[d] = streams[d]
    dirty = np.zeros(n_queues, np.bool_)  # queues whose items or slots changed since dispatch
    dirty_list = np.empty(n_queues, np.int64)
    n_dirty = 0
    new_items = np.empty(n_items, np.int64)  # became ready at `now`, not yet queued
    n_new = 0

    # Running items, keyed (end time, item): at most one per stream and per link.
    capacity = n_queues + 1
    for d in range(n_devices):
        capacity += streams[d]
    h_time = np.empty(capacity)
    h_id = np.empty(capacity, np.int64)
    h_size = 0

    # Contention: busy devices per group, and per running node the solo seconds of work left at
    # `node_mark` and the rate it progresses at since then.
    n_groups = group_slow.shape[0]
    dev_running = np.zeros(n_devices, np.int64)
    group_busy = np.zeros(n_groups + 1, np.int64)
    rerate = np.zeros(n_groups + 1, np.bool_)
    node_left = np.zeros(n_nodes)
    node_mark = np.zeros(n_nodes)
    node_rate = np.ones(n_nodes)

    memory = np.zeros(n_devices, np.int64)
    for n in range(n_nodes):
        memory[device_of[n]] += persistent_bytes[n]
    peak = memory.copy()

    for n in range(n_nodes):
        if pending[n] == 0:
            new_items[n_new] = n
            n_new += 1

    now = 0.0
    while True:
        # 1. Queue the items that became ready at `now`.
        for k in range(n_new):
            item = new_items[k]
            queue = item_queue[item]
            ready = item_ready[item]
            tie = item_tie[item]
            # Items arrive in nondecreasing ready time: the walk back passes only items ready at
            # the same instant with a larger tie key, so it is O(1) in practice.
            after = q_tail[queue]
            while after != _NONE and (item_ready[after] > ready
                                      or (item_ready[after] == ready and item_tie[after] > tie)):
                after = q_prev[after]
            if after == _NONE:
                following = q_head[queue]
                q_head[queue] = item
            else:
                following = q_next[after]
                q_next[after] = item
            q_prev[item] = after
            q_next[item] = following
            if following == _NONE:
                q_tail[queue] = item
            else:
                q_prev[following] = item
            if not dirty[queue]:
                dirty[queue] = True
                dirty_list[n_dirty] = queue
                n_dirty += 1
        n_new = 0

        # 2. Start whatever can start at `now` on the queues that changed. With sends that wait
        # for an idle source: devices first, then links, so a link sees its source's new state
        # (otherwise one pass: a device and a link never compete for anything).
        for phase in range(2 if any_wait else 1):
            if phase == 1 and any_wait:
                # Sources that went idle release the transfers waiting for them.
                for src in range(n_devices):
                    if slots[src] != streams[src] or q_head[src] != _NONE:
                        continue
                    for dst in range(n_devices):
                        queue = n_devices + src * n_devices + dst
                        if wait_idle[src, dst] and q_head[queue] != _NONE and not dirty[queue]:
                            dirty[queue] = True
                            dirty_list[n_dirty] = queue
                            n_dirty += 1
            for k in range(n_dirty):
                queue = dirty_list[k]
                if any_wait and (queue < n_devices) != (phase == 0):
                    continue
                dirty[queue] = False
                if queue >= n_devices and any_wait:
                    src = (queue - n_devices) // n_devices
                    if wait_idle[src, (queue - n_devices) % n_devices] and (
                            slots[src] != streams[src] or q_head[src] != _NONE):
                        continue  # released when src goes idle
                while slots[queue] > 0 and q_head[queue] != _NONE:
                    item = q_head[queue]
                    following = q_next[item]
                    q_head[queue] = following
                    if following == _NONE:
                        q_tail[queue] = _NONE
                    else:
                        q_prev[following] = _NONE
                    slots[queue] -= 1
                    if item < n_nodes:
                        d = device_of[item]
                        end = now + compute[item, d]
                        g = group_of[d] if n_groups > 0 else _NONE
                        if g != _NONE:
                            if dev_running[d] == 0:
                                group_busy[g] += 1
                                rerate[g] = True
                            dev_running[d] += 1
                            rate = 1.0 / (1.0 + (group_busy[g] - 1) * group_slow[g])
                            node_left[item] = compute[item, d]
                            node_mark[item] = now
                            node_rate[item] = rate
                            end = now + compute[item, d] / rate
                        node_start[item] = now
                        node_end[item] = end
                        memory[d] += scratch_bytes[item]
                        for k in range(prod_ptr[item], prod_ptr[item + 1]):
                            memory[d] += tensor_bytes[prod_tensors[k]]
                        if memory[d] > peak[d]:
                            peak[d] = memory[d]
                    else:
                        r = item - n_nodes
                        src = tr_src[r]
                        dst = tr_dst[r]
                        if tr_tensor[r] < 0:  # a control hop: no bytes
                            end = now + control_hop[src, dst]
                        else:
                            nbytes = tensor_bytes[tr_tensor[r]]
                            end = now + tensor_trips[tr_tensor[r]] * (latency[src, dst]
                                                                      + nbytes / bandwidth[src, dst])
                            memory[dst] += nbytes
                            if memory[dst] > peak[dst]:
                                peak[dst] = memory[dst]
                        tr_start[r] = now
                        tr_end[r] = end
                    _sift_up(h_time, h_id, h_size, end, item)  # push (end, item)
                    h_size += 1
        n_dirty = 0
        if n_groups > 0:
            _rerate(now, rerate, group_busy, group_slow, group_of, device_of, n_nodes, h_time, h_id,
                    h_size, node_left, node_mark, node_rate, node_end)

        if h_size == 0:
            break
        # 3. Complete everything that ends at the next instant before starting anything new.
        now = h_time[0]
        while h_size > 0 and h_time[0] == now:
            item = h_id[0]
            # Pop: move the last entry to the root and sift it down.
            h_size -= 1
            _sift_down(h_time, h_id, h_size, 0, h_time[h_size], h_id[h_size])

            queue = item_queue[item]
            slots[queue] += 1
            if not dirty[queue]:
                dirty[queue] = True
                dirty_list[n_dirty] = queue
                n_dirty += 1
            if item < n_nodes:
                n = item
                d = device_of[n]
                if n_groups > 0 and group_of[d] != _NONE:
                    node_end[n] = now
                    dev_running[d] -= 1
                    if dev_running[d] == 0:
                        group_busy[group_of[d]] -= 1
                        rerate[group_of[d]] = True
                        _rerate(now, rerate, group_busy, group_slow, group_of, device_of, n_nodes,
                                h_time, h_id, h_size, node_left, node_mark, node_rate, node_end)
                for k in range(ctrl_ptr[n], ctrl_ptr[n + 1]):
                    c = ctrl_succ[k]
                    dc = device_of[c]
                    if dc == d or control_hop[d, dc] <= 0.0:
                        pending[c] -= 1
                        if pending[c] == 0:
                            item_ready[c] = now
                            new_items[n_new] = c
                            n_new += 1
                    elif tr_for_dst[dc] == _NONE:  # one hop per destination device
                        r = n_tr
                        n_tr += 1
                        tr_for_dst[dc] = r
                        tr_tensor[r] = -1 - n
                        tr_src[r] = d
                        tr_dst[r] = dc
                        item_ready[n_nodes + r] = now
                        item_tie[n_nodes + r] = n_tensors + n
                        item_queue[n_nodes + r] = n_devices + d * n_devices + dc
                        new_items[n_new] = n_nodes + r
                        n_new += 1
                for k in range(ctrl_ptr[n], ctrl_ptr[n + 1]):
                    tr_for_dst[device_of[ctrl_succ[k]]] = _NONE
                for k in range(prod_ptr[n], prod_ptr[n + 1]):
                    t = prod_tensors[k]
                    for j in range(tensor_ptr[t], tensor_ptr[t + 1]):
                        c = tensor_cons[j]
                        dc = device_of[c]
                        if dc == d:
                            pending[c] -= 1
                            if pending[c] == 0:
                                item_ready[c] = now
                                new_items[n_new] = c
                                n_new += 1
                            continue
                        r = tr_for_dst[dc]
                        if r == _NONE:
                            r = n_tr
                            n_tr += 1
                            tr_for_dst[dc] = r
                            tr_tensor[r] = t
                            tr_src[r] = d
                            tr_dst[r] = dc
                            tr_left[r] = 0
                            sends_left[t] += 1
                            item_ready[n_nodes + r] = now
                            item_tie[n_nodes + r] = t
                            item_queue[n_nodes + r] = n_devices + d * n_devices + dc
                            new_items[n_new] = n_nodes + r
                            n_new += 1
                        input_tr[tensor_cpos[j]] = r
                        tr_left[r] += 1
                    for j in range(tensor_ptr[t], tensor_ptr[t + 1]):
                        tr_for_dst[device_of[tensor_cons[j]]] = _NONE
                # Inputs this node was the last local reader of can go.
                for k in range(cons_ptr[n], cons_ptr[n + 1]):
                    t = input_tensor[k]
                    if device_of[input_producer[k]] == d:
                        local_left[t] -= 1
                        if local_left[t] == 0 and sends_left[t] == 0:
                            memory[d] -= tensor_bytes[t]
                    else:
                        r = input_tr[k]
                        tr_left[r] -= 1
                        if tr_left[r] == 0:
                            memory[d] -= tensor_bytes[t]
                memory[d] -= scratch_bytes[n]
                for k in range(prod_ptr[n], prod_ptr[n + 1]):
                    t = prod_tensors[k]
                    if local_left[t] == 0 and sends_left[t] == 0:
                        memory[d] -= tensor_bytes[t]
            elif tr_tensor[item - n_nodes] < 0:  # a control hop arrived
                r = item - n_nodes
                sender = -1 - tr_tensor[r]
                for k in range(ctrl_ptr[sender], ctrl_ptr[sender + 1]):
                    c = ctrl_succ[k]
                    if device_of[c] == tr_dst[r]:
                        pending[c] -= 1
                        if pending[c] == 0:
                            item_ready[c] = now
                            new_items[n_new] = c
                            n_new += 1
            else:
                r = item - n_nodes
                src = tr_src[r]
                dst = tr_dst[r]
                t = tr_tensor[r]
                sends_left[t] -= 1
                if sends_left[t] == 0 and local_left[t] == 0:
                    memory[src] -= tensor_bytes[t]
                for j in range(tensor_ptr[t], tensor_ptr[t + 1]):
                    c = tensor_cons[j]
                    if device_of[c] == dst:
                        pending[c] -= 1
                        if pending[c] == 0:
                            item_ready[c] = now
                            new_items[n_new] = c
                            n_new += 1

    ok = True
    for n in range(n_nodes):
        if node_start[n] < 0.0:
            ok = False
    return (node_start, node_end, tr_tensor[:n_tr].copy(), tr_src[:n_tr].copy(),
            tr_dst[:n_tr].copy(), tr_start[:n_tr].copy(), tr_end[:n_tr].copy(), peak, ok)


@numba.njit(cache=True)
def _rerate(now, rerate, group_busy, group_slow, group_of, device_of, n_nodes, h_time, h_id, h_size,
            node_left, node_mark, node_rate, node_end):
    """New end times for the running nodes of the groups flagged in `rerate`, then re-heapify.

    A node keeps the work it did at its old rate; the rest takes left / new rate. Nodes due at
    `now` are left as they are (they complete in this round). Only called with contention on.
    """
    changed = False
    for i in range(h_size):
        item = h_id[i]
        if item >= n_nodes or h_time[i] <= now:
            continue
        g = group_of[device_of[item]]
        if g < 0 or not rerate[g]:
            continue
        rate = 1.0 / (1.0 + (max(group_busy[g], 1) - 1) * group_slow[g])
        if rate == node_rate[item]:
            continue
        left = node_left[item] - (now - node_mark[item]) * node_rate[item]
        if left < 0.0:
            left = 0.0
        node_left[item] = left
        node_mark[item] = now
        node_rate[item] = rate
        h_time[i] = now + left / rate
        node_end[item] = h_time[i]
        changed = True
    rerate[:] = False
    if not changed:
        return
    # Heapify (keys (time, item)); the heap holds at most one entry per stream and link.
    for root in range(h_size // 2 - 1, -1, -1):
        _sift_down(h_time, h_id, h_size, root, h_time[root], h_id[root])


# The heap of running items, keyed (end time, item): helpers inlined into their callers at
# numba's IR level (`inline="always"`), so the hot loop makes no call and no reference counting
# of the arrays (see simulate_schedule).
@numba.njit(inline="always")
def _earlier(time_a, id_a, time_b, id_b):
    """Whether heap key (time_a, id_a) comes before (time_b, id_b)."""
    return time_a < time_b or (time_a == time_b and id_a < id_b)


@numba.njit(inline="always")
def _sift_up(h_time, h_id, i, time, ident):
    """Puts the entry (time, ident) at the free slot i (the heap's end) and sifts it up."""
    while i > 0 and _earlier(time, ident, h_time[(i - 1) >> 1], h_id[(i - 1) >> 1]):
        parent = (i - 1) >> 1
        h_time[i] = h_time[parent]
        h_id[i] = h_id[parent]
        i = parent
    h_time[i] = time
    h_id[i] = ident


@numba.njit(inline="always")
def _sift_down(h_time, h_id, h_size, i, time, ident):
    """Puts the entry (time, ident) at slot i of the heap h_time/h_id[:h_size] and sifts it down."""
    while True:
        child = 2 * i + 1
        if child >= h_size:
            break
        if child + 1 < h_size and _earlier(h_time[child + 1], h_id[child + 1], h_time[child], h_id[child]):
            child += 1
        if _earlier(time, ident, h_time[child], h_id[child]):
            break
        h_time[i] = h_time[child]
        h_id[i] = h_id[child]
        i = child
    h_time[i] = time
    h_id[i] = ident


@numba.njit(cache=True)
def simulate_step(device_of, compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr, prod_tensors,
                  tensor_ptr, tensor_cons, tensor_cpos, cons_ptr, input_tensor, input_producer,
                  ctrl_ptr, ctrl_succ, indegree, scratch_bytes, persistent_bytes, streams,
                  bandwidth, latency, control_hop, wait_idle, group_of, group_slow):
    """(step time, peak bytes per device, ok) without boxing the schedule arrays."""
    schedule = simulate_schedule(device_of, compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr,
                                 prod_tensors, tensor_ptr, tensor_cons, tensor_cpos, cons_ptr,
                                 input_tensor, input_producer, ctrl_ptr, ctrl_succ, indegree, scratch_bytes,
                                 persistent_bytes, streams, bandwidth, latency, control_hop, wait_idle,
                                 group_of, group_slow)
    node_end = schedule[1]
    step = 0.0
    for n in range(node_end.shape[0]):
        if node_end[n] > step:
            step = node_end[n]
    return step, schedule[7], schedule[8]


@numba.njit(cache=True)
def simulate_batch(devices, compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr, prod_tensors,
                   tensor_ptr, tensor_cons, tensor_cpos, cons_ptr, input_tensor, input_producer,
                   ctrl_ptr, ctrl_succ, indegree, scratch_bytes, persistent_bytes, streams,
                   bandwidth, latency, control_hop, wait_idle, group_of, group_slow):
    """simulate_step for each row of devices (B, N): (step times (B,), peaks (B, D), all ok)."""
    n_batch = devices.shape[0]
    steps = np.empty(n_batch)
    peaks = np.empty((n_batch, streams.shape[0]), np.int64)
    all_ok = True
    for b in range(n_batch):
        step, peak, ok = simulate_step(devices[b], compute, tensor_producer, tensor_bytes,
                                       tensor_trips, prod_ptr, prod_tensors, tensor_ptr, tensor_cons,
                                       tensor_cpos, cons_ptr, input_tensor, input_producer, ctrl_ptr,
                                       ctrl_succ, indegree, scratch_bytes, persistent_bytes, streams,
                                       bandwidth, latency, control_hop, wait_idle, group_of, group_slow)
        steps[b] = step
        peaks[b] = peak
        all_ok = all_ok and ok
    return steps, peaks, all_ok


@numba.njit(cache=True)
def simulate_schedules(devices, compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr, prod_tensors,
                       tensor_ptr, tensor_cons, tensor_cpos, cons_ptr, input_tensor, input_producer,
                       ctrl_ptr, ctrl_succ, indegree, scratch_bytes, persistent_bytes, streams,
                       bandwidth, latency, control_hop, wait_idle, group_of, group_slow):
    """simulate_schedule for each row of devices (B, N): (node starts (B, N), node ends (B, N),
    peaks (B, D), all ok), in one call (the arguments are unboxed once, not once per row)."""
    n_batch, n_nodes = devices.shape
    starts = np.empty((n_batch, n_nodes))
    ends = np.empty((n_batch, n_nodes))
    peaks = np.empty((n_batch, streams.shape[0]), np.int64)
    all_ok = True
    for b in range(n_batch):
        schedule = simulate_schedule(devices[b], compute, tensor_producer, tensor_bytes, tensor_trips, prod_ptr,
                                     prod_tensors, tensor_ptr, tensor_cons, tensor_cpos, cons_ptr,
                                     input_tensor, input_producer, ctrl_ptr, ctrl_succ, indegree, scratch_bytes,
                                     persistent_bytes, streams, bandwidth, latency, control_hop, wait_idle,
                                     group_of, group_slow)
        starts[b] = schedule[0]
        ends[b] = schedule[1]
        peaks[b] = schedule[7]
        all_ok = all_ok and schedule[8]
    return starts, ends, peaks, all_ok
