"""The generated protobuf modules match protos/*.proto, round-trip, and are the only file format.

- Regenerating every .proto with tools/gen_protos.py gives byte-identical tfplaceto/protos/*_pb2.py.
- Cluster, CostProfile and Placement messages survive serialize -> parse unchanged.
- No module under tfplaceto/ uses pickle (files tfplaceto writes are protos).
"""

from __future__ import annotations

import io
import pathlib
import sys
import tokenize

from conftest import ROOT, load_script

if str(ROOT) not in sys.path:  # tfplaceto importable without an install
    sys.path.insert(0, str(ROOT))

from tfplaceto.protos import cluster_pb2, cost_profile_pb2, placement_pb2  # noqa: E402

PICKLE_NAMES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill"}


def test_generated_protos_are_up_to_date(tmp_path: pathlib.Path) -> None:
    gen_protos = load_script("tools/gen_protos.py")
    generated = gen_protos.generate(tmp_path)
    assert generated, "no .proto files under protos/"
    checked_in = ROOT / "tfplaceto" / "protos"
    for path in generated:
        stem = path.name[: -len("_pb2.py")]
        target = checked_in / path.name
        message = f"tfplaceto/protos/{path.name} is out of date with protos/{stem}.proto: run `make protos`"
        assert target.is_file(), message
        assert target.read_bytes() == path.read_bytes(), message
    stale = sorted(
        p.name for p in checked_in.glob("*_pb2.py") if p.name not in {g.name for g in generated}
    )
    assert not stale, f"tfplaceto/protos/{stale} have no .proto under protos/: delete them"


def test_cluster_round_trip() -> None:
    cluster = cluster_pb2.Cluster(
        name="2xV100",
        devices=[
            cluster_pb2.Device(
                name=f"/job:localhost/replica:0/task:0/device:GPU:{i}",
                type="GPU",
                model="V100",
                memory_bytes=16 * 2**30,
                peak_gflops=15700.0,
                memory_bandwidth_gbs=900.0,
                streams=1,
                num_cores=80,
                frequency_mhz=1530.0,
                architecture="7.0",
            )
            for i in range(2)
        ],
        links=[
            cluster_pb2.Link(
                src="/job:localhost/replica:0/task:0/device:GPU:0",
                dst="/job:localhost/replica:0/task:0/device:GPU:1",
                bandwidth_bytes_per_s=25e9,
                latency_s=5e-6,
            )
        ],
    )
    parsed = cluster_pb2.Cluster.FromString(cluster.SerializeToString())
    assert parsed == cluster
    assert parsed.devices[1].name.endswith("GPU:1")
    assert parsed.links[0].bandwidth_bytes_per_s == 25e9


def test_cost_profile_round_trip() -> None:
    profile = cost_profile_pb2.CostProfile(
        source="analytical",
        graph_fingerprint="0123abcd",
        device_kinds=["GPU:V100", "CPU:host"],
        ops=[
            cost_profile_pb2.OpCost(op_name="conv1", compute_s=[1e-4, 3e-3]),
            cost_profile_pb2.OpCost(op_name="relu1", compute_s=[2e-6, 1e-5]),
        ],
    )
    parsed = cost_profile_pb2.CostProfile()
    parsed.ParseFromString(profile.SerializeToString())
    assert parsed == profile
    assert list(parsed.ops[0].compute_s) == [1e-4, 3e-3]


def test_placement_round_trip() -> None:
    placement = placement_pb2.Placement(
        op_device={
            "conv1": "/job:localhost/replica:0/task:0/device:GPU:0",
            "relu1": "/job:localhost/replica:0/task:0/device:CPU:0",
        },
        method="m_etf",
        notes="test",
    )
    parsed = placement_pb2.Placement.FromString(placement.SerializeToString())
    assert parsed == placement
    assert dict(parsed.op_device) == dict(placement.op_device)


def _pickle_uses(path: pathlib.Path) -> list[str]:
    """Lines of a module that name a pickle module in code (comments and strings do not count)."""
    uses = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME:
            continue
        allow_pickle = (
            tok.string == "allow_pickle"
            and i + 2 < len(tokens)
            and tokens[i + 1].string == "="
            and tokens[i + 2].string == "True"
        )
        if tok.string in PICKLE_NAMES or allow_pickle:
            uses.append(f"{path.relative_to(ROOT).as_posix()}:{tok.start[0]}: {tok.line.strip()}")
    return uses


def test_no_pickle_in_package() -> None:
    uses = []
    for path in sorted((ROOT / "tfplaceto").rglob("*.py")):
        if "__pycache__" not in path.parts:
            uses += _pickle_uses(path)
    assert not uses, "file formats must be protos, not pickle:\n" + "\n".join(uses)
