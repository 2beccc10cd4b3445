"""Which graph a .pb / .pbtxt file holds: binary or text, GraphDef or MetaGraphDef.

  parse_graph_file   (kind, proto) of the bytes of a graph file, or None: every encoding and
                     message type is tried, and a parse counts only if it yields a real graph.
  op_is_registered   whether this TensorFlow knows an op type (a custom op needs its library).
`sources.py` reads the file and hands the proto on like any other source.
"""

from __future__ import annotations

from google.protobuf import message as protobuf_message
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import op_def_registry


def parse_graph_file(data: bytes, prefer_text: bool
                      ) -> tuple[str, graph_pb2.GraphDef | meta_graph_pb2.MetaGraphDef] | None:
    """Tries binary and text GraphDef and MetaGraphDef; returns (kind, proto) or None.

    Binary protobuf parsing is lenient (bytes of one message type often parse as another), so a
    parse only counts if the graph it yields looks like a real graph (`_looks_valid`).
    """
    def binary(proto_type):
        proto = proto_type()
        try:
            proto.ParseFromString(data)
        except (protobuf_message.DecodeError, RuntimeError, ValueError):
            return None
        return proto

    def text(proto_type):
        proto = proto_type()
        try:
            text_format.Parse(data.decode("utf-8"), proto)
        except (text_format.ParseError, UnicodeDecodeError, RuntimeError, ValueError):
            return None
        return proto

    attempts = [("binary", binary), ("text", text)]
    if prefer_text:
        attempts.reverse()
    for encoding, parse in attempts:
        for label, proto_type in (("MetaGraphDef", meta_graph_pb2.MetaGraphDef),
                                  ("GraphDef", graph_pb2.GraphDef)):
            proto = parse(proto_type)
            if proto is None:
                continue
            graph_def = proto.graph_def if label == "MetaGraphDef" else proto
            if _looks_valid(graph_def):
                return f"{encoding} {label}", proto
    # Text that parses is certainly meant as a graph: hand it on so that `sources._check_graph_def` says
    # precisely what is wrong with it (an unknown op, a dangling input) instead of "unreadable".
    for label, proto_type in (("GraphDef", graph_pb2.GraphDef),
                              ("MetaGraphDef", meta_graph_pb2.MetaGraphDef)):
        proto = text(proto_type)
        graph_def = proto.graph_def if label == "MetaGraphDef" and proto is not None else proto
        if graph_def is not None and graph_def.node:
            return f"text {label}", proto
    return None


def _looks_valid(graph_def: graph_pb2.GraphDef) -> bool:
    if not graph_def.node:
        return False
    known = {function.signature.name for function in graph_def.library.function}
    return all(node.name and (node.op in known or op_is_registered(node.op))
               for node in graph_def.node)


def op_is_registered(op_type: str) -> bool:
    """Whether this TensorFlow (with the op libraries loaded so far) knows the op type."""
    return op_def_registry.get(op_type) is not None
