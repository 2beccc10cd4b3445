"""Copies a training run's policy into the package (tfplaceto/policy/pretrained/) with its record.

    python tools/ship_policy.py LOGDIR --command "tfplaceto train ..."

The shipped policy's policy.json then says how it was made: the command, the commit it was
trained at, episodes, decisions and wall time (from LOGDIR/summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logdir")
    parser.add_argument("--command", required=True, help="the command that trained it")
    parser.add_argument("--commit", default=None, help="default: this checkout's HEAD")
    args = parser.parse_args(argv)
    from tfplaceto.policy.checkpoint import PRETRAINED_DIR, load_policy, save_policy

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
    save_policy(load_policy(os.path.join(args.logdir, "policy")), PRETRAINED_DIR, notes=notes)
    print(json.dumps(notes, indent=1))


if __name__ == "__main__":
    main()
