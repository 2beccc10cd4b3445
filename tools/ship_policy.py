"""Copies a training run's policy into the package (tfplaceto/policy/pretrained/) with its record.

    python tools/ship_policy.py LOGDIR --command "tfplaceto train ..."
    python tools/ship_policy.py --saved-policy-only      # the shipped policy as it is
    python tools/ship_policy.py --held-out docs/generalization.json docs/generalization_per_graph_512*.json
    python tools/ship_policy.py --reproduce LOGDIR        # train it again by its command, compare

The shipped policy's policy.json then says how it was made: the command, the commit it was
trained at, episodes, decisions and wall time (from LOGDIR/summary.json). `--held-out` records
in it the held-out figures of `benchmarks/generalization.py` runs (their JSON files, joined as its
`--merge` joins them): zero-shot against the best fast baseline, untrained weights, random
actions and per-graph policies, the averages the generalization targets are stated in.

Beside its Sonnet
checkpoint goes `saved_policy/`, the greedy policy as a TF-Agents `PolicySaver` SavedModel, as a
training run writes it (`tfplaceto.rl.train`): it is built again here from the network and the
problems of the training command (its sources on its clusters), because that SavedModel holds the
packed statics of the problems it acts on. `--saved-policy-only` writes that SavedModel for the
policy already shipped (its command from its policy.json) and leaves its other files as they are.

`--reproduce LOGDIR` runs the shipped policy's recorded command with `--logdir LOGDIR` (a run
already there resumes from its last checkpoint, so a finished one is only compared) and compares
the policy it exports with the shipped one, variable by variable: exit status 0 when every weight
is bit-identical (training is, on one machine and TensorFlow build: `train.reproducible`), 1 when
not (it prints the largest difference), the command's own when it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def training_problems(command: str):
    """The Problems a `tfplaceto train ...` command trained on (in its order), and their labels."""
    from tfplaceto import errors
    from tfplaceto.cli import _parser, _train_sources
    from tfplaceto.rl.train import problems_for

    words = shlex.split(command)
    if words[:2] == ["tfplaceto", "train"]:
        words = words[1:]
    if words[:1] != ["train"]:
        raise errors.TfplacetoError(f"not a `tfplaceto train` command: {command!r}")
    args = _parser().parse_args(words)
    return problems_for(_train_sources(args), args.cluster)


def policy_saver(network, problems):
    """A TF-Agents `PolicySaver` of the greedy policy over `network` acting on `problems`: the same
    policy a training run on those problems exports (`PlacetoAgent.policy`)."""
    from tf_agents.policies import policy_saver

    from tfplaceto.policy.observation import pack
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoGreedyPolicy, PlacetoPolicy, as_tensors
    from tfplaceto.rl.environment import PlacementEnvironment

    env = PlacementEnvironment(problems, batch_size=1)
    collect = PlacetoPolicy(*specs(env), network, as_tensors(pack(env.statics, env.dims)),
                            name="collect_policy")
    return policy_saver.PolicySaver(PlacetoGreedyPolicy(collect, name="greedy_policy"), batch_size=None)


def write_saved_policy(directory: str, command: str) -> str:
    """Writes `directory/saved_policy` for the policy in `directory` trained by `command`, replacing
    only that subdirectory; returns its path."""
    from tfplaceto.outputs import atomic_directory
    from tfplaceto.policy.checkpoint import SAVED_POLICY, _export_saved_policy, load_policy

    network = load_policy(directory)
    saver = policy_saver(network, training_problems(command)[0])
    path = os.path.join(directory, SAVED_POLICY)
    with atomic_directory(path) as tmp:
        os.rmdir(tmp)  # PolicySaver writes a new directory
        _export_saved_policy(saver, tmp)
    return path


def record_held_out(directory: str, paths: list[str]) -> dict:
    """Writes the held-out figures of the generalization results `paths` into `directory`'s
    policy.json (notes["held_out"]), leaving its weights as they are; returns them."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from generalization import figures, merge

    from tfplaceto.outputs import atomic_write
    from tfplaceto.policy.checkpoint import _read_config

    config = _read_config(directory)
    held_out = {"files": [os.path.relpath(os.path.abspath(p), ROOT) for p in paths],
                "method": "placeto_policy (the policy alone) from random starts",
                **figures(merge(paths, []))}
    config["notes"]["held_out"] = held_out
    atomic_write(os.path.join(directory, "policy.json"), json.dumps(config, indent=1).encode())
    return held_out


def with_logdir(command: str, logdir: str) -> list[str]:
    """The words of `tfplaceto train ...` `command` with its --logdir replaced by `logdir`."""
    words = shlex.split(command)
    at = words.index("--logdir")
    return words[:at + 1] + [logdir] + words[at + 2:]


def weight_differences(directory_a: str, directory_b: str) -> dict[str, float]:
    """Variable name -> largest absolute difference between two saved policies' weights (inf for
    a variable of another shape, or one that only one of them has)."""
    import numpy as np
    import tensorflow as tf

    from tfplaceto.policy.checkpoint import _WEIGHTS

    def weights(directory):
        path = os.path.join(directory, _WEIGHTS)
        return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)
                if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}

    a, b = weights(directory_a), weights(directory_b)
    return {name: float(np.max(np.abs(a[name] - b[name]), initial=0.0))
            if name in a and name in b and np.shape(a[name]) == np.shape(b[name]) else float("inf")
            for name in sorted(set(a) | set(b))}


def reproduce(logdir: str, shipped: str) -> int:
    """Trains the policy in `shipped` again by its recorded command into `logdir`; 0 when the
    weights are bit-identical, 1 when not (prints the comparison), the command's exit status when
    it fails."""
    from tfplaceto.policy.checkpoint import _read_config

    command = _read_config(shipped)["notes"]["trained_by"]
    words = with_logdir(command, logdir)
    print("running:", shlex.join(words), flush=True)
    trained = subprocess.run([sys.executable, "-m", "tfplaceto", *words[1:]], cwd=ROOT)
    if trained.returncode:
        print(f"the command failed (exit status {trained.returncode}): nothing compared")
        return trained.returncode
    differences = weight_differences(os.path.join(logdir, "policy"), shipped)
    worst = max(differences.values())
    print(f"{len(differences)} variables; largest difference {worst:g}: "
          + ("bit-identical to the shipped policy" if worst == 0 else "NOT the shipped policy"))
    return 0 if worst == 0 else 1


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logdir", nargs="?")
    parser.add_argument("--command", help="the command that trained it")
    parser.add_argument("--commit", default=None, help="default: this checkout's HEAD")
    parser.add_argument("--saved-policy-only", action="store_true",
                        help="only (re)write saved_policy/ of the policy already shipped")
    parser.add_argument("--held-out", nargs="+", metavar="JSON",
                        help="only record these generalization.py results in the shipped policy.json")
    parser.add_argument("--reproduce", metavar="LOGDIR",
                        help="train the shipped policy again by its command into LOGDIR and compare")
    args = parser.parse_args(argv)
    from tfplaceto.outputs import atomic_write
    from tfplaceto.policy.checkpoint import PRETRAINED_DIR, _read_config, load_policy, save_policy

    if args.reproduce:
        sys.exit(reproduce(args.reproduce, PRETRAINED_DIR))
    if args.held_out:
        print(json.dumps(record_held_out(PRETRAINED_DIR, args.held_out), indent=1))
        return

    if args.saved_policy_only:
        command = _read_config(PRETRAINED_DIR)["notes"]["trained_by"]
        path = write_saved_policy(PRETRAINED_DIR, command)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        print(f"wrote {path} ({size / 1e6:.1f} MB) for the policy trained by: {command}")
        return
    if not args.logdir or not args.command:
        parser.error("give LOGDIR and --command (or --saved-policy-only)")
    with open(os.path.join(args.logdir, "summary.json")) as f:
        summary = json.load(f)
    commit = args.commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    notes = {"trained_by": args.command, "commit": commit, "episodes": summary["episodes"],
             "decisions": summary["decisions"], "wall_s": round(summary["wall_s"], 1),
             "learner_steps": summary["learner_steps"],
             # The exported policy is the best policy alone evaluated during the run (train.gin's
             # select_every), taken at this episode.
             "selected_episode": summary.get("selected_episode")}
    network = load_policy(os.path.join(args.logdir, "policy"))
    gin_path = os.path.join(PRETRAINED_DIR, "train.gin")  # save_policy replaces the directory whole
    with open(gin_path, "rb") as f:
        gin_text = f.read()
    save_policy(network, PRETRAINED_DIR, notes=notes,
                saver=policy_saver(network, training_problems(args.command)[0]))
    atomic_write(gin_path, gin_text)
    print(json.dumps(notes, indent=1))
    print(f"kept {gin_path}: make it the configuration of this run")


if __name__ == "__main__":
    main()
