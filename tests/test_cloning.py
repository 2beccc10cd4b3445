"""The teacher phase of training (`tfplaceto.rl.cloning`): teachers, padding, cloning, the CLI."""

import dataclasses
import json
import zlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import layered

import tfplaceto as tp
from tfplaceto.cli import main
from tfplaceto.cluster import as_cluster
from tfplaceto.policy.checkpoint import load_policy
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.policy.observation import Dims
from tfplaceto.rl.acting import greedy_placements, replay_placement
from tfplaceto.rl.cloning import (
    _padded,
    clone,
    load_teacher,
    make_teacher,
    save_teacher,
    teach,
    teacher_sources,
)
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.search import best_baseline, climbed_baseline


def test_a_teacher_is_the_climbed_baseline_pads_to_what_a_larger_environment_writes_and_saves(tmp_path):
    problem = layered(seed=1, devices=3)
    teacher = make_teacher(problem, "layered/1")
    climbed, baseline = climbed_baseline(problem, 0), best_baseline(problem, 0)
    assert climbed.step_time_s <= baseline.step_time_s
    assert teacher.ratio == pytest.approx(climbed.step_time_s / baseline.step_time_s)
    own = teacher.experience.observation["placement"].shape[-1]
    larger = Dims(nodes=own + 7, edges=100, devices=5, steps=40)
    env = PlacementEnvironment(problem, batch_size=1, initial="random", seed=zlib.crc32(b"layered/1"), dims=larger)
    direct, weights = replay_placement(env, climbed.placement)
    padded = _padded(teacher.experience, larger)
    np.testing.assert_array_equal(weights, teacher.weights)
    np.testing.assert_array_equal(direct.action, teacher.experience.action)
    for name, value in direct.observation.items():
        np.testing.assert_array_equal(padded.observation[name], value, err_msg=name)
    # Saved and loaded (a numpy .npz, no pickle), every array comes back.
    save_teacher(teacher, str(tmp_path / "t.npz"))
    loaded = load_teacher(str(tmp_path / "t.npz"))
    assert (loaded.label, loaded.ratio) == (teacher.label, teacher.ratio)
    for a, b in zip(tf.nest.flatten([loaded.experience, loaded.weights, dataclasses.astuple(loaded.statics)]),
                    tf.nest.flatten([teacher.experience, teacher.weights, dataclasses.astuple(teacher.statics)])):
        np.testing.assert_array_equal(a, b)
    # The replay is the teacher's placement: its last step leaves every class where the teacher has it.
    devices = teacher.experience.observation["placement"][0, -1, :problem.num_nodes]
    assert problem.simulator().run(devices)[0] == pytest.approx(climbed.step_time_s)


def test_cloning_makes_the_policy_alone_place_like_its_teachers_where_untrained_weights_do_not():
    problems = [layered(seed=s, devices=3) for s in (2, 3, 4)]
    teachers = [make_teacher(p, f"layered/{i}") for i, p in enumerate(problems)]

    def policy_over_teacher(network):
        """Mean over the problems of the policy alone's step time (greedy, 4 random starts) over the teacher's."""
        return np.mean([np.mean([p.simulator().run(x)[0] for x in greedy_placements(p, network, starts=4, seed=9)])
                        / (t.ratio * best_baseline(p, 0).step_time_s) for p, t in zip(problems, teachers)])

    untrained = policy_over_teacher(PlacetoNetwork(hidden=16, rounds=2, seed=0, view="placed", nodes_on_device=True))
    network = PlacetoNetwork(hidden=16, rounds=2, seed=0, view="placed", nodes_on_device=True)
    losses = clone(network, teachers, updates=120, learning_rate=1e-2, per_update=3, seed=0, progress=False)
    cloned = policy_over_teacher(network)
    assert np.mean(losses[-10:]) < 0.3 * losses[0]
    assert cloned < 1.05 < untrained, (cloned, untrained)


def test_an_ensemble_is_cloned_member_by_member_each_as_a_run_of_its_own_seed_and_acts_as_one():
    problems = [layered(seed=s, devices=3) for s in (2, 3)]
    teachers = [make_teacher(p, f"layered/{i}") for i, p in enumerate(problems)]
    config = {"hidden": 8, "rounds": 2, "view": "placed", "refresh_every": 4}
    ensemble = PlacetoNetwork(**config, seed=5, ensemble=2)
    losses = clone(ensemble, teachers, updates=6, per_update=2, seed=7, progress=False)
    alone = [PlacetoNetwork(**config, seed=5 + k) for k in range(2)]
    own = [clone(network, teachers, updates=6, per_update=2, seed=7 + k, progress=False) for k, network in enumerate(alone)]
    np.testing.assert_allclose(losses, np.mean(own, axis=0), rtol=1e-6)
    for member, network in zip(ensemble.members, alone):
        for a, b in zip(member.trainable_variables, network.trainable_variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # It acts like one network (a greedy episode reusing its wider embeddings for 4 steps).
    placement = greedy_placements(problems[0], ensemble, starts=1, seed=0)[0]
    assert placement.shape == (problems[0].num_nodes,) and placement.max() < 3


def test_teachers_are_made_in_a_child_process_for_any_cluster_and_kept(tmp_path):
    # Not a preset, so the child cannot build it from its name: it gets the object.
    cluster = tp.Cluster(list(as_cluster("4xV100").devices), name="my-v100s")
    made = teach(["builtin:ptb-cells/0"], [cluster], str(tmp_path), progress=False)
    assert [t.label for t in made] == ["builtin:ptb-cells/0@my-v100s"] and 0 < made[0].ratio <= 1.0
    assert len(list(tmp_path.glob("*.npz"))) == 1
    kept = teach(["builtin:ptb-cells/0"], [cluster], str(tmp_path), progress=False)  # read, not made again
    np.testing.assert_array_equal(kept[0].experience.action, made[0].experience.action)


def test_teacher_sources_add_the_first_members_of_each_family_trained_on():
    sources = ["builtin:ptb-cells/1", "builtin:nmt-variants/4", "builtin:inception_v3", "graph.pb"]
    assert teacher_sources(sources, 3) == [*sources, "builtin:ptb-cells/0", "builtin:ptb-cells/2",
                                           "builtin:nmt-variants/0", "builtin:nmt-variants/1",
                                           "builtin:nmt-variants/2"]
    assert teacher_sources(sources, 0) == sources


def test_teacher_sources_never_add_the_validation_or_held_out_members():
    added = teacher_sources(["builtin:cifar10-cells/0"], 112)[1:]
    members = [int(source.rsplit("/", 1)[1]) for source in added]
    assert members == [m for m in range(1, 112) if not 50 <= m <= 55 and not 100 <= m <= 109]


def test_train_clones_teachers_once_before_its_first_batch_and_resumes_without_them(tmp_path, capsys):
    logdir = tmp_path / "run"
    command = ["train", "--family", "ptb-cells", "--cluster", "2xK80", "--logdir", str(logdir), "--num-graphs", "1",
               "--gin", "tfplaceto/policy/train.gin", "--gin-param", "train.lanes = 2", "--gin-param", "train.ensemble = 2",
               "--gin-param", "clone_teachers.updates = 4", "--gin-param", "clone_teachers.family_members = 2"]
    assert main([*command, "--episodes", "2"]) == 0
    summary = json.loads((logdir / "summary.json").read_text())
    record = summary["pretrain"]
    assert record["teachers"] == 2 and record["updates"] == 4  # ptb-cells 0 and 1 on 2xK80
    assert 0 < record["teacher_over_best_baseline"] <= 1.0
    assert len(list((logdir / "teachers").glob("*.npz"))) == 2
    assert summary["selected_episode"] is not None
    assert "clone_teachers.updates = 4" in (logdir / "operative_config.gin").read_text()
    capsys.readouterr()
    assert main([*command, "--episodes", "4"]) == 0  # resumed: the weights are the checkpoint's
    assert "cloning" not in capsys.readouterr().err
    resumed = json.loads((logdir / "summary.json").read_text())
    assert resumed["episodes"] == 4 and resumed["pretrain"] == record
    # An ensemble (two members, each cloned) is exported as one policy, TF-Agents' SavedModel too.
    assert load_policy(resumed["policy_dir"]).config["ensemble"] == 2
    assert (logdir / "policy" / "saved_policy" / "saved_model.pb").exists()
    assert main([*command[:-2], "--gin-param", "clone_teachers.family_members = -1", "--episodes", "2",
                 "--logdir", str(tmp_path / "bad")]) == 2
    assert "clone_teachers.family_members" in capsys.readouterr().err


def test_a_cosine_schedule_ends_cloning_with_steps_near_zero_and_a_bad_one_is_refused(monkeypatch):
    from tfplaceto.rl.agent import PlacetoAgent

    problem = layered(seed=2, devices=3)
    teachers = [make_teacher(problem, "layered/2")]
    moved = {}
    train_averaged = PlacetoAgent.train_averaged

    def measured(agent, batches):  # how far each update moves the weights
        before = [v.numpy() for v in agent._network.trainable_variables]
        info = train_averaged(agent, batches)
        moved.setdefault(agent, []).append(max(np.abs(v.numpy() - b).max() for v, b in
                                               zip(agent._network.trainable_variables, before)))
        return info

    monkeypatch.setattr(PlacetoAgent, "train_averaged", measured)
    for schedule in ("constant", "cosine"):
        network = PlacetoNetwork(hidden=16, rounds=2, seed=0, view="placed", nodes_on_device=True)
        clone(network, teachers, updates=10, learning_rate=1e-2, per_update=1, progress=False, schedule=schedule)
    constant, cosine = moved.values()
    assert constant[-1] > 0.5 * constant[0]  # Adam's steps keep their size
    assert cosine[-1] < 0.05 * cosine[0]
    with pytest.raises(tp.errors.InvalidArgumentError, match="schedule"):
        clone(network, teachers, updates=1, progress=False, schedule="linear")
