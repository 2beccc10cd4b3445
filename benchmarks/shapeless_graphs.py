"""The silent wrong answer of issue 13: a tf.function training step handed over as its GraphDef.

A tf.function's graph exported with `as_graph_def()` has its variables as shapeless resource
placeholders, so the ops reading them have unknown shapes and guessed (near zero) costs. For each
Keras application, one training step (forward, loss, backward, SGD update) is traced as a
ConcreteFunction and imported three ways, side by side:
- `GraphDef`: `cf.graph.as_graph_def()`: no shapes to infer from; tfplaceto warns and reports how
  many compute ops have unknown shapes;
- `FuncGraph`: `cf.graph`: its captures still hold the variables, so the shapes are inferred;
- `ConcreteFunction`: `cf` itself (the reference).
Figures: ops, compute ops with unknown shapes (and their share of the estimated compute), total
estimated compute on the fastest device (ms) and the lower bound (ms) on the cluster, and the
ratio of each total to the ConcreteFunction's.

Run: .venv/bin/python benchmarks/shapeless_graphs.py [--models MobileNetV2,ResNet50]
     [--cluster 2xV100] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def training_step(model_name: str, batch_size: int):
    """The ConcreteFunction of one SGD training step of a Keras application (random weights)."""
    import tensorflow as tf

    model = getattr(tf.keras.applications, model_name)(weights=None)
    optimizer = tf.keras.optimizers.SGD(0.01)
    height, width, channels = model.input_shape[1:]

    @tf.function(input_signature=[tf.TensorSpec([batch_size, height, width, channels]),
                                  tf.TensorSpec([batch_size], tf.int32)])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step.get_concrete_function(), (model, optimizer)


def figures(source, cluster_name: str) -> dict:
    import tfplaceto as tp
    from tfplaceto.costs.unknown_shapes import count_unknown_shapes

    cluster = tp.Cluster.preset(cluster_name)
    op_graph = tp.import_graph(source)
    costs = tp.profile(op_graph, cluster)
    compute = costs.per_device(op_graph, cluster)
    shapes = count_unknown_shapes(op_graph, compute)
    return {"ops": op_graph.num_ops, "unknown": shapes.ops, "compute_ops": shapes.compute_ops,
            "share": shapes.compute_share, "total_ms": float(compute.min(1).sum()) * 1e3,
            "bound_ms": tp.lower_bound(op_graph, cluster, costs) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="MobileNetV2,ResNet50")
    parser.add_argument("--cluster", default="2xV100")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    print(f"{'model':<12} {'imported as':<17} {'ops':>6} {'unknown-shape compute ops':>27} "
          f"{'compute ms':>10} {'x CF':>6} {'bound ms':>9} {'x CF':>6}")
    for name in args.models.split(","):
        function, keep = training_step(name, args.batch_size)
        rows = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, source in (("GraphDef", function.graph.as_graph_def()), ("FuncGraph", function.graph),
                                  ("ConcreteFunction", function)):
                rows[label] = figures(source, args.cluster)
        reference = rows["ConcreteFunction"]
        for label, row in rows.items():
            unknown = f"{row['unknown']} of {row['compute_ops']} ({row['share']:.1%})"
            print(f"{name:<12} {label:<17} {row['ops']:>6} {unknown:>27} {row['total_ms']:>10.3f} "
                  f"{row['total_ms'] / reference['total_ms']:>6.3f} {row['bound_ms']:>9.3f} "
                  f"{row['bound_ms'] / reference['bound_ms']:>6.3f}", flush=True)
        del keep


if __name__ == "__main__":
    main()
