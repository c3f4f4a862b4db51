"""Distilling your own model: a conv teacher from your run_fn into your small conv student.

Everything a TFX user would write is in `benchmarks/your_model/` (tf.keras
module files, no tfxkit import): a Fashion-MNIST `preprocessing_fn`, a
convolutional teacher's `run_fn` (about 585k parameters, translate / flip
augmentation) and a small convolutional student (about 56k, under a tenth)
with both a `student_fn` (for the Distiller) and a `run_fn` (to train it
alone). One TFX pipeline per setting runs through BeamDagRunner:
ImportExampleGen, the tfxkit Transform and Trainers (the two-import swap),
then per student seed the student alone without and with augmentation (the
stock-compatible Trainer) and the student distilled by the Distiller
(teacher-target cache, clean images, alpha 0.5, T 2). The teacher is trained
once per setting and shared by the seeds; the pipeline's cache keeps it
across runs of this benchmark.

Settings: `scarce` (the headline) keeps 10% of the training labels; the
other 54,000 images are an unlabeled transfer set (label -1) that only the
Distiller learns from (the models trained alone drop them); `all` keeps
every label. Accuracy is on the 10,000-image test set through each model's
serving signature.

    python -m benchmarks.distill_your_model [--settings scarce,all] [--seeds 3]
        [--teacher-steps 6000] [--student-steps 12000] [--workdir DIR]

JSON lines: one per model, one per setting, and last
`{"settings": [...]}` with per setting `labeled_fraction`, `seeds`,
`teacher_acc`, `alone_acc`, `alone_aug_acc`, `distilled_acc` (each with
`_std`), `distilled_minus_best_alone`, `distilled_minus_best_alone_se`,
`gap_recovered`, `param_ratio`, `model_latency_ratio_b256`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from components.testing.stats import diff_se, mean_std

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = os.path.join(REPO, "benchmarks", "your_model")
SETTINGS = {"scarce": 0.1, "all": 1.0}
ALPHA, TEMPERATURE = 0.5, 2.0


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def write_examples(directory: str, labeled_fraction: float, limit: int = 0) -> None:
    """Fashion-MNIST as raw tf.Examples: `train/` (labels kept for `labeled_fraction`, else -1), `eval/`."""
    import tensorflow as tf

    from components.data import fashion_mnist

    rng = np.random.default_rng(0)
    for split in ("train", "eval"):
        images, labels = fashion_mnist.load_split(split)
        if limit:
            images, labels = images[:limit], labels[:limit]
        labels = labels.astype(np.int64)
        if split == "train" and labeled_fraction < 1.0:
            keep = rng.permutation(len(labels))[: int(round(labeled_fraction * len(labels)))]
            masked = np.full_like(labels, -1)
            masked[keep] = labels[keep]
            labels = masked
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        path = os.path.join(directory, split, "data.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for image, label in zip(images.reshape(len(images), -1), labels, strict=True):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=image.astype(np.int64))
                            ),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                )
                writer.write(example.SerializeToString())


def student_ids(seed: int) -> dict[str, str]:
    return {
        "alone": f"StudentAlone_{seed}",
        "alone_aug": f"StudentAloneAug_{seed}",
        "distilled": f"Distiller_{seed}",
    }


def create_pipeline(
    root: str, data: str, seeds, teacher_steps: int, student_steps: int, eval_steps: int
):
    """The user's pipeline: their modules through tfxkit's Transform, Trainer and Distiller."""
    from tfx import v1 as tfx

    from components.distiller.component import Distiller
    from components.trainer.component import Trainer
    from components.transform.component import Transform

    example_gen = tfx.components.ImportExampleGen(
        input_base=data,
        input_config=tfx.proto.Input(
            splits=[
                tfx.proto.Input.Split(name="train", pattern="train/*"),
                tfx.proto.Input.Split(name="eval", pattern="eval/*"),
            ]
        ),
    )
    statistics = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"])
    transform = Transform(
        examples=example_gen.outputs["examples"],
        schema=schema.outputs["schema"],
        module_file=os.path.join(MODULES, "preprocessing.py"),
    )
    common = dict(
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        eval_args=tfx.proto.EvalArgs(num_steps=eval_steps),
    )
    teacher = Trainer(
        module_file=os.path.join(MODULES, "teacher.py"),
        train_args=tfx.proto.TrainArgs(num_steps=teacher_steps),
        custom_config={"seed": 0},
        **common,
    ).with_id("Teacher")
    nodes = [example_gen, statistics, schema, transform, teacher]
    for seed in seeds:
        ids = student_ids(seed)
        for key, augment in (("alone", False), ("alone_aug", True)):
            nodes.append(
                Trainer(
                    module_file=os.path.join(MODULES, "student.py"),
                    train_args=tfx.proto.TrainArgs(num_steps=student_steps),
                    custom_config={"seed": seed, "augment": augment},
                    **common,
                ).with_id(ids[key])
            )
        nodes.append(
            Distiller(
                module_file=os.path.join(MODULES, "student.py"),
                teacher_models=[teacher.outputs["model"]],
                train_args=tfx.proto.TrainArgs(num_steps=student_steps),
                config={
                    "train": {"seed": seed, "learning_rate": 1e-3, "lr_schedule": "cosine"},
                    "ingestion": {"batch_size": 128},
                    "distillation": {
                        "alpha": ALPHA,
                        "temperature": TEMPERATURE,
                        "cache_teacher_logits": True,
                    },
                },
                **common,
            ).with_id(ids["distilled"])
        )
    return tfx.dsl.Pipeline(
        pipeline_name="distill_your_model",
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=nodes,
        enable_cache=True,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            os.path.join(root, "metadata.db")
        ),
        beam_pipeline_args=["--direct_running_mode=in_memory", "--direct_num_workers=1"],
    )


def model_dir(root: str, node: str) -> str:
    """The newest serving model a node wrote."""
    base = os.path.join(root, "pipeline_root", node, "model")
    newest = max(os.listdir(base), key=int)
    return os.path.join(base, newest, "Format-Serving")


def stage_seconds(root: str) -> dict[str, float]:
    """Seconds of each node's newest execution, from ML Metadata (0 for a cache hit)."""
    import ml_metadata as mlmd
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = os.path.join(root, "metadata.db")
    store = mlmd.MetadataStore(config)
    seconds = {}
    for context in store.get_contexts_by_type("node"):
        executions = store.get_executions_by_context(context.id)
        if not executions:
            continue
        last = max(executions, key=lambda e: e.id)
        cached = last.last_known_state == metadata_store_pb2.Execution.CACHED
        node = context.name.split(".", 1)[-1]
        seconds[node] = (
            0.0
            if cached
            else round((last.last_update_time_since_epoch - last.create_time_since_epoch) / 1000, 1)
        )
    return seconds


def eval_examples(data: str) -> tuple[list[bytes], np.ndarray]:
    import tensorflow as tf

    records, labels = [], []
    for record in tf.data.TFRecordDataset(os.path.join(data, "eval", "data.tfrecord")):
        raw = record.numpy()
        records.append(raw)
        labels.append(
            tf.train.Example.FromString(raw).features.feature["label"].int64_list.value[0]
        )
    return records, np.asarray(labels)


def measure(serving_dir: str, records: list[bytes], labels: np.ndarray) -> dict:
    """Accuracy through the serving signature; parameters; latency at batch 256 (model and signature)."""
    import tensorflow as tf

    from components.distillation.model import count_params

    loaded = tf.saved_model.load(serving_dir)
    serve = loaded.signatures["serving_default"]
    predictions = []
    for i in range(0, len(records), 1000):
        (out,) = serve(examples=tf.constant(records[i : i + 1000])).values()
        predictions.append(np.argmax(out.numpy(), axis=-1))
    accuracy = float(np.mean(np.concatenate(predictions) == labels))
    batch = tf.constant(records[:256])
    images = {"image_xf": tf.random.uniform([256, 28, 28, 1], seed=0)}

    def median_ms(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(20):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1000 * float(np.median(times))

    return {
        "accuracy": accuracy,
        "params": count_params(loaded.trainable_variables),
        "model_ms_b256": median_ms(lambda: loaded(images, training=False)),
        "serving_ms_b256": median_ms(lambda: serve(examples=batch)),
    }


def summarize(setting: str, fraction: float, seeds, models: dict) -> dict:
    """The setting's figures from `models`: node id -> `measure` result."""
    teacher = models["Teacher"]
    accs = {
        key: [models[student_ids(seed)[key]]["accuracy"] for seed in seeds]
        for key in ("alone", "alone_aug", "distilled")
    }
    stats = {key: mean_std(values) for key, values in accs.items()}
    best = max(("alone", "alone_aug"), key=lambda key: stats[key][0])
    gain = stats["distilled"][0] - stats[best][0]
    gap = teacher["accuracy"] - stats[best][0]
    distilled = [models[student_ids(seed)["distilled"]] for seed in seeds]
    return {
        "setting": setting,
        "labeled_fraction": fraction,
        "seeds": len(seeds),
        "teacher_acc": teacher["accuracy"],
        **{f"{key}_acc": stats[key][0] for key in ("alone", "alone_aug", "distilled")},
        **{f"{key}_acc_std": stats[key][1] for key in ("alone", "alone_aug", "distilled")},
        "best_alone": best,
        "distilled_minus_best_alone": gain,
        "distilled_minus_best_alone_se": diff_se(accs["distilled"], accs[best]),
        "gap_recovered": gain / gap if gap > 0 else None,
        "param_ratio": distilled[0]["params"] / teacher["params"],
        "model_latency_ratio_b256": float(np.mean([d["model_ms_b256"] for d in distilled]))
        / teacher["model_ms_b256"],
        "serving_latency_ratio_b256": float(np.mean([d["serving_ms_b256"] for d in distilled]))
        / teacher["serving_ms_b256"],
    }


def run_setting(args, setting: str) -> dict:
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    fraction = SETTINGS[setting]
    root = os.path.join(args.workdir, setting)
    data = os.path.join(root, "data")
    if not os.path.isdir(os.path.join(data, "eval")):
        write_examples(data, fraction, args.limit)
    seeds = list(range(args.seeds))
    pipeline = create_pipeline(
        root, data, seeds, args.teacher_steps, args.student_steps, args.eval_steps
    )
    start = time.perf_counter()
    BeamDagRunner().run(pipeline)
    wall = time.perf_counter() - start
    records, labels = eval_examples(data)
    models = {}
    for node in ["Teacher", *(i for seed in seeds for i in student_ids(seed).values())]:
        models[node] = measure(model_dir(root, node), records, labels)
        emit({"setting": setting, "model": node, **models[node]})
    summary = summarize(setting, fraction, seeds, models)
    summary["seconds"] = {"pipeline_wall": round(wall, 1), **stage_seconds(root)}
    summary["steps"] = {"teacher": args.teacher_steps, "student": args.student_steps}
    emit(summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="scarce,all")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--teacher-steps", type=int, default=6000)
    parser.add_argument("--student-steps", type=int, default=12000)
    parser.add_argument("--eval-steps", type=int, default=20)
    parser.add_argument("--limit", type=int, default=0, help="images per split (0: all)")
    parser.add_argument("--workdir", default=os.path.join(REPO, ".bench", "distill_your_model"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    keys = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(keys) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: unknown {unknown}; choose from {sorted(SETTINGS)}")
    summaries = [run_setting(args, setting) for setting in keys]
    # Exactly the keys, so runs compare by them (a setting is its labeled_fraction).
    keep = (
        "labeled_fraction seeds teacher_acc alone_acc alone_acc_std alone_aug_acc "
        "alone_aug_acc_std distilled_acc distilled_acc_std distilled_minus_best_alone "
        "distilled_minus_best_alone_se gap_recovered param_ratio model_latency_ratio_b256"
    ).split()
    emit({"settings": [{k: s[k] for k in keep} for s in summaries]})


if __name__ == "__main__":
    main(sys.argv[1:])
