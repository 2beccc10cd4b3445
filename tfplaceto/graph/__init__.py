"""Graphs: import from every TensorFlow source into an OpGraph, grouping, graph_nets conversion."""
