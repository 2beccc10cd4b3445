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
- per variant: its runs' mean, the controls' (untrained weights' and uniform random actions'
  step time over zero-shot's, row by row from the same random starts, from
  `DOCS/validation{,_53-55_}controls.json`; the runs are of the command's 25600 episodes but
  those docs/RESULTS.md says were stopped earlier, the grouped4 pair at 18176 and 18944), its
  difference from the command's mean with a standard error
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


def rows_of(docs: str, tag: str) -> list[dict] | None:
    """The 54 validation rows of TAG (None if incomplete)."""
    rows = []
    for half in ("", "_53-55"):
        path = os.path.join(docs, f"validation{half}_{tag}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            rows += json.load(f)
    return rows if len(rows) == 54 else None


def over_best(rows: list[dict]) -> np.ndarray:
    """Zero-shot over the best fast baseline, row by row."""
    return np.array([r["zero_shot_s"] / r["best_baseline_s"] for r in rows])


def controls_over(rows: list[dict], controls: dict, key: str) -> float:
    """The mean of a control's step time (`key`: "untrained_s" or "random_actions_s") over
    zero-shot's, row by row (`controls`: (graph, cluster) -> its row)."""
    return float(np.mean([controls[(r["graph"], r["cluster"])][key] / r["zero_shot_s"] for r in rows]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", default=os.path.join(os.path.dirname(__file__), "..", "docs"))
    parser.add_argument("--command", default="reproducible", help="the shipped command's variant name")
    parser.add_argument("--tail", type=float, default=1.2)
    args = parser.parse_args()

    controls = {(r["graph"], r["cluster"]): r for r in rows_of(args.docs, "controls") or []}
    if not controls:
        raise SystemExit(f"no validation controls in {args.docs}")
    runs: dict[str, dict[int, list[dict]]] = {}
    others: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(args.docs, "validation_53-55_*.json"))):
        tag = os.path.basename(path)[len("validation_53-55_"):-len(".json")]
        rows = rows_of(args.docs, tag)
        if rows is None or tag == "controls":
            continue
        match = re.fullmatch(r"(.+)_seed(\d+)", tag)
        if match:
            runs.setdefault(match.group(1), {})[int(match.group(2))] = rows
        else:
            others[tag] = rows
    if args.command not in runs:
        raise SystemExit(f"no runs of {args.command!r} in {args.docs}")

    def figures(by_seed: dict[int, list[dict]]) -> tuple[dict[int, float], str]:
        """Each run's mean over the best fast baseline, and the controls over zero-shot (mean over the runs)."""
        means = {seed: float(over_best(rows).mean()) for seed, rows in by_seed.items()}
        untrained, random = (np.mean([controls_over(rows, controls, key) for rows in by_seed.values()])
                             for key in ("untrained_s", "random_actions_s"))
        return means, f"{untrained:5.2f}x {random:5.2f}x"

    command_runs = runs.pop(args.command)
    command, command_controls = figures(command_runs)
    values = np.array(list(command.values()))
    center, spread = values.mean(), values.std(ddof=1)
    print(f"the command ({args.command}), {len(values)} seeds: "
          + ", ".join(f"{s}: {v:.3f}" for s, v in sorted(command.items()))
          + f"; mean {center:.4f}, standard deviation {spread:.4f}; untrained / zero-shot, random / zero-shot "
          + command_controls)
    print(f"\n{'variant':22s} {'runs':>4s} {'seeds':12s} {'mean':>7s} {'- command mean':>16s} {'paired by seed':>15s}"
          "  untrained / zs, random / zs")
    distance, carried = [], []
    for variant, by_seed in sorted(runs.items()):
        means, controls_text = figures(by_seed)
        mean = np.mean(list(means.values()))
        error = spread * np.sqrt(1 / len(means) + 1 / len(values))
        paired = [means[s] - command[s] for s in means if s in command]
        print(f"{variant:22s} {len(means):4d} {','.join(map(str, sorted(means))):12s} {mean:7.4f} "
              f"{mean - center:+8.4f} ({error:.4f}) {np.mean(paired) if paired else float('nan'):+15.4f}"
              f"  {controls_text}")
        if len(means) > 1:
            for seed, value in means.items():
                if seed in command:
                    distance.append(value - mean)
                    carried.append(command[seed] - center)
    print(f"\nwhat a seed carries across configurations: correlation {np.corrcoef(distance, carried)[0, 1]:.2f} "
          f"over {len(distance)} runs")
    # "bias..." runs are a trained run decoded with a co-location bias: a diagnostic outside the
    # package (docs/RESULTS.md, session 30), not a policy the package can ship.
    def rank(rows: list[dict]) -> tuple[int, float, float]:  # (rows over the tail, mean, worst)
        ratios = over_best(rows)
        return int((ratios > args.tail).sum()), float(ratios.mean()), float(ratios.max())

    ranked = sorted((*rank(rows), f"{v}_seed{s}")
                    for v, by_seed in {**runs, args.command: command_runs}.items() if not v.startswith("bias")
                    for s, rows in by_seed.items())
    print(f"\nthe rule (no row over {args.tail}x first, then the lowest mean); trained runs only, first 10:")
    for over, mean, worst, tag in ranked[:10]:
        print(f"  {tag:28s} rows over {args.tail}x: {over}  mean {mean:.3f}  worst {worst:.3f}")
    if others:
        print("not one training run (not ranked): " + ", ".join(
            f"{t} {rank(rows)[1]:.3f} ({rank(rows)[0]} over)" for t, rows in sorted(others.items())))

if __name__ == "__main__":
    main()
