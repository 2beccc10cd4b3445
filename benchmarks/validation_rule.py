"""Every trained policy measured on the validation members, side by side: the seed spread of one
command, what each training variant's runs say against it, and which run the selection rule picks.

    python benchmarks/validation_rule.py [--docs docs] [--command reproducible]

Reads the pairs `DOCS/validation_TAG.json` + `DOCS/validation_53-55_TAG.json` (the policy alone on
validation members 50-52 and 53-55 of the three built-in families, 54 problems, as
`benchmarks/generalization.py --no-controls` writes them), TAG being `VARIANT_seedS` for a
training run (the shipped command with one binding more, seed S) or a name alone (a policy that is
not one run, e.g. an ensemble). Measures nothing; prints:

- the shipped command's own runs (`--command`, TAG `reproducible_seedS`): each seed's mean of
  zero-shot over the best fast baseline, and their mean and standard deviation;
- per variant: its runs' mean, its difference from the command's mean with a standard error
  (the command's standard deviation for both, as a variant's 1-4 runs cannot estimate their
  own), and the difference paired by seed (a variant's run less the command's run of the same
  seed);
- the correlation, over all runs of variants with two or more, between a run's distance from
  its variant's mean and the command's run of the same seed from the command's mean: how much
  a seed carries from one configuration to another, and so what pairing by seed is worth;
- every run ranked by the selection rule: no validation row over `--tail`x the best fast
  baseline first, then the lowest mean (the issue's targets: on average, and never by more than
  20%).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re

import numpy as np


def ratios(docs: str, tag: str) -> np.ndarray | None:
    """Zero-shot over the best fast baseline on the 54 validation rows of TAG (None if incomplete)."""
    rows = []
    for half in ("", "_53-55"):
        path = os.path.join(docs, f"validation{half}_{tag}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            rows += json.load(f)
    if len(rows) != 54:
        return None
    return np.array([r["zero_shot_s"] / r["best_baseline_s"] for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", default=os.path.join(os.path.dirname(__file__), "..", "docs"))
    parser.add_argument("--command", default="reproducible", help="the shipped command's variant name")
    parser.add_argument("--tail", type=float, default=1.2)
    args = parser.parse_args()

    runs: dict[str, dict[int, np.ndarray]] = {}
    others: dict[str, np.ndarray] = {}
    for path in sorted(glob.glob(os.path.join(args.docs, "validation_53-55_*.json"))):
        tag = os.path.basename(path)[len("validation_53-55_"):-len(".json")]
        r = ratios(args.docs, tag)
        if r is None or tag == "controls":
            continue
        match = re.fullmatch(r"(.+)_seed(\d+)", tag)
        if match:
            runs.setdefault(match.group(1), {})[int(match.group(2))] = r
        else:
            others[tag] = r
    if args.command not in runs:
        raise SystemExit(f"no runs of {args.command!r} in {args.docs}")
    command_runs = runs.pop(args.command)
    command = {seed: r.mean() for seed, r in command_runs.items()}
    values = np.array(list(command.values()))
    center, spread = values.mean(), values.std(ddof=1)
    print(f"the command ({args.command}), {len(values)} seeds: "
          + ", ".join(f"{s}: {v:.3f}" for s, v in sorted(command.items()))
          + f"; mean {center:.4f}, standard deviation {spread:.4f}")
    print(f"\n{'variant':22s} {'runs':>4s} {'seeds':12s} {'mean':>7s} {'- command mean':>16s} {'paired by seed':>15s}")
    distance, carried = [], []
    for variant, by_seed in sorted(runs.items()):
        means = {seed: r.mean() for seed, r in by_seed.items()}
        mean = np.mean(list(means.values()))
        error = spread * np.sqrt(1 / len(means) + 1 / len(values))
        paired = [means[s] - command[s] for s in means if s in command]
        print(f"{variant:22s} {len(means):4d} {','.join(map(str, sorted(means))):12s} {mean:7.4f} "
              f"{mean - center:+8.4f} ({error:.4f}) {np.mean(paired) if paired else float('nan'):+15.4f}")
        if len(means) > 1:
            for seed, value in means.items():
                if seed in command:
                    distance.append(value - mean)
                    carried.append(command[seed] - center)
    print(f"\nwhat a seed carries across configurations: correlation {np.corrcoef(distance, carried)[0, 1]:.2f} "
          f"over {len(distance)} runs")
    # "bias..." runs are a trained run decoded with a co-location bias: a diagnostic outside the
    # package (docs/RESULTS.md, session 30), not a policy the package can ship.
    ranked = [(int((r > args.tail).sum()), r.mean(), r.max(), f"{v}_seed{s}")
              for v, by_seed in {**runs, args.command: command_runs}.items() if not v.startswith("bias")
              for s, r in by_seed.items()]
    print(f"\nthe rule (no row over {args.tail}x first, then the lowest mean); trained runs only, first 10:")
    for over, mean, worst, tag in sorted(ranked)[:10]:
        print(f"  {tag:28s} rows over {args.tail}x: {over}  mean {mean:.3f}  worst {worst:.3f}")
    if others:
        print("not one training run (not ranked): " + ", ".join(
            f"{t} {r.mean():.3f} ({int((r > args.tail).sum())} over)" for t, r in sorted(others.items())))


if __name__ == "__main__":
    main()
