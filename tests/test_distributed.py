"""Distributed collection on Reverb: items, an in-process actor feeding the learner, refusals, bad
input, and (slow) `tfplaceto train --actors 2` surviving a SIGKILLed actor."""

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import reverb
import tensorflow as tf
from test_rl import layered  # tests/ is on sys.path under pytest

import tfplaceto as tp
from tfplaceto import errors
from tfplaceto.cli import main
from tfplaceto.policy.checkpoint import load_policy
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.policy.observation import pack
from tfplaceto.problem import Best
from tfplaceto.rl import learner, reverb_items
from tfplaceto.rl.acting import collect, specs
from tfplaceto.rl.actor_process import run_actor
from tfplaceto.rl.agent import PlacetoAgent, PlacetoPolicy, as_tensors
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.rl.train import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scalars(logdir):
    """{tag: [values]} of the TensorBoard event files in `logdir`."""
    from tensorboard.backend.event_processing import event_accumulator

    out = {}
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        acc = event_accumulator.EventAccumulator(path, size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            out.setdefault(tag, []).extend(float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag))
    return out


def test_an_item_carries_a_whole_batch_and_unpacks_to_it():
    # Two problems of different sizes: items are padded to the larger one and cut back exactly.
    small, large = layered(seed=1, depth=3), layered(seed=2, depth=5)
    env = PlacementEnvironment([small, large], batch_size=3, seed=0, shared_start=True)
    policy = PlacetoPolicy(*specs(env), PlacetoNetwork(hidden=8, rounds=2, seed=0),
                           as_tensors(pack(env.statics, env.dims)), seed=0)
    from tf_agents.policies import py_tf_eager_policy

    py_policy = py_tf_eager_policy.PyTFEagerPolicy(policy, use_tf_function=True, batch_time_steps=False)
    spec = reverb_items.item_spec(env, 3)
    sizes = set()
    for _ in range(4):
        experience, weights, _ = collect(env, py_policy, env.reset())
        summaries = env.pop_summaries()
        problem = summaries[0]["problem"]
        sizes.add(weights.shape[1])
        item = reverb_items.pack_item(spec, experience, weights, summaries, env.best_for(problem), problem,
                                     actor=5, incarnation=2, policy_step=11, actor_episodes=9, actor_wall_s=1.5)
        for leaf, leaf_spec in zip(tf.nest.flatten(item), tf.nest.flatten(spec)):
            assert leaf.shape == tuple(leaf_spec.shape) and leaf.dtype == leaf_spec.dtype.as_numpy_dtype
        batch, meta = reverb_items.unpack_item(item, env.problems)
        for a, b in zip(tf.nest.flatten(batch.experience), tf.nest.flatten(experience)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(batch.weights, weights)
        assert [s["problem"] for s in batch.summaries] == [problem] * 3
        assert [s["step_time_s"] for s in batch.summaries] == [s["step_time_s"] for s in summaries]
        (index, best), = batch.best
        assert index == problem and best.step_time_s == env.best_for(problem).step_time_s
        np.testing.assert_array_equal(best.placement, env.best_for(problem).placement)
        assert meta == {"actor": 5, "incarnation": 2, "policy_step": 11, "actor_episodes": 9, "actor_wall_s": 1.5}
    assert len(sizes) == 2  # both problems were drawn: both lengths round-tripped
    with pytest.raises(ValueError, match="does not fit"):
        reverb_items.pack_item(reverb_items.item_spec(env, 2), experience, weights, summaries, Best(), problem,
                              0, 0, 0, 0, 0.0)


def _train_with_an_actor_thread(problem, logdir, episodes, batches):
    """`train` fed by one actor (id 7) running in a thread of this process; (result, batches written)."""
    launcher = learner.Launcher(None, None, actors=0, logdir=logdir)
    written = {}

    def start(*args):
        collector = launcher.start(*args)
        thread = threading.Thread(daemon=True, target=lambda: written.setdefault(
            "batches", run_actor(launcher.address, actor_id=7, problems=[problem], batches=batches)))
        thread.start()
        written["thread"] = thread
        return collector

    try:
        result = train(problem, episodes=episodes, seed=5, lanes=2, hidden=8, rounds=2, logdir=logdir,
                       checkpoint_every=2, progress=False, collector=start)
    finally:
        launcher.close()
    written["thread"].join(60)  # the actor stops at `batches`, or when the server is gone
    assert not written["thread"].is_alive()
    return result, written["batches"]


def test_an_actor_in_process_feeds_the_learner_through_reverb_and_a_run_resumes(tmp_path):
    problem = layered(seed=4)
    logdir = str(tmp_path / "run")
    result, batches = _train_with_an_actor_thread(problem, logdir, episodes=8, batches=6)
    assert batches >= 4
    assert result.episodes == 8 and result.decisions == 8 * problem.num_nodes
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["episodes"] == 8 and summary["learner_steps"] == 4 * 4  # 4 batches x 4 updates
    assert summary["episodes_per_actor"] == {"7": 8}
    assert load_policy(summary["policy_dir"]).config == result.network.config
    scalars = _scalars(logdir)
    lags = scalars["actors/7/policy_lag"]
    # At most the items in flight (queue 1, the sampler's 1, the learner's hand-over 1, the
    # actor's own) stale, 4 updates each.
    assert len(lags) == 4 and min(lags) >= 0 and max(lags) <= 5 * 4
    assert "actors/7/episodes_per_s" in scalars and "learner/wait_s" in scalars
    assert all(np.isfinite(h["step_time_s"]) and h["step_time_s"] > 0 for h in result.history)
    # A learner started again on the same logdir resumes: weights, counts, episodes per actor.
    resumed, _ = _train_with_an_actor_thread(problem, logdir, episodes=12, batches=3)
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert resumed.episodes == 12 and len(resumed.history) == 12
    assert summary["learner_steps"] == 6 * 4 and summary["episodes_per_actor"] == {"7": 12}


def test_an_actor_with_other_graphs_is_refused_and_bad_input_is_a_typed_error(tmp_path):
    problem = layered(seed=4)
    env = PlacementEnvironment(problem, batch_size=2)
    network = PlacetoNetwork(hidden=8, rounds=2, seed=0)
    agent = PlacetoAgent(*specs(env), network, as_tensors(pack(env.statics, env.dims)))
    settings = {"lanes": 2, "initial": "random", "order": "topological", "oom_penalty": 1.0,
                "shared_start": True, "seed": 0, "network": network.config}
    launcher = learner.Launcher(None, None, actors=0, logdir=str(tmp_path))
    try:
        launcher.start(env, None, agent, settings)
        with pytest.raises(errors.DistributedError, match="differ"):
            run_actor(launcher.address, problems=[layered(seed=5)], batches=1)
        with pytest.raises(errors.DistributedError, match="sources"):  # in-process problems, no names
            run_actor(launcher.address, batches=1)
        # Nobody trains: the queue's rate limiter stops the actor after a few items.
        actor = threading.Thread(target=run_actor, args=(launcher.address,), daemon=True,
                                 kwargs={"problems": [problem], "batches": 40})
        actor.start()
        client = reverb.Client(launcher.address)

        def inserted():
            return client.server_info()[reverb_items.TRAJECTORIES].rate_limiter_info.insert_stats.completed

        counts, deadline = [inserted()], time.monotonic() + 120
        while len(counts) < 20 or counts[-1] != counts[-20] or counts[-1] == 0:  # stable for 10 s
            assert time.monotonic() < deadline
            time.sleep(0.5)
            counts.append(inserted())
        assert actor.is_alive() and 1 <= counts[-1] <= 4
        assert client.server_info()[reverb_items.TRAJECTORIES].current_size == 1
    finally:
        launcher.close()
    actor.join(300)  # it notices between batches: generous, a loaded machine collects slowly
    assert not actor.is_alive()  # the server is gone: the actor stops
    with pytest.raises(errors.InvalidArgumentError, match="initial"):
        reverb_items.make_job(None, None, [problem], {**settings, "initial": np.zeros(3)}, env.dims)
    # Actors explore as the learner's own collect policy does (train.exploration).
    assert reverb_items.make_job(None, None, [problem], settings, env.dims)["exploration"] == 0.0
    assert reverb_items.make_job(None, None, [problem], {**settings, "exploration": 0.01},
                                 env.dims)["exploration"] == 0.01
    for address in ("nohost", "host:0", "host:99999", ":80", "host:port"):
        with pytest.raises(errors.InvalidArgumentError, match="HOST:PORT"):
            reverb_items.parse_address(address)
    with pytest.raises(errors.InvalidArgumentError, match="actors"):
        learner.Launcher(None, None, actors=-1)
    with pytest.raises(errors.InvalidArgumentError, match="actors"):
        tp.train(["builtin:ptb-cells/0"], ["2xV100"], episodes=2, logdir=None, actors=-1)
    with pytest.raises(errors.InvalidArgumentError, match="strings"):
        tp.train([problem.graph], ["2xV100"], episodes=2, logdir=None, actors=1)
    with pytest.raises(errors.DistributedError, match="no Reverb server"):
        run_actor("localhost:1", batches=1, connect_timeout_s=0.1)


def test_pulling_the_weights_from_a_stopped_server_gives_up_instead_of_waiting_forever():
    # Reverb's sampler waits forever for a table its server closed (seen: alive 60 s later), and
    # the server can stop between the actor's check and its pull: the pull must be watched.
    from tf_agents.experimental.distributed import reverb_variable_container

    from tfplaceto.rl.actor_process import _LearnerGone, _pull_weights

    variables = {reverb_items.POLICY_KEY: [tf.Variable(np.arange(3, dtype=np.float32))]}
    signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), variables)
    table = reverb.Table(name=reverb_items.VARIABLES, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), rate_limiter=reverb.rate_limiters.MinSize(1),
                         max_size=1, max_times_sampled=0, signature=signature)
    server = reverb.Server([table], port=None)
    address = f"localhost:{server.port}"
    container = reverb_variable_container.ReverbVariableContainer(address, table_names=[reverb_items.VARIABLES])
    container.push({reverb_items.POLICY_KEY: [tf.constant([5.0, 6.0, 7.0])]}, reverb_items.VARIABLES)
    stopped = threading.Event()
    _pull_weights(container, variables, orphaned=lambda: False, gone=stopped.is_set, every_s=0.2)
    np.testing.assert_array_equal(variables[reverb_items.POLICY_KEY][0].numpy(), [5.0, 6.0, 7.0])
    server.stop()
    # The check before the pull still says "here": the race. The watch notices during the pull.
    answers = iter([False])
    began = time.monotonic()
    with pytest.raises(_LearnerGone, match="weights"):
        _pull_weights(container, variables, orphaned=lambda: False, gone=lambda: next(answers, True),
                      every_s=0.2)
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("argv", [
    ["actor", "--reverb-address", "nohost"],
    ["actor", "--reverb-address", "localhost:1", "--batches", "0"],
    ["train", "--graph", "x.pb", "--cluster", "2xK80", "--logdir", "d", "--episodes", "2", "--actors", "-1"],
])
def test_bad_distributed_arguments_are_one_line_and_status_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tfplaceto: error:")
    assert not (tmp_path / "d").exists()


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_actors_scaling_benchmark_runs_the_embedded_engine_then_actors_in_one_process(tmp_path):
    # In a fresh process, as its users run it: the embedded run parses (and locks) gin's config
    # before the run with actors imports rl.learner, whose configurables must be registered by then.
    out = tmp_path / "scaling.json"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "actors_scaling.py"), "--seconds", "20",
               "--actors", "0", "1", "--graphs", "builtin:ptb-cells/0", "--out", str(out),
               "--gin-param", "train.lanes = 2", "--gin-param", "train.hidden = 8", "--gin-param", "train.rounds = 2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["actors"] for row in rows] == [0, 1]
    assert all(row["decisions"] > 0 for row in rows)


@pytest.mark.slow
def test_train_with_two_actors_survives_a_killed_actor_and_ends_cleanly(tmp_path, write_mlp_graph):
    source = write_mlp_graph(tmp_path / "mlp.pb", train_op="train", batch_size=32)
    logdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "tfplaceto", "train", "--graph", str(source), "--cluster", "2xV100",
               "--episodes", "200", "--logdir", str(logdir), "--actors", "2", "--seed", "3",
               "--gin-param", "train.lanes = 2", "--gin-param", "train.hidden = 8",
               "--gin-param", "train.rounds = 2", "--gin-param", "train.checkpoint_every = 10"]
    learner = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        summary_path, actors_path = logdir / "summary.json", logdir / "actors" / "actors.json"
        deadline = time.monotonic() + 240
        while not summary_path.exists() or json.loads(summary_path.read_text())["learner_steps"] < 40:
            assert learner.poll() is None, learner.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the learner made no progress"
            time.sleep(0.5)
        first = json.loads(actors_path.read_text())
        assert set(first) == {"0", "1"}
        os.kill(first["0"]["pid"], signal.SIGKILL)
        steps_at_kill = json.loads(summary_path.read_text())["learner_steps"]
        out, err = learner.communicate(timeout=600)
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
    assert learner.returncode == 0, err[-3000:]
    assert "actor 0 exited with status -9; restarting it" in err
    summary = json.loads(summary_path.read_text())
    assert summary["episodes"] == 200 and summary["learner_steps"] == 100 * 4 > steps_at_kill
    assert sum(summary["episodes_per_actor"].values()) == 200 and summary["episodes_per_actor"]["1"] > 0
    after = json.loads(actors_path.read_text())
    assert after["0"]["incarnation"] == 1 and after["1"]["incarnation"] == 0
    assert not any(_pid_alive(a["pid"]) for a in [*first.values(), *after.values()])  # none leaked
    policy = tp.place(tp.import_graph(str(source)), "2xV100", method="placeto_policy",
                      policy=summary["policy_dir"], seed=0)
    assert len(policy) > 0
    saved = tf.saved_model.load(os.path.join(summary["policy_dir"], "saved_policy"))
    assert callable(saved.action)


def test_ctrl_c_stops_the_actors_the_launcher_started(tmp_path, monkeypatch):
    def interrupted(self):
        while len(self._procs) < 2:  # both started
            time.sleep(0.1)
        raise KeyboardInterrupt

    monkeypatch.setattr(learner.Launcher, "batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        learner.train_distributed([layered(seed=4)], None, None, episodes=2, logdir=str(tmp_path), actors=2,
                                      lanes=2, hidden=8, rounds=2, progress=False)
    actors = json.loads((tmp_path / "actors" / "actors.json").read_text())
    assert set(actors) == {"0", "1"} and not any(_pid_alive(a["pid"]) for a in actors.values())


@pytest.mark.slow
def test_an_actor_that_keeps_failing_is_an_error_with_its_log(tmp_path):
    # Problems given in-process have no sources: actor processes cannot rebuild them and exit.
    with pytest.raises(errors.DistributedError, match="exited with status 2 3 times.*not named by sources"):
        learner.train_distributed([layered(seed=4)], None, None, episodes=2, logdir=str(tmp_path), actors=1,
                                      lanes=2, hidden=8, rounds=2, progress=False)
    actors = json.loads((tmp_path / "actors" / "actors.json").read_text())
    assert actors["0"]["incarnation"] == 2 and not _pid_alive(actors["0"]["pid"])
