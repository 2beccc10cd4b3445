"""NodeDef helpers: reading inputs, fetch names, sinks and function calls of a GraphDef.

  parse_input            "x:1" -> ("x", 1, False), "^x" -> ("x", -1, True).
  op_name                the op of a fetch or input name ("x:0" -> "x").
  sinks                  the nodes nothing reads: a GraphDef's default fetches.
  CALL_OPS               the ops that call a function (PartitionedCall, StatefulPartitionedCall).
  called_function_name, called_function   the function a node calls.
Shared by the OpGraph builder (`from_graph_def.py`), the source dispatch, the inliner, the LSTM/GRU
selector, the write-back (`tfplaceto.rewrite`) and the SavedModel rewrite.
"""

from __future__ import annotations

from collections.abc import Mapping

# Function calls by op (a function can also be called as an op of its own name).
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def parse_input(name: str) -> tuple[str, int, bool]:
    """Splits a NodeDef input into (node name, output index, is_control)."""
    if name.startswith("^"):
        return name[1:], -1, True
    node, _, index = name.partition(":")
    return node, int(index) if index else 0, False


def op_name(name: str) -> str:
    """The op of a fetch or input name: "x:0" -> "x", "^x" -> "x" (anything else unchanged)."""
    name = name.lstrip("^")
    head, _, tail = name.rpartition(":")
    return head if head and tail.isdigit() else name


def called_function_name(node) -> str:
    """The name of the function a NodeDef calls: its `f` attribute for a PartitionedCall, else
    its op (a function called by name as an op; not a function at all for other ops)."""
    if node.op in CALL_OPS and "f" in node.attr:
        return node.attr["f"].func.name
    return node.op


def called_function(node, functions: Mapping):
    """The FunctionDef (of `functions`, name -> FunctionDef) a node calls, or None."""
    return functions.get(called_function_name(node))


def sinks(graph_def) -> tuple[str, ...]:
    """The nodes of a GraphDef no other node reads (data or control): its default fetches."""
    consumed = {parse_input(i)[0] for n in graph_def.node for i in n.input}
    return tuple(n.name for n in graph_def.node if n.name not in consumed)
