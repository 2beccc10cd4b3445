"""Saving and loading a trained Placeto policy (its network config and weights).

`save_policy` writes a directory (replaced as a whole, so a reader never sees half of one):
`policy.json` (network config, feature names, notes) and `weights` (the Sonnet network's
checkpoint), and, when given a TF-Agents `PolicySaver`, `saved_policy/` beside them: the policy as
a SavedModel that TF-Agents users load with `tf.saved_model.load` (or
`tf_agents.policies.py_tf_eager_policy.SavedModelPyTFEagerPolicy`) and call `action(time_step)`
on, with no tfplaceto code. That SavedModel holds the packed statics of the problems it was
trained on, so it acts on those problems' observations (`PlacementEnvironment(problems)`);
`load_policy` reads the network back, which acts on any graph; `ensemble_policies` makes one
policy of several (an ensemble of their networks); `resolve_policy` turns what users pass as `policy=` ("shipped",
"untrained", a directory, or a network) into a network. The shipped policy lives in
`pretrained/` beside this file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from tfplaceto import errors
from tfplaceto.outputs import atomic_directory, check_writable_directory, is_inside
from tfplaceto.policy.network import PlacetoNetwork

PRETRAINED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained")
_CONFIG = "policy.json"
_WEIGHTS = "weights"


SAVED_POLICY = "saved_policy"


def save_policy(network, directory: str, notes: dict | None = None, saver=None) -> None:
    """Writes `network`'s config and weights to `directory` (replaced as a whole); with `saver`
    (a `tf_agents.policies.policy_saver.PolicySaver` of a policy over `network`) also its
    SavedModel in `directory/saved_policy`."""
    import tensorflow as tf

    network.warm_up()  # a network never called yet has no variables to save
    with atomic_directory(directory) as tmp:
        tf.train.Checkpoint(network=network).write(os.path.join(tmp, _WEIGHTS))
        with open(os.path.join(tmp, _CONFIG), "w") as f:
            json.dump({"network": network.config, "features": network.feature_widths, "notes": notes or {}},
                      f, indent=1)
        if saver is not None:
            _export_saved_policy(saver, os.path.join(tmp, SAVED_POLICY))


def _export_saved_policy(saver, path: str) -> None:
    """`saver.save(path)`, without the notices it logs for every nested input name."""
    import warnings

    from absl import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # "`0/step_type` is not a valid tf.function parameter name"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Encoding a StructuredValue with type ..."
            saver.save(path)
    finally:
        logging.set_verbosity(verbosity)


def _read_config(directory: str) -> dict:
    """The policy.json of a policy directory (OSError or ValueError when it cannot be read)."""
    with open(os.path.join(directory, _CONFIG)) as f:
        return json.load(f)


def load_policy(directory: str | None = None):
    """The PlacetoNetwork saved in `directory` (default: the shipped one).

    Raises PolicyError when the directory holds no policy, a corrupted one, or one made for
    other features.
    """
    import tensorflow as tf

    directory = directory or PRETRAINED_DIR
    path = os.path.join(directory, _CONFIG)
    if not os.path.exists(path):
        raise errors.PolicyError(f"no policy in {directory} (no {_CONFIG}); give the policy "
                                 "directory a training run exported (LOGDIR/policy)")
    try:
        config = _read_config(directory)
        features = config.get("features")
        network_config = dict(config["network"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise errors.PolicyError(f"the policy in {directory} is corrupted ({_CONFIG}: "
                                 f"{errors.first_line(e)}); train or copy it again") from None
    try:
        network = PlacetoNetwork(**network_config)
    except (TypeError, errors.InvalidArgumentError) as e:
        raise errors.PolicyError(f"the policy in {directory} has a network config this version cannot "
                                 f"build ({errors.first_line(e)}); retrain it") from None
    if features != network.feature_widths:
        raise errors.PolicyError(f"the policy in {directory} was trained on other features "
                                 f"({features}; this version has {network.feature_widths}); retrain it")
    try:
        network.warm_up()
        tf.train.Checkpoint(network=network).read(os.path.join(directory, _WEIGHTS)).assert_consumed()
    except (tf.errors.OpError, ValueError, TypeError, AssertionError) as e:
        raise errors.PolicyError(f"the policy weights in {directory} cannot be read "
                                 f"({errors.first_line(e)}); train or copy it again") from None
    return network


def ensemble_policies(directories: Sequence[str], directory: str, overwrite: bool = False) -> PlacetoNetwork:
    """Writes to `directory` one policy whose members are the networks of the policies saved in
    `directories` (each one network or an ensemble: all its members, in order), and returns it.

    The result picks by the mean of its members' log-probabilities (`PlacetoNetwork(ensemble=K)`),
    so policies trained apart (say runs of seeds s .. s+K-1 on as many machines) act as one. A run
    with `train.ensemble = K` and seed s clones member k as a run of seed s + k clones its network
    (`tfplaceto.rl.cloning.clone`), so the ensemble of such runs' clones is that run's policy
    before its reinforcement learning. The policies must share one network config but for the
    seed; `directory` must not exist unless `overwrite` (it is then replaced as a whole) and may not
    be or lie in one of `directories`.
    Raises PolicyError, InvalidArgumentError, OutputExistsError or OutputPathError before any work.
    """
    directories = [os.fspath(d) for d in directories]
    for source in directories:
        if is_inside(os.path.realpath(directory), os.path.realpath(source)):
            raise errors.OutputExistsError(f"the ensemble {directory!r} would overwrite its policy {source!r}; "
                                           "write it elsewhere")
    if os.path.lexists(directory) and not overwrite:
        raise errors.OutputExistsError(f"the ensemble {directory!r} exists; pass --overwrite "
                                       "(overwrite=True) to replace it")
    check_writable_directory(os.path.dirname(os.path.abspath(directory)), f"the ensemble {directory!r}")
    sources = [load_policy(d) for d in directories]
    members = [member for source in sources for member in (source.members or [source])]
    if len(members) < 2:
        raise errors.InvalidArgumentError(f"an ensemble needs two networks or more, got {len(members)}")
    for path, source in zip(directories[1:], sources[1:]):
        differ = sorted(k for k, value in source.config.items()
                        if k not in ("seed", "ensemble") and value != sources[0].config.get(k))
        if differ:
            raise errors.PolicyError(f"the policy in {path} has another network config than the one in "
                                     f"{directories[0]} ({', '.join(differ)}): an ensemble has one")
    ensemble = PlacetoNetwork(**{**sources[0].config, "ensemble": len(members)})
    ensemble.warm_up()
    for target, source in zip(ensemble.members, members):
        for variable, value in zip(target.variables, source.variables, strict=True):
            variable.assign(value)
    save_policy(ensemble, directory, notes={"ensemble_of": [os.path.abspath(d) for d in directories]})
    return ensemble


def resolve_policy(policy=None, seed: int = 0):
    """The network `policy=` names: "shipped" (or None), "untrained" (fresh weights, seeded, in
    the shipped configuration: the control), a directory, or a PlacetoNetwork (returned as is)."""
    if isinstance(policy, PlacetoNetwork):
        return policy
    if policy in (None, "shipped"):
        return load_policy(PRETRAINED_DIR)
    if policy == "untrained":
        return untrained_network(seed)
    if not isinstance(policy, str | os.PathLike):
        raise errors.PolicyError(f"policy must be 'shipped', 'untrained' or a directory, got {policy!r}")
    return load_policy(os.fspath(policy))


def untrained_network(seed: int = 0):
    """Fresh weights (seeded) in the shipped policy's configuration (the defaults without one)."""
    try:
        config = _read_config(PRETRAINED_DIR)["network"]
    except (OSError, ValueError, KeyError, TypeError):
        config = {}
    network = PlacetoNetwork(**{**config, "seed": seed})
    network.warm_up()
    return network
