"""The event simulator (tfplaceto.sim): semantics, bounds, memory, traces, errors.

- The numba kernel agrees exactly with a plain-Python reference (below) on random DAGs with
  control edges, zero-cost nodes, zero-byte tensors, streams and exact-tie timings.
- Properties: step time >= lower bound; one device moves nothing and takes the sum of its costs;
  free links never slow a placement when no device is contended (with contention they can: a
  list-scheduling anomaly, pinned by an example); an alternating chain pays every transfer.
- Hand-computed cases: peak memory and OOM, streams, one transfer per destination device,
  zero-byte transfers pay latency, control edges pay nothing.
- Chrome trace and Gantt PNG outputs; typed errors on bad input.
"""

from __future__ import annotations

import heapq
import json
import pathlib
import sys
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tfplaceto importable without an install
    sys.path.insert(0, str(ROOT))

import tfplaceto.costs  # noqa: E402
from tfplaceto import errors  # noqa: E402
from tfplaceto.cluster import Cluster, Device, Link  # noqa: E402
from tfplaceto.costs.cost_profile import CostProfile  # noqa: E402
from tfplaceto.graph.op_graph import OpGraph, make_op_graph  # noqa: E402
from tfplaceto.placement import Placement  # noqa: E402
from tfplaceto.sim import SimResult, Simulator, lower_bound, simulate  # noqa: E402

SETTINGS = settings(derandomize=True, max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
BIG_MEMORY = 1 << 50


def gpu(i: int) -> str:
    return f"/job:localhost/replica:0/task:0/device:GPU:{i}"


def make_cluster(num_devices: int, streams=1, bandwidth: float = 1e3, latency: float = 0.5,
                 memory=BIG_MEMORY) -> Cluster:
    streams = [streams] * num_devices if np.isscalar(streams) else list(streams)
    memory = [memory] * num_devices if np.isscalar(memory) else list(memory)
    devices = [Device(gpu(i), "GPU", int(memory[i]), streams=int(streams[i]))
               for i in range(num_devices)]
    links = [Link(gpu(a), gpu(b), bandwidth, latency)
             for a in range(num_devices) for b in range(num_devices) if a != b]
    return Cluster(devices, links)


def chain(costs_bytes: list[int], output_bytes=None, persistent_bytes=None) -> OpGraph:
    """n0 -> n1 -> ... with tensor i (bytes costs_bytes[i]) from node i to node i + 1."""
    n = len(costs_bytes) + 1
    return make_op_graph([f"n{i}" for i in range(n)], ["Op"] * n, range(n - 1), costs_bytes,
                         range(n - 1), range(1, n), output_bytes=output_bytes,
                         persistent_bytes=persistent_bytes)


# -- a plain-Python reference simulator ------------------------------------------------------------

def reference_simulate(graph: OpGraph, cluster: Cluster, compute: np.ndarray, device_of):
    """The documented semantics, written for clarity: returns (start, end, transfers, peak).

    transfers maps (tensor, dst) -> (src, start, end).
    """
    n_nodes, n_dev = graph.num_ops, cluster.num_devices
    dev = [int(d) for d in device_of]
    producer = [int(p) for p in graph.tensor_producer]
    consumers = defaultdict(list)  # tensor -> consumer nodes
    inputs = defaultdict(list)  # node -> tensors it reads
    for t, c in zip(graph.edge_tensor, graph.edge_consumer):
        consumers[int(t)].append(int(c))
        inputs[int(c)].append(int(t))
    tensors_of = defaultdict(list)
    for t, p in enumerate(producer):
        tensors_of[p].append(t)
    control_succ = defaultdict(list)
    waiting = [len(inputs[i]) for i in range(n_nodes)]
    for s, r in zip(graph.control_senders, graph.control_receivers):
        control_succ[int(s)].append(int(r))
        waiting[int(r)] += 1

    free = [d.streams for d in cluster.devices]
    link_free = {(a, b): True for a in range(n_dev) for b in range(n_dev) if a != b}
    node_queue = [[] for _ in range(n_dev)]  # heaps of (ready time, node)
    link_queue = defaultdict(list)  # heaps of (ready time, tensor, dst)
    running = []  # heap of (end, kind, id)
    start, end = [None] * n_nodes, [None] * n_nodes
    transfers = {}
    memory = [0] * n_dev
    for i in range(n_nodes):
        memory[dev[i]] += int(graph.persistent_bytes[i])
    peak = list(memory)
    # A tensor lives while its producer, a local reader or a send still needs it; the rest of a
    # node's output bytes only while the node runs.
    holders = {t: 1 + sum(1 for c in consumers[t] if dev[c] == dev[producer[t]])
               for t in range(len(producer))}
    made = [sum(int(graph.tensor_bytes[t]) for t in tensors_of[i]) for i in range(n_nodes)]
    scratch = [max(int(graph.output_bytes[i]) - made[i], 0) for i in range(n_nodes)]
    copy_readers = {}

    def allocate(d, nbytes):
        memory[d] += nbytes
        peak[d] = max(peak[d], memory[d])

    def release_tensor(t):
        holders[t] -= 1
        if holders[t] == 0:
            memory[dev[producer[t]]] -= int(graph.tensor_bytes[t])

    def arrive(node, now):
        waiting[node] -= 1
        if waiting[node] == 0:
            heapq.heappush(node_queue[dev[node]], (now, node))

    for i in range(n_nodes):
        if waiting[i] == 0:
            heapq.heappush(node_queue[dev[i]], (0.0, i))
    now = 0.0
    while True:
        for d in range(n_dev):
            while free[d] and node_queue[d]:
                _, i = heapq.heappop(node_queue[d])
                free[d] -= 1
                start[i], end[i] = now, now + compute[i, d]
                allocate(d, scratch[i] + made[i])
                heapq.heappush(running, (end[i], 0, i))
        for (a, b), idle in link_free.items():
            if idle and link_queue[(a, b)]:
                _, t, _ = heapq.heappop(link_queue[(a, b)])
                link_free[(a, b)] = False
                nbytes = int(graph.tensor_bytes[t])
                # A loop body's tensor crosses once per iteration.
                trips = float(graph.tensor_iterations[t])
                finish = now + trips * (cluster.latency[a, b] + nbytes / cluster.bandwidth[a, b])
                transfers[(t, b)] = (a, now, finish)
                allocate(b, nbytes)
                heapq.heappush(running, (finish, 1, (t, b)))
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] == now:
            _, kind, what = heapq.heappop(running)
            if kind == 0:
                i = what
                free[dev[i]] += 1
                for r in control_succ[i]:
                    arrive(r, now)
                for t in tensors_of[i]:
                    remote = set()
                    for c in consumers[t]:
                        if dev[c] == dev[i]:
                            arrive(c, now)
                        else:
                            remote.add(dev[c])
                    for b in remote:
                        holders[t] += 1
                        copy_readers[(t, b)] = sum(1 for c in consumers[t] if dev[c] == b)
                        heapq.heappush(link_queue[(dev[i], b)], (now, t, b))
                for t in inputs[i]:
                    if dev[producer[t]] == dev[i]:
                        release_tensor(t)
                    else:
                        copy_readers[(t, dev[i])] -= 1
                        if copy_readers[(t, dev[i])] == 0:
                            memory[dev[i]] -= int(graph.tensor_bytes[t])
                memory[dev[i]] -= scratch[i]
                for t in tensors_of[i]:
                    release_tensor(t)
            else:
                t, b = what
                link_free[(dev[producer[t]], b)] = True
                release_tensor(t)
                for c in consumers[t]:
                    if dev[c] == b:
                        arrive(c, now)
    return start, end, transfers, peak


# -- random problems ---------------------------------------------------------------------------------

@st.composite
def problems(draw, max_nodes: int = 14, max_devices: int = 4):
    """(graph, cluster, compute, device_of) with exact-in-binary times, so ties really happen."""
    n = draw(st.integers(1, max_nodes))
    tensor_producer, tensor_bytes, edge_tensor, edge_consumer = [], [], [], []
    for node in range(n):
        for _ in range(draw(st.integers(0, 2))):  # tensors this node produces
            tensor_producer.append(node)
            tensor_bytes.append(draw(st.sampled_from([0, 256, 1024, 4096])))
    for t, p in enumerate(tensor_producer):
        later = list(range(p + 1, n))
        if later:
            for c in draw(st.lists(st.sampled_from(later), max_size=3, unique=True)):
                edge_tensor.append(t)
                edge_consumer.append(c)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    control = draw(st.lists(st.sampled_from(pairs), max_size=3, unique=True)) if pairs else []
    graph = make_op_graph(
        [f"op{i}" for i in range(n)], ["Op"] * n, tensor_producer, tensor_bytes, edge_tensor,
        edge_consumer, [a for a, _ in control], [b for _, b in control],
        # Outputs nobody reads, beside the tensors: held only while the node runs.
        output_bytes=np.bincount(np.asarray(tensor_producer, int), tensor_bytes, minlength=n).astype(int)
        + draw(st.lists(st.sampled_from([0, 0, 512]), min_size=n, max_size=n)),
        persistent_bytes=draw(st.lists(st.sampled_from([0, 100, 1000]), min_size=n, max_size=n)),
        tensor_iterations=draw(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=len(tensor_producer),
                                        max_size=len(tensor_producer))))
    num_devices = draw(st.integers(1, max_devices))
    streams = draw(st.lists(st.integers(1, 3), min_size=num_devices, max_size=num_devices))
    cluster = make_cluster(num_devices, streams, bandwidth=draw(st.sampled_from([256.0, 1024.0])),
                           latency=draw(st.sampled_from([0.0, 0.25, 1.0])))
    compute = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
                                     min_size=n * num_devices, max_size=n * num_devices)))
    device_of = np.array(draw(st.lists(st.integers(0, num_devices - 1), min_size=n, max_size=n)),
                         np.int32)
    return graph, cluster, compute.reshape(n, num_devices), device_of


# -- the compiled kernel against the reference -------------------------------------------------------

@SETTINGS
@given(problems())
def test_kernel_matches_reference(problem):
    graph, cluster, compute, device_of = problem
    result = Simulator(graph, cluster, compute).result(device_of)
    start, end, transfers, peak = reference_simulate(graph, cluster, compute, device_of)
    assert result.node_start_s.tolist() == start
    assert result.node_end_s.tolist() == end
    made = {(int(t), int(b)): (int(a), s, e) for t, a, b, s, e in zip(
        result.transfer_tensor, result.transfer_src, result.transfer_dst,
        result.transfer_start_s, result.transfer_end_s)}
    assert made == transfers
    assert [result.peak_memory_bytes[gpu(d)] for d in range(cluster.num_devices)] == peak
    assert result.step_time_s == max(end)
    assert result.transfer_bytes == sum(int(graph.tensor_bytes[t] * graph.tensor_iterations[t])
                                        for t, _ in transfers)


@SETTINGS
@given(problems())
def test_run_run_batch_schedule_batch_and_result_agree(problem):
    graph, cluster, compute, device_of = problem
    sim = Simulator(graph, cluster, compute)
    step, peak, oom = sim.run(device_of)
    result = sim.result(device_of)
    assert step == result.step_time_s
    assert peak.tolist() == list(result.peak_memory_bytes.values())
    assert oom == result.oom
    steps, peaks, ooms = sim.run_batch(np.stack([device_of, np.zeros_like(device_of)]))
    assert steps[0] == step and peaks[0].tolist() == peak.tolist() and ooms[0] == oom
    assert steps[1] == sim.run(np.zeros_like(device_of))[0]
    starts, ends, peaks = sim.schedule_batch(np.stack([device_of, np.zeros_like(device_of)]))
    for row, devices in enumerate((device_of, np.zeros_like(device_of))):
        start, end, peak = sim.schedule(devices)
        assert starts[row].tolist() == start.tolist() and ends[row].tolist() == end.tolist()
        assert peaks[row].tolist() == peak.tolist()


@SETTINGS
@given(problems(), st.data())
def test_the_schedule_of_the_active_nodes_alone_ignores_where_the_others_sit(problem, data):
    # What the RL environment's "visited" schedule rests on: the inactive nodes take no time, and
    # where their rows put them changes nothing; with every node active it is the plain schedule.
    graph, cluster, compute, device_of = problem
    sim = Simulator(graph, cluster, compute)
    n = len(device_of)
    active = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    moved = np.where(active, device_of, (device_of + 1) % cluster.num_devices)
    starts, ends, _ = sim.schedule_batch(np.stack([device_of, moved]), active=active)
    assert starts[0].tolist() == starts[1].tolist() and ends[0].tolist() == ends[1].tolist()
    assert (ends[0] == starts[0])[~active].all()
    plain = sim.schedule_batch(device_of[None])
    every = sim.schedule_batch(device_of[None], active=np.ones(n, bool))
    assert all(a.tolist() == b.tolist() for a, b in zip(plain, every))
    _, nothing, _ = sim.schedule_batch(device_of[None], active=np.zeros(n, bool))
    assert not nothing.any()  # all on one device, no time: nothing waits
    with pytest.raises(errors.InvalidGraphError, match="active"):
        sim.schedule_batch(device_of[None], active=np.ones(n + 1, bool))


# -- properties ----------------------------------------------------------------------------------------

@SETTINGS
@given(problems())
def test_step_time_at_least_lower_bound(problem):
    graph, cluster, compute, device_of = problem
    step = Simulator(graph, cluster, compute).run(device_of)[0]
    assert step >= lower_bound(graph, cluster, compute) - 1e-9


@SETTINGS
@given(problems(), st.integers(0, 3))
def test_single_device_moves_nothing_and_sums_costs(problem, device):
    graph, cluster, compute, _ = problem
    device %= cluster.num_devices
    result = simulate(graph, np.full(graph.num_ops, device, np.int32), cluster, compute)
    total = compute[:, device].sum()
    assert result.transfer_bytes == 0 and result.num_transfers == 0
    # k streams can overlap k ops, so the sum only bounds k x the step time; one stream is serial.
    streams = cluster.devices[device].streams
    assert result.step_time_s * streams >= total - 1e-9 * max(total, 1)
    if streams == 1:
        assert result.step_time_s == pytest.approx(total, rel=1e-12, abs=1e-12)
    assert result.busy_s[gpu(device)] == pytest.approx(total)


@SETTINGS
@given(problems())
def test_free_links_never_slow_an_uncontended_placement(problem):
    # With a stream per node no op ever waits for its device, so the schedule is pure dependency
    # timing, which can only get earlier when transfers get faster.
    graph, cluster, compute, device_of = problem
    n, d = graph.num_ops, cluster.num_devices
    slow = make_cluster(d, streams=n, bandwidth=512.0, latency=0.25)
    free = make_cluster(d, streams=n, bandwidth=1e300, latency=0.0)
    slow_step = Simulator(graph, slow, compute).run(device_of)[0]
    free_step = Simulator(graph, free, compute).run(device_of)[0]
    assert free_step <= slow_step


def test_faster_links_can_lengthen_a_list_schedule():
    # Graham's anomaly: with latency 0, op4's input reaches GPU:1 before op1 is ready, so FIFO
    # runs op4 first and delays the critical chain op0 -> op1 -> op2. The simulator models FIFO
    # list scheduling (as TF's executor does), not an optimal scheduler.
    graph = make_op_graph([f"op{i}" for i in range(5)], ["Op"] * 5, [0, 1, 3], [0, 0, 0],
                          [0, 1, 2], [1, 2, 4])
    compute = np.repeat(np.array([[3.0], [3.0], [3.0], [2.0], [2.0]]), 2, axis=1)
    device_of = np.array([1, 1, 0, 0, 1], np.int32)
    slow = Simulator(graph, make_cluster(2, latency=1.0), compute).run(device_of)[0]
    fast = Simulator(graph, make_cluster(2, latency=0.0), compute).run(device_of)[0]
    assert (slow, fast) == (10.0, 11.0)


@SETTINGS
@given(st.lists(st.sampled_from([0, 100, 1000, 5000]), min_size=1, max_size=12),
       st.lists(st.sampled_from([0.0, 0.5, 1.5]), min_size=13, max_size=13))
def test_alternating_chain_pays_every_transfer(tensor_bytes, costs):
    graph = chain(tensor_bytes)
    n = graph.num_ops
    cluster = make_cluster(2, bandwidth=1000.0, latency=0.125)
    compute = np.repeat(np.array(costs[:n])[:, None], 2, axis=1)
    result = simulate(graph, np.arange(n, dtype=np.int32) % 2, cluster, compute)
    transfer_time = sum(0.125 + b / 1000.0 for b in tensor_bytes)
    assert result.step_time_s == pytest.approx(sum(costs[:n]) + transfer_time)
    assert result.num_transfers == n - 1
    assert result.transfer_bytes == sum(tensor_bytes)


# -- hand-computed cases ---------------------------------------------------------------------------------

def test_peak_memory_of_a_local_chain_and_oom_threshold():
    # a -> b -> c on one device; outputs 100, 200, 300 bytes; a holds 50 persistent bytes.
    # a runs: 50 + 100. b runs: a's output lives until b ends: 50 + 100 + 200 = 350.
    # c runs: a's output freed at b's end (before c starts): 50 + 200 + 300 = 550.
    graph = chain([100, 200], output_bytes=[100, 200, 300], persistent_bytes=[50, 0, 0])
    compute = np.ones((3, 1))
    for memory, oom in ((550, False), (549, True)):
        result = simulate(graph, {"n0": gpu(0), "n1": gpu(0), "n2": gpu(0)},
                          make_cluster(1, memory=memory), compute)
        assert result.peak_memory_bytes == {gpu(0): 550}
        assert result.oom is oom
        assert result.oom_devices == ((gpu(0),) if oom else ())


def test_peak_memory_with_a_transfer():
    # a (GPU:0, output 1000) -> b (GPU:1, output 10): the producer keeps its buffer until the send
    # ends; the copy (1000) lives on GPU:1 from the transfer's start until b ends, with b's output.
    graph = chain([1000], output_bytes=[1000, 10], persistent_bytes=[7, 3])
    cluster = make_cluster(2, bandwidth=1000.0, latency=0.0, memory=[1007, 1012])
    result = simulate(graph, [0, 1], cluster, np.ones((2, 2)))
    assert result.peak_memory_bytes == {gpu(0): 1007, gpu(1): 1013}
    assert result.oom and result.oom_devices == (gpu(1),)
    assert result.transfer_start_s.tolist() == [1.0] and result.transfer_end_s.tolist() == [2.0]
    assert result.node_start_s.tolist() == [0.0, 2.0]


def test_each_tensor_is_freed_after_its_own_last_reader():
    # a makes t0 (1000 bytes, read by b) and t1 (10, read by c); b makes t2 (100, read by c); c
    # makes 500 bytes nobody reads. One device: t0 goes when b ends, so c runs beside t1 and t2
    # only: the peak is b's 1000 + 10 + 100, not a's whole 1010 held until c (1610).
    graph = make_op_graph(["a", "b", "c"], ["Op"] * 3, [0, 0, 1], [1000, 10, 100], [0, 1, 2], [1, 2, 2],
                          output_bytes=[1010, 100, 500])
    result = simulate(graph, [0, 0, 0], make_cluster(1), np.ones((3, 1)))
    assert result.peak_memory_bytes[gpu(0)] == 1110
    # On two devices, t1 is sent to c's device when a ends and freed on a's when the send ends.
    cluster = make_cluster(2, bandwidth=1000.0, latency=0.0)
    result = simulate(graph, [0, 0, 1], cluster, np.ones((3, 2)))
    assert result.peak_memory_bytes == {gpu(0): 1110, gpu(1): 10 + 100 + 500}


def test_frees_happen_before_allocations_at_the_same_instant():
    # w -> u (data), u -> v (control), one device: w's output (300) is freed when u ends, the
    # instant v starts and allocates its own 300, so the two are never counted together.
    graph = make_op_graph(["w", "u", "v"], ["Op"] * 3, [0], [300], [0], [1], [1], [2],
                          output_bytes=[300, 0, 300])
    result = simulate(graph, [0, 0, 0], make_cluster(1), np.ones((3, 1)))
    assert result.node_start_s.tolist() == [0.0, 1.0, 2.0]
    assert result.peak_memory_bytes[gpu(0)] == 300


def test_k_streams_run_k_independent_ops_at_once():
    graph = make_op_graph([f"op{i}" for i in range(7)], ["Op"] * 7, [], [], [], [])
    compute = np.ones((7, 1))
    for streams, expected in ((1, 7.0), (3, 3.0), (7, 1.0), (8, 1.0)):
        result = simulate(graph, [0] * 7, make_cluster(1, streams=streams), compute)
        assert result.step_time_s == expected
        assert result.busy_s[gpu(0)] == 7.0  # work, not wall time
    result = simulate(graph, [0] * 7, make_cluster(1, streams=3), compute)
    assert result.node_start_s.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0]


def test_one_transfer_per_destination_device():
    # One tensor read by two ops on GPU:1 and one on GPU:2: two transfers, not three.
    graph = make_op_graph(["src", "a", "b", "c"], ["Op"] * 4, [0], [1000], [0, 0, 0], [1, 2, 3])
    cluster = make_cluster(3, bandwidth=1000.0, latency=0.0)
    result = simulate(graph, [0, 1, 1, 2], cluster, np.ones((4, 3)))
    assert result.num_transfers == 2 and result.transfer_bytes == 2000
    assert sorted(result.transfer_dst.tolist()) == [1, 2]
    # Both readers on GPU:1 wait for the single copy (1 + 1 s), then run one after the other.
    assert result.node_start_s.tolist() == [0.0, 2.0, 3.0, 2.0]


def test_zero_byte_transfers_pay_latency_and_control_edges_pay_nothing():
    data = make_op_graph(["a", "b"], ["Op"] * 2, [0], [0], [0], [1])
    control = make_op_graph(["a", "b"], ["Op"] * 2, [], [], [], [], [0], [1])
    cluster = make_cluster(2, bandwidth=1000.0, latency=0.25)
    assert simulate(data, [0, 1], cluster, np.ones((2, 2))).step_time_s == 2.25
    result = simulate(control, [0, 1], cluster, np.ones((2, 2)))
    assert result.step_time_s == 2.0 and result.num_transfers == 0


def test_link_carries_one_transfer_at_a_time_in_ready_order():
    # a and b on GPU:0 each send 1000 bytes (1 s) to c on GPU:1: the second transfer waits.
    graph = make_op_graph(["a", "b", "c"], ["Op"] * 3, [0, 1], [1000, 1000], [0, 1], [2, 2])
    cluster = make_cluster(2, streams=2, bandwidth=1000.0, latency=0.0)
    result = simulate(graph, [0, 0, 1], cluster, np.ones((3, 2)))
    assert result.transfer_start_s.tolist() == [1.0, 2.0]
    assert result.transfer_tensor.tolist() == [0, 1]
    assert result.step_time_s == 4.0


def test_lower_bound_hand_cases():
    # Four independent unit ops on two identical devices: work bound 2; a chain: its length.
    independent = make_op_graph([f"op{i}" for i in range(4)], ["Op"] * 4, [], [], [], [])
    assert lower_bound(independent, make_cluster(2), np.ones((4, 2))) == 2.0
    assert lower_bound(chain([1, 1, 1]), make_cluster(2), np.ones((4, 2))) == 4.0
    # A device 4x slower at every op counts a quarter: 4 / 1.25 = 3.2.
    assert lower_bound(independent, make_cluster(2), np.array([[1.0, 4.0]] * 4)) == 3.2
    # Streams add capacity.
    assert lower_bound(independent, make_cluster(1, streams=4), np.ones((4, 1))) == 1.0


# -- inputs and errors -------------------------------------------------------------------------------

def test_accepts_placements_costs_and_cluster_names():
    graph = chain([1000, 1000])
    cluster = Cluster.preset("2xV100")
    names = cluster.device_names
    compute = np.full((3, cluster.num_devices), 1e-3)
    as_dict = {"n0": names[0], "n1": names[1], "n2": names[0]}
    expected = simulate(graph, np.array([0, 1, 0]), cluster, compute)
    for placement in (as_dict, Placement(as_dict), [0, 1, 0], np.array([0, 1, 0], np.int64),
                      [names[0], names[1], names[0]]):
        result = simulate(graph, placement, "2xV100", compute)
        assert result.step_time_s == expected.step_time_s
    profile = CostProfile(graph.names, cluster.kinds, np.full((3, len(cluster.kinds)), 1e-3))
    assert simulate(graph, as_dict, cluster, profile).step_time_s == expected.step_time_s
    assert isinstance(expected, SimResult) and expected.transfer_bytes == 2000
    with pytest.raises(AttributeError):  # frozen
        expected.step_time_s = 0.0


def test_bad_inputs_raise_typed_errors(monkeypatch):
    graph = chain([10])
    cluster = make_cluster(2)
    compute = np.ones((2, 2))
    with pytest.raises(errors.InvalidClusterError):
        simulate(graph, {"n0": gpu(0), "n1": gpu(5)}, cluster, compute)
    with pytest.raises(errors.InvalidGraphError):
        simulate(graph, {"n0": gpu(0)}, cluster, compute)
    with pytest.raises(errors.InvalidClusterError):
        simulate(graph, [0, 2], cluster, compute)
    with pytest.raises(errors.InvalidClusterError):
        Simulator(graph, cluster, compute).run(np.array([0, -1]))
    with pytest.raises(errors.InvalidGraphError):
        Simulator(graph, cluster, compute).run(np.array([0, 1, 1]))
    with pytest.raises(errors.InvalidGraphError):
        simulate(graph, [0.0, 1.0], cluster, compute)
    with pytest.raises(errors.CostProfileError):
        simulate(graph, [0, 1], cluster, np.ones((2, 3)))
    with pytest.raises(errors.CostProfileError):
        simulate(graph, [0, 1], cluster, np.array([[1.0, np.nan], [1.0, 1.0]]))
    with pytest.raises(errors.CostProfileError):
        simulate(graph, [0, 1], cluster, -compute)
    with pytest.raises(errors.CostProfileError, match="no GraphDef"):  # the analytical profile needs one
        simulate(graph, [0, 1], cluster)
    with pytest.raises(errors.CostProfileError):
        lower_bound(graph, cluster)


def test_default_costs_come_from_the_analytical_profile(monkeypatch):
    graph = chain([10])
    cluster = make_cluster(2)
    calls = []

    def fake_profile(op_graph, cluster_, source):
        calls.append(source)
        return CostProfile(op_graph.names, cluster_.kinds, np.full((2, len(cluster_.kinds)), 0.5))

    monkeypatch.setattr(tfplaceto.costs, "profile", fake_profile)
    assert simulate(graph, [0, 0], cluster).step_time_s == 1.0
    assert lower_bound(graph, cluster) == 1.0
    assert calls == ["analytical", "analytical"]


def test_empty_graph():
    graph = make_op_graph([], [], [], [], [], [])
    cluster = make_cluster(1)
    result = simulate(graph, [], cluster, np.zeros((0, 1)))
    assert result.step_time_s == 0.0 and not result.oom and result.num_transfers == 0
    assert lower_bound(graph, cluster, np.zeros((0, 1))) == 0.0


# -- traces ----------------------------------------------------------------------------------------------

def _traced_result() -> SimResult:
    graph = make_op_graph(["src", "a", "b", "c"], ["Const", "MatMul", "Relu", "Add"],
                          [0, 1], [1000, 500], [0, 0, 1], [1, 2, 3])
    return simulate(graph, [0, 1, 1, 2], make_cluster(4, bandwidth=1000.0, latency=0.01),
                    np.full((4, 4), 0.5))


def test_chrome_trace_has_a_track_per_device_and_used_link(tmp_path):
    result = _traced_result()
    path = tmp_path / "trace.json"
    result.save_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert len(result.used_links) == 2  # GPU:0 -> GPU:1 and GPU:1 -> GPU:2; GPU:3 idle
    assert len(names) == 4 + 2
    assert names[4].startswith("link GPU:0 -> GPU:1") and names[0].startswith("GPU:0")
    ops = [e for e in events if e.get("cat") == "op"]
    assert {e["args"]["op"]: e["args"]["type"] for e in ops} == {
        "src": "Const", "a": "MatMul", "b": "Relu", "c": "Add"}
    sends = [e for e in events if e.get("cat") == "transfer"]
    assert sorted(e["tid"] for e in sends) == [4, 5]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in ops + sends)
    assert trace["otherData"]["step_time_s"] == result.step_time_s
    assert not list(tmp_path.glob(".tmp-*"))  # written atomically, no leftovers


def test_gantt_png_is_written(tmp_path):
    path = tmp_path / "gantt.png"
    _traced_result().plot_gantt(path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_gantt_handles_thousands_of_ops(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    producers = np.arange(n - 1)
    graph = make_op_graph([f"layer{i // 50}/op{i}" for i in range(n)], ["Op"] * n, producers,
                          np.full(n - 1, 100), np.arange(n - 1), rng.integers(producers + 1, n),
                          colocation=np.arange(n) // 50)
    cluster = make_cluster(4, memory=10**4)
    result = simulate(graph, rng.integers(0, 4, n), cluster, rng.uniform(0, 1e-3, (n, 4)))
    path = tmp_path / "big.png"
    result.plot_gantt(path, color_by="node")
    assert path.read_bytes().startswith(b"\x89PNG") and result.oom
