"""TF-Agents conventions of the exported policy: a PolicySaver SavedModel beside the Sonnet checkpoint
that loads with `tf.saved_model.load` and acts like the network, and the gin config of a CLI run."""

import os

import numpy as np
import tensorflow as tf
from test_rl import layered  # tests/ is on sys.path under pytest
from tf_agents.policies import py_tf_eager_policy
from tf_agents.trajectories import time_step as ts

from tfplaceto.cli import main
from tfplaceto.policy.checkpoint import PRETRAINED_DIR, SAVED_POLICY, load_policy
from tfplaceto.policy.observation import ACTION_MASK, pack
from tfplaceto.rl.acting import specs
from tfplaceto.rl.agent import PlacetoGreedyPolicy, PlacetoPolicy, as_tensors
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.rl.train import train


def test_the_saved_policy_loads_without_tfplaceto_and_acts_like_the_network(tmp_path):
    problems = [layered(seed=4), layered(seed=5, depth=4, devices=4)]
    logdir = str(tmp_path / "run")
    train(problems, episodes=4, seed=5, lanes=2, hidden=8, rounds=2, logdir=logdir, progress=False)
    policy_dir = os.path.join(logdir, "policy")
    assert sorted(os.listdir(policy_dir)) == sorted(["policy.json", SAVED_POLICY, "weights.data-00000-of-00001",
                                                     "weights.index"])
    network = load_policy(policy_dir)
    saved = tf.saved_model.load(os.path.join(policy_dir, SAVED_POLICY))
    for index in range(2):  # either training problem, observed by a PlacementEnvironment over both
        env = PlacementEnvironment(problems, batch_size=3, seed=index, same_problem=True)
        # The reference: the same greedy policy built in this process over the loaded network.
        reference = PlacetoGreedyPolicy(PlacetoPolicy(*specs(env), network, as_tensors(pack(env.statics, env.dims))))
        state, saved_state = reference.get_initial_state(3), saved.get_initial_state(3)
        step = env.reset()
        steps = 0
        while not step.is_last().all():
            time_step = tf.nest.map_structure(tf.constant, step)
            out, expected = saved.action(time_step, saved_state), reference.action(time_step, state)
            action, saved_state, state = out.action.numpy(), out.state, expected.state
            np.testing.assert_array_equal(action, expected.action.numpy())
            assert step.observation[ACTION_MASK][np.arange(3), action].all()
            step = env.step(action)
            steps += 1
        assert steps == env.problems[env.pop_summaries()[0]["problem"]].num_nodes
    # TF-Agents' own loader for saved policies acts on numpy time steps too.
    py_policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(os.path.join(policy_dir, SAVED_POLICY),
                                                            load_specs_from_pbtxt=True, batch_time_steps=False)
    env = PlacementEnvironment(problems, batch_size=2, seed=0)
    step = env.reset()
    assert py_policy.action(step, py_policy.get_initial_state(2)).action.shape == (2,)


def test_gin_from_the_command_line_configures_training_and_is_saved(tmp_path, capsys):
    gin_file = tmp_path / "small.gin"
    gin_file.write_text("train.hidden = 8\ntrain.rounds = 2\n")
    logdir = tmp_path / "run"
    assert main(["train", "--family", "ptb-cells", "--num-graphs", "1", "--cluster", "2xK80", "--logdir",
                 str(logdir), "--episodes", "2", "--gin", str(gin_file), "--gin-param", "train.lanes = 2"]) == 0
    operative = (logdir / "operative_config.gin").read_text()
    assert "train.hidden = 8" in operative and "train.lanes = 2" in operative and "train.rounds = 2" in operative
    assert load_policy(str(logdir / "policy")).config["hidden"] == 8
    assert (logdir / "policy" / SAVED_POLICY / "saved_model.pb").exists()
    capsys.readouterr()
    assert main(["train", "--family", "ptb-cells", "--cluster", "2xK80", "--logdir", str(tmp_path / "bad"),
                 "--episodes", "2", "--gin-param", "train.no_such_parameter = 1"]) == 2
    assert "gin" in capsys.readouterr().err


def test_the_shipped_policy_has_a_saved_policy_with_its_weights_that_acts_within_the_mask():
    # Written by `tools/ship_policy.py` (over the shipped policy's 27 training problems, whose
    # statics it holds: building those takes minutes, so this test acts on a synthetic observation).
    path = os.path.join(PRETRAINED_DIR, SAVED_POLICY)
    # TF-Agents' loader (tf.saved_model.load inside); one load, the costly part of this test.
    py_policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(path, load_specs_from_pbtxt=True, batch_time_steps=False)
    weights = {v.name: v.numpy() for v in load_policy().variables}
    saved = py_policy.variables()
    assert {v.name: v.numpy().shape for v in saved} == {k: v.shape for k, v in weights.items()}
    for variable in saved:
        np.testing.assert_array_equal(variable.numpy(), weights[variable.name])
    devices = int(py_policy.action_spec.maximum) + 1
    observation = {name: np.zeros((devices,) + spec.shape, spec.dtype)
                   for name, spec in py_policy.time_step_spec.observation.items()}
    observation[ACTION_MASK][np.arange(devices), np.arange(devices)] = True  # lane k may only pick device k
    time_step = ts.restart(observation, batch_size=devices)
    action = py_policy.action(time_step, py_policy.get_initial_state(devices)).action
    np.testing.assert_array_equal(action, np.arange(devices))


def _ship_policy():
    """(the checkout's root, tools/ship_policy.py as a module)."""
    from conftest import ROOT, load_script

    return str(ROOT), load_script("tools/ship_policy.py")


def test_the_shipped_policy_records_the_held_out_figures_of_the_files_it_names(tmp_path):
    # `tools/ship_policy.py --held-out FILES` wrote them; a rerun of the generalization benchmark
    # that is not recorded again makes them disagree.
    import json
    import shutil

    root, ship_policy = _ship_policy()
    with open(os.path.join(PRETRAINED_DIR, "policy.json")) as f:
        shipped = json.load(f)
    held_out = shipped["notes"]["held_out"]
    assert held_out["rows"] == 90  # 10 members x 3 families x 3 clusters
    copy = tmp_path / "policy"
    copy.mkdir()
    shutil.copy(os.path.join(PRETRAINED_DIR, "policy.json"), copy / "policy.json")
    recorded = ship_policy.record_held_out(str(copy), [os.path.join(root, f) for f in held_out["files"]])
    assert recorded == held_out
    with open(copy / "policy.json") as f:
        assert json.load(f) == shipped


def test_reproduce_reruns_the_recorded_command_elsewhere_and_compares_every_weight():
    # `tools/ship_policy.py --reproduce LOGDIR` trains the shipped policy again by its recorded
    # command (into LOGDIR) and compares weights: here the comparison, on the shipped policy, and
    # on two policies kept in runs/ of one configuration and other weights (sessions 15 and 19).
    import json

    root, ship_policy = _ship_policy()
    with open(os.path.join(PRETRAINED_DIR, "policy.json")) as f:
        command = json.load(f)["notes"]["trained_by"]
    words = ship_policy.with_logdir(command, "/tmp/again")
    assert words[:2] == ["tfplaceto", "train"] and words[words.index("--logdir") + 1] == "/tmp/again"
    assert len(words) == len(command.split())
    same = ship_policy.weight_differences(PRETRAINED_DIR, PRETRAINED_DIR)
    assert len(same) >= 10 and set(same.values()) == {0.0}
    kept = [os.path.join(root, "runs", run, "policy") for run in ("shipped-policy-prio", "shipped-policy-seed5")]
    other = ship_policy.weight_differences(*kept)
    assert other.keys() == ship_policy.weight_differences(kept[0], kept[0]).keys() and max(other.values()) > 0
    assert set(ship_policy.weight_differences(kept[0], PRETRAINED_DIR).values()) == {float("inf")}  # other networks
