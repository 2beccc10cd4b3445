"""Generated protocol buffer modules (source of truth: protos/*.proto; regenerate with `make protos`)."""

from tfplaceto.protos import cluster_pb2, cost_profile_pb2, placement_pb2

__all__ = ["cluster_pb2", "cost_profile_pb2", "placement_pb2"]
