"""Loop frames of a lowered TensorFlow graph and how many times each one iterates per step.

A Keras LSTM or GRU (unless `unroll=True`), `tf.while_loop` and `tf.map_fn` become TF1 control
flow after lowering: Enter / Merge / Switch / NextIteration / Exit / LoopCond ops around a loop
body. The body's ops run once per iteration, its cross-device tensors move once per iteration,
and the accumulators kept for the gradient (TensorLists) grow by one element per iteration. An
OpGraph drops the NextIteration back edges, so without this module a loop body is costed as if
it ran once.

Map of the file:
  LoopFrame        one frame: name (TF's `frame_name`), parent frame, trips, where trips came from.
  LoopInfo         the result: frames, the frame of every op, op and tensor execution counts.
  analyze_loops    tf.Graph ops -> LoopInfo (frames, trip counts, warnings for assumed trips).
  _frames          TensorFlow's frame assignment (ControlFlowInfo): Enter's outputs live in the
                   child frame named by its `frame_name`, Exit's in the parent frame.
  _cond_trips      trips from the loop condition: `counter < bound` (LogicalAnd: the least),
                   counter = a loop variable stepped by a constant, bound = a loop invariant
                   whose value is static or is another loop's final counter (a gradient loop
                   runs as many times as its forward loop).
  _list_trips      else the length of the TensorList the body reads (TensorListFromTensor's
                   leading dimension, TensorListReserve's num_elements).

Beside it: `static_values.py` (the integer values and TensorList facts a trip count is read
from) and `loop_shapes.py` (the shapes of a loop body written into the GraphDef before import).

Trip counts are per execution of the frame: a nested loop's ops run (outer trips x inner trips)
times per step, which is what `LoopInfo.op_iterations` holds.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.graph.static_values import static_value, through_identities

# Trips assumed for a loop whose count is not known statically and not given by the user.
DEFAULT_LOOP_ITERATIONS = 10
ROOT = -1  # the frame index of ops outside every loop
_LESS = {"Less": 0, "LessEqual": 1}     # counter OP bound
_GREATER = {"Greater": 0, "GreaterEqual": 1}  # bound OP counter
_ADD_OPS = frozenset({"Add", "AddV2"})


@dataclasses.dataclass(frozen=True)
class LoopFrame:
    """One loop frame: `trips` iterations per execution of its parent (ROOT: once per step).

    source: "static: ..." (from the graph), "given" (loop_iterations=) or "assumed" (a default,
    with a warning).
    """

    name: str
    parent: int
    trips: int
    source: str

    def __str__(self) -> str:
        return f"{self.name}: {self.trips} iterations ({self.source})"


@dataclasses.dataclass(frozen=True, eq=False)
class LoopInfo:
    """frames; op_frame[i]: frame index of op i (ROOT outside loops); op_iterations[i]: times op
    i runs per step; output_frame[i]: the frame op i's outputs live in (differs from op_frame for
    Enter and Exit)."""

    frames: tuple[LoopFrame, ...]
    op_frame: np.ndarray
    output_frame: np.ndarray
    op_iterations: np.ndarray
    frame_iterations: np.ndarray  # (F,) executions per step of each frame's body

    def output_iterations(self, op: int) -> int:
        f = int(self.output_frame[op])
        return 1 if f == ROOT else int(self.frame_iterations[f])


LoopIterations = int | Mapping[str, int] | None


def analyze_loops(ops: Sequence, loop_iterations: LoopIterations = None) -> LoopInfo:
    """Frames and trip counts of the ops of an imported tf.Graph (see the module docstring).

    Args:
      ops: graph.get_operations() of the imported graph (NextIteration back edges included).
      loop_iterations: trips of loops whose count is not static: one int for all of them, or a
        dict frame name -> trips (overrides static counts too).

    Warns (UserWarning) once per loop whose trips are assumed, naming it and `loop_iterations=`.
    Raises InvalidGraphError for a loop_iterations value that is not a positive int or names no
    loop of the graph.
    """
    if not any(op.type in ("Enter", "RefEnter") for op in ops):  # the common case: no loops
        _check_loop_iterations(loop_iterations, ())
        none = np.full(len(ops), ROOT, np.int32)
        return LoopInfo((), none, none, np.ones(len(ops), np.int64), np.ones(0, np.int64))
    index = {op.name: i for i, op in enumerate(ops)}
    op_frame, output_frame, names, parents = _frames(ops, index)
    given = _check_loop_iterations(loop_iterations, names)
    trips: list[int | None] = [None] * len(names)
    sources: list[str] = [""] * len(names)
    cond_of = {int(op_frame[i]): op for i, op in enumerate(ops) if op.type == "LoopCond"}
    # Resolving one loop may need another's count (a gradient loop's bound is the forward loop's
    # final counter): repeat while progress is made.
    progress = True
    while progress:
        progress = False
        for f in range(len(names)):
            if trips[f] is not None:
                continue
            if isinstance(given, dict) and names[f] in given:
                trips[f], sources[f] = given[names[f]], "given"
            else:
                found = _cond_trips(cond_of.get(f), f, op_frame, index, ops, trips)
                if found is None:
                    found = _list_trips(f, ops, op_frame, index)
                if found is None:
                    continue
                trips[f], sources[f] = found
            progress = True
    for f, name in enumerate(names):
        if trips[f] is not None:
            continue
        if isinstance(given, int):
            trips[f], sources[f] = given, "given"
            continue
        trips[f], sources[f] = DEFAULT_LOOP_ITERATIONS, "assumed"
        warnings.warn(
            f"loop {name!r}: its iteration count is not known statically; assuming "
            f"{DEFAULT_LOOP_ITERATIONS} iterations per step. Give it with "
            f"tp.import_graph(..., loop_iterations={{{name!r}: N}})",
            stacklevel=3)
    frames = tuple(LoopFrame(n, parents[f], int(trips[f]), sources[f]) for f, n in enumerate(names))
    frame_iterations = np.ones(len(frames), np.int64)
    for f in _parents_first(parents):
        parent = parents[f]
        frame_iterations[f] = frames[f].trips * (1 if parent == ROOT else frame_iterations[parent])
    per_frame = np.append(frame_iterations, 1)  # index ROOT (-1) reads the trailing 1
    return LoopInfo(frames, op_frame, output_frame, per_frame[op_frame], frame_iterations)


def _check_loop_iterations(loop_iterations: LoopIterations, names: Sequence[str]):
    def positive(value, label):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise errors.InvalidGraphError(f"{label} must be a positive int, got {value!r}")
        return int(value)

    if loop_iterations is None:
        return None
    if isinstance(loop_iterations, Mapping):
        unknown = [name for name in loop_iterations if name not in names]
        if unknown:
            listed = ", ".join(repr(n) for n in names) or "none"
            raise errors.InvalidGraphError(
                f"loop_iterations names {unknown[0]!r}, which is not a loop of the graph (its "
                f"loops: {listed})")
        return {name: positive(v, f"loop_iterations[{name!r}]") for name, v in loop_iterations.items()}
    return positive(loop_iterations, "loop_iterations")


def _frames(ops, index):
    """(op frame, output frame, frame names, frame parents) by TF's ControlFlowInfo rules."""
    n = len(ops)
    op_frame = np.full(n, ROOT, np.int32)
    output_frame = np.full(n, ROOT, np.int32)
    names: list[str] = []
    parents: list[int] = []
    frame_ids: dict[tuple[int, str], int] = {}
    done = np.zeros(n, bool)
    # Ops are visited so that every input except a NextIteration back edge is seen first: the
    # import order of a GraphDef is not topological, so walk depth first from each op.
    for start in range(n):
        stack = [(start, False)]
        while stack:
            i, expanded = stack.pop()
            if done[i]:
                continue
            op = ops[i]
            inputs = [index[t.op.name] for t in op.inputs if t.op.type not in ("NextIteration", "RefNextIteration")]
            inputs += [index[c.name] for c in op.control_inputs]
            if not expanded:
                stack.append((i, True))
                stack.extend((p, False) for p in inputs if not done[p])
                continue
            done[i] = True
            frame = int(output_frame[inputs[0]]) if inputs else ROOT
            op_frame[i] = frame
            if op.type in ("Enter", "RefEnter"):
                key = (frame, op.get_attr("frame_name").decode())
                if key not in frame_ids:
                    frame_ids[key] = len(names)
                    names.append(key[1])
                    parents.append(frame)
                output_frame[i] = frame_ids[key]
            elif op.type in ("Exit", "RefExit"):
                output_frame[i] = parents[frame] if frame != ROOT else ROOT
            else:
                output_frame[i] = frame
    return op_frame, output_frame, names, parents


def _parents_first(parents: Sequence[int]) -> list[int]:
    depth = []
    for f in range(len(parents)):
        d, p = 0, parents[f]
        while p != ROOT:
            d, p = d + 1, parents[p]
        depth.append(d)
    return sorted(range(len(parents)), key=lambda f: depth[f])


def _loop_variable(tensor, frame, op_frame, index):
    """The Merge of `frame` that `tensor` is (through identities), or None."""
    tensor = through_identities(tensor)
    op = tensor.op
    if op.type == "Merge" and op_frame[index[op.name]] == frame:
        return op
    return None


def _merge_parts(merge):
    """(Enter, NextIteration's input tensor) of a loop variable's Merge, or None."""
    enter = next((t.op for t in merge.inputs if t.op.type in ("Enter", "RefEnter")), None)
    back = next((t.op for t in merge.inputs if t.op.type in ("NextIteration", "RefNextIteration")), None)
    if enter is None or back is None:
        return None
    return enter, back.inputs[0]


def _is_this_variable(tensor, merge) -> bool:
    """Whether tensor is merge's value inside the body (Switch:1 of it, through identities)."""
    tensor = through_identities(tensor)
    return (tensor.op.type in ("Switch", "RefSwitch") and tensor.value_index == 1
            and through_identities(tensor.op.inputs[0]).op is merge)


def _counter(merge):
    """(initial value tensor, constant step) of a loop variable stepped by a constant, or None."""
    parts = _merge_parts(merge)
    if parts is None:
        return None
    enter, update = parts
    update = through_identities(update)
    if update.op.type not in _ADD_OPS:
        return None
    a, b = update.op.inputs
    for own, other in ((a, b), (b, a)):
        if _is_this_variable(own, merge):
            step = static_value(through_identities(other))
            if step is not None and np.ndim(step) == 0 and step != 0:
                return enter.inputs[0], int(step)
    return None


def _invariant(merge):
    """The value entering a loop variable that the body passes on unchanged, or None."""
    parts = _merge_parts(merge)
    if parts is None:
        return None
    enter, update = parts
    return enter.inputs[0] if _is_this_variable(update, merge) else None


def _cond_trips(loop_cond, frame, op_frame, index, ops, trips):
    """(trips, source) from the LoopCond's `counter < bound` comparisons, or None."""
    if loop_cond is None:
        return None
    values = []

    def visit(tensor) -> bool:
        tensor = through_identities(tensor)
        op = tensor.op
        if op.type == "LogicalAnd":
            found = [visit(t) for t in op.inputs]
            return any(found)  # an unknown conjunct only shortens the loop: the others bound it
        if op.type in _LESS or op.type in _GREATER:
            counter_side, bound_side = op.inputs if op.type in _LESS else reversed(list(op.inputs))
            inclusive = _LESS.get(op.type, _GREATER.get(op.type))
            counter = _loop_variable(counter_side, frame, op_frame, index)
            bound_merge = _loop_variable(bound_side, frame, op_frame, index)
            parts = _counter(counter) if counter is not None else None
            if bound_merge is not None:
                bound_tensor = _invariant(bound_merge)
            else:  # read directly: a constant Enter's outer value, or a constant in the frame
                bound_tensor = _outer(bound_side)
                if bound_tensor is None:
                    bound_tensor = through_identities(bound_side)
            if parts is None or bound_tensor is None:
                return False
            start = _value(parts[0], op_frame, index, ops, trips)
            bound = _value(bound_tensor, op_frame, index, ops, trips)
            if start is None or bound is None or parts[1] < 0:
                return False
            step = parts[1]
            count = max(1, math.ceil((bound + inclusive - start) / step))  # a 0-trip loop: costed once
            values.append((count, f"static: counter < {bound_tensor.op.name}"))
            return True
        return False

    if not visit(loop_cond.inputs[0]) or not values:
        return None
    return min(values)


def _outer(tensor):
    """A constant Enter's outer tensor (a bound read directly, not as a loop variable), or None."""
    tensor = through_identities(tensor)
    if tensor.op.type in ("Enter", "RefEnter") and tensor.op.get_attr("is_constant"):
        return tensor.op.inputs[0]
    return None


def _value(tensor, op_frame, index, ops, trips):
    """Static value of a tensor outside the loop, or the final value of another loop's counter."""
    tensor = through_identities(tensor)
    value = static_value(tensor)
    if value is not None:
        return int(value) if np.ndim(value) == 0 else None
    op = tensor.op
    if op.type in ("Exit", "RefExit"):
        # Another loop's counter after its last iteration: start + trips * step.
        inner = int(op_frame[index[op.name]])
        switch = through_identities(op.inputs[0]).op
        merge = through_identities(switch.inputs[0]).op if switch.type in ("Switch", "RefSwitch") else None
        if merge is None or merge.type != "Merge" or inner < 0 or trips[inner] is None:
            return None
        parts = _counter(merge)
        if parts is None:
            return None
        start = _value(parts[0], op_frame, index, ops, trips)
        return None if start is None else start + trips[inner] * parts[1]
    return None


def _list_trips(frame, ops, op_frame, index):
    """(trips, source) from the length of a TensorList the body reads element by element."""
    for i, op in enumerate(ops):
        if op_frame[i] != frame or op.type != "TensorListGetItem":
            continue
        source = through_identities(op.inputs[0])
        while source.op.type in ("Merge", "Enter", "Switch"):
            source = through_identities(source.op.inputs[0])
        if source.op.type == "TensorListFromTensor":
            dims = source.op.inputs[0].shape
            if dims.rank and dims[0] is not None:
                return int(dims[0]), f"static: length of {source.op.name}"
        if source.op.type == "TensorListReserve":
            length = static_value(source.op.inputs[1])
            if length is not None and np.ndim(length) == 0 and length >= 0:
                return int(length), f"static: length of {source.op.name}"
    return None
