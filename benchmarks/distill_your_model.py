"""Distilling your own model: a conv teacher from your run_fn into your small conv student.

Everything a TFX user would write is in `benchmarks/your_model/` (tf.keras
module files, no tfxkit import): a Fashion-MNIST `preprocessing_fn`, a
convolutional teacher's `run_fn` (about 585k parameters, translate / flip
augmentation) and a small convolutional student (about 56k, under a tenth)
with both a `student_fn` (for the Distiller) and a `run_fn` (to train it
alone). Each stage is one TFX pipeline through BeamDagRunner:
ImportExampleGen, the tfxkit Transform and Trainers (the two-import swap),
and the Distiller (teacher-target cache, clean images).

Data: the official 60,000 training images split once (a fixed permutation,
seed 0) into 55,000 to train on (`train`) and 5,000 to choose settings on
(`eval`: the split every Trainer and Distiller evaluates on); the official
10,000 test images (`test`) are read once per final model, through its
serving signature. `scarce` keeps 10% of the 55,000 training labels; the
other images are an unlabeled transfer set (label -1) that only the
Distiller learns from (the models trained alone drop them); `all` keeps
every label.

Per setting, as a skeptic asks (issue 37):

1. **choice**, on the validation split, with seeds outside the trials': one
   teacher; the student alone without and with augmentation (what a user
   would train instead; the better one is the baseline); the student
   distilled at each (alpha, T) of `CANDIDATES`.
2. **trials**: `len(TEACHER_SEEDS)` teachers; per student seed (`--seeds`,
   at least 5), the chosen student alone, the student distilled at the
   chosen (alpha, T) from teacher `seed mod len(TEACHER_SEEDS)`, and an
   alpha = 0 control trained through the Distiller's own input pipeline
   (hard labels only), so the pipeline cannot be the cause of a gain.
   Differences are paired by seed, with 95% t intervals on n - 1 degrees of
   freedom.

Resuming and reuse: each stage's pipeline runs with TFX's cache on, under a
root keyed by the code the models depend on (`revision_key`: the git trees
of `components/` and `benchmarks/your_model/`; a work tree with changes
gets a root of its own), so a run stopped partway resumes where it stopped,
across sessions and commits that change neither, and no model trained by
other code is reused.

    python -m benchmarks.distill_your_model [--settings scarce,all] [--seeds 5]
        [--teacher-steps 6000] [--student-steps 12000] [--workdir DIR]
        [--shared-with TEXT] [--no-results]

JSON lines: one per model, one per setting, and last `{"settings": [...]}`
with per setting `labeled_fraction`, `seeds`, `teachers`, `choice`,
`teacher_acc`, `alone_acc`, `distilled_acc`, `control_acc`,
`distilled_minus_alone` and `distilled_minus_control` (each with its
`_ci95`), `gap_recovered`, `param_ratio`, `model_latency_ratio_b256`; the
file `benchmarks/results/distill_your_model.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

from components.testing import results as results_lib
from components.testing.stats import TooFewError, t_interval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = os.path.join(REPO, "benchmarks", "your_model")
SETTINGS = {"scarce": 0.1, "all": 1.0}
SPLITS = ("train", "eval", "test")
VALIDATION = 5000
# (alpha, T) candidates; the older design's fixed 0.5 / 2 is one of them.
CANDIDATES = ((0.5, 1.0), (0.5, 2.0), (0.9, 4.0))
CHOICE_SEED = 900
TEACHER_SEEDS = (100, 101)


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def split_indices(count: int, validation: int = VALIDATION) -> tuple[np.ndarray, np.ndarray]:
    """The official training images' indices to train on and to validate on (fixed, seed 0)."""
    order = np.random.default_rng(0).permutation(count)
    return np.sort(order[validation:]), np.sort(order[:validation])


def masked_labels(labels: np.ndarray, labeled_fraction: float) -> np.ndarray:
    """`labels` with all but `labeled_fraction` of them (a fixed choice, seed 0) set to -1."""
    labels = labels.astype(np.int64)
    if labeled_fraction >= 1.0:
        return labels
    keep = np.random.default_rng(0).permutation(len(labels))[
        : int(round(labeled_fraction * len(labels)))
    ]
    masked = np.full_like(labels, -1)
    masked[keep] = labels[keep]
    return masked


def write_examples(directory: str, labeled_fraction: float, limit: int = 0) -> None:
    """Fashion-MNIST as raw tf.Examples in `SPLITS`: `train` (labels kept for
    `labeled_fraction`, else -1), `eval` (the validation images, every label), `test`."""
    import tensorflow as tf

    from components.data import fashion_mnist

    images, labels = fashion_mnist.load_split("train")
    test_images, test_labels = fashion_mnist.load_split("eval")
    if limit:
        images, labels = images[:limit], labels[:limit]
        test_images, test_labels = test_images[:limit], test_labels[:limit]
    train, valid = split_indices(len(labels), min(VALIDATION, len(labels) // 10))
    splits = {
        "train": (images[train], masked_labels(labels[train], labeled_fraction)),
        "eval": (images[valid], labels[valid].astype(np.int64)),
        "test": (test_images, test_labels.astype(np.int64)),
    }
    for split, (split_images, split_labels) in splits.items():
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        path = os.path.join(directory, split, "data.tfrecord")
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for image, label in zip(
                split_images.reshape(len(split_images), -1), split_labels, strict=True
            ):
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
        os.replace(path + ".tmp", path)


# What the trained models depend on beyond the pipeline's own arguments (which
# TFX's cache already keys on): the product and the user's module files.
CODE_PATHS = ("components", "benchmarks/your_model")


def code_trees(cwd: str = REPO) -> dict[str, str | None]:
    """The git tree id of each of `CODE_PATHS` at HEAD (None where git cannot say)."""
    trees = {}
    for path in CODE_PATHS:
        out = subprocess.run(
            ["git", "rev-parse", f"HEAD:{path}"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        trees[path] = out.stdout.strip() if out.returncode == 0 else None
    return trees


def revision_key(trees: dict[str, str | None] | None = None, dirty: bool | None = None) -> str:
    """The directory name of this code's runs: a digest of the `CODE_PATHS` trees, so a
    run resumes across commits that change neither; with changes to them not committed
    (or no git), a name no other run shares, so no model trained by other code is reused."""
    trees = code_trees() if trees is None else trees
    if dirty is None:
        files = results_lib.commit()["dirty_files"]
        dirty = files is None or any(
            f.startswith(tuple(p + "/" for p in CODE_PATHS)) for f in files
        )
    key = hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:12]
    if dirty is not False or None in trees.values():
        key += "-dirty-" + hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:8]
    return key


def teacher_id(seed: int) -> str:
    return f"Teacher_{seed}"


def alone_id(seed: int, augment: bool) -> str:
    return f"StudentAlone{'Aug' if augment else ''}_{seed}"


def distilled_id(seed: int, alpha: float, temperature: float) -> str:
    return f"Distilled_{seed}_a{alpha:g}_T{temperature:g}".replace(".", "p")


def choice_nodes() -> dict:
    """The choice stage's models: node id -> what to train."""
    nodes = {teacher_id(CHOICE_SEED): {"kind": "teacher", "seed": CHOICE_SEED}}
    for augment in (False, True):
        nodes[alone_id(CHOICE_SEED, augment)] = {
            "kind": "alone",
            "seed": CHOICE_SEED,
            "augment": augment,
        }
    for alpha, temperature in CANDIDATES:
        nodes[distilled_id(CHOICE_SEED, alpha, temperature)] = {
            "kind": "distilled",
            "seed": CHOICE_SEED,
            "teacher": CHOICE_SEED,
            "alpha": alpha,
            "temperature": temperature,
        }
    return nodes


def trial_nodes(seeds, choice: dict) -> dict:
    """The trials' models: the teachers, then per seed the chosen student alone, the
    student distilled at the chosen (alpha, T) and its alpha = 0 control."""
    nodes = {teacher_id(t): {"kind": "teacher", "seed": t} for t in TEACHER_SEEDS}
    for seed in seeds:
        teacher = TEACHER_SEEDS[seed % len(TEACHER_SEEDS)]
        nodes[alone_id(seed, choice["alone_augment"])] = {
            "kind": "alone",
            "seed": seed,
            "augment": choice["alone_augment"],
        }
        for alpha in (choice["alpha"], 0.0):
            nodes[distilled_id(seed, alpha, choice["temperature"])] = {
                "kind": "distilled",
                "seed": seed,
                "teacher": teacher,
                "alpha": alpha,
                "temperature": choice["temperature"],
            }
    return nodes


def create_pipeline(
    root: str,
    data: str,
    nodes: dict,
    teacher_steps: int,
    student_steps: int,
    eval_steps: int,
):
    """The user's pipeline: their modules through tfxkit's Transform, Trainer and Distiller."""
    from tfx import v1 as tfx

    from components.distiller.component import Distiller
    from components.trainer.component import Trainer
    from components.transform.component import Transform

    example_gen = tfx.components.ImportExampleGen(
        input_base=data,
        input_config=tfx.proto.Input(
            splits=[tfx.proto.Input.Split(name=s, pattern=f"{s}/*") for s in SPLITS]
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
        eval_args=tfx.proto.EvalArgs(splits=["eval"], num_steps=eval_steps),
    )
    built = {}
    for node, spec in nodes.items():
        if spec["kind"] == "teacher":
            built[node] = Trainer(
                module_file=os.path.join(MODULES, "teacher.py"),
                train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=teacher_steps),
                custom_config={"seed": spec["seed"]},
                **common,
            ).with_id(node)
    for node, spec in nodes.items():
        if spec["kind"] == "alone":
            built[node] = Trainer(
                module_file=os.path.join(MODULES, "student.py"),
                train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=student_steps),
                custom_config={"seed": spec["seed"], "augment": spec["augment"]},
                **common,
            ).with_id(node)
        elif spec["kind"] == "distilled":
            built[node] = Distiller(
                module_file=os.path.join(MODULES, "student.py"),
                teacher_models=[built[teacher_id(spec["teacher"])].outputs["model"]],
                train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=student_steps),
                config={
                    "train": {"seed": spec["seed"], "learning_rate": 1e-3, "lr_schedule": "cosine"},
                    "ingestion": {"batch_size": 128},
                    "distillation": {
                        "alpha": spec["alpha"],
                        "temperature": spec["temperature"],
                        "cache_teacher_logits": True,
                    },
                },
                **common,
            ).with_id(node)
    return tfx.dsl.Pipeline(
        # One name for both stages: the trials reuse the choice stage's Transform.
        pipeline_name="distill_your_model",
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=[example_gen, statistics, schema, transform, *built.values()],
        # Resumes a stopped run; `root` is keyed by the code revision, so nothing
        # trained by other code is reused.
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


def stage_seconds(root: str, nodes) -> dict[str, float]:
    """Seconds each of `nodes` took to run, from ML Metadata: its newest execution that
    ran (a cache hit of a resumed run reports the run that trained the model)."""
    import ml_metadata as mlmd
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = os.path.join(root, "metadata.db")
    store = mlmd.MetadataStore(config)
    seconds = {}
    for context in store.get_contexts_by_type("node"):
        node = context.name.split(".", 1)[-1]
        ran = [
            e
            for e in store.get_executions_by_context(context.id)
            if e.last_known_state == metadata_store_pb2.Execution.COMPLETE
        ]
        if node in nodes and ran:
            last = max(ran, key=lambda e: e.id)
            seconds[node] = round(
                (last.last_update_time_since_epoch - last.create_time_since_epoch) / 1000, 1
            )
    return seconds


def split_examples(data: str, split: str) -> tuple[list[bytes], np.ndarray]:
    import tensorflow as tf

    records, labels = [], []
    for record in tf.data.TFRecordDataset(os.path.join(data, split, "data.tfrecord")):
        raw = record.numpy()
        records.append(raw)
        labels.append(
            tf.train.Example.FromString(raw).features.feature["label"].int64_list.value[0]
        )
    return records, np.asarray(labels)


def measure(serving_dir: str, records: list[bytes], labels: np.ndarray, latency: bool) -> dict:
    """Accuracy through the serving signature; parameters; with `latency`, the median
    latency at batch 256 of the model and of the whole signature."""
    import tensorflow as tf

    from components.distillation.model import count_params

    loaded = tf.saved_model.load(serving_dir)
    serve = loaded.signatures["serving_default"]
    predictions = []
    for i in range(0, len(records), 1000):
        (out,) = serve(examples=tf.constant(records[i : i + 1000])).values()
        predictions.append(np.argmax(out.numpy(), axis=-1))
    out = {
        "accuracy": float(np.mean(np.concatenate(predictions) == labels)),
        "params": count_params(loaded.trainable_variables),
    }
    if not latency:
        return out
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

    out["model_ms_b256"] = median_ms(lambda: loaded(images, training=False))
    out["serving_ms_b256"] = median_ms(lambda: serve(examples=batch))
    return out


def choose(validation: dict) -> dict:
    """The settings the trials use, from the choice stage's validation accuracies
    (node id -> accuracy): the better student alone, the best (alpha, T)."""
    alone = {str(a): validation[alone_id(CHOICE_SEED, a)] for a in (False, True)}
    candidates = [
        {
            "alpha": alpha,
            "temperature": temperature,
            "validation_acc": validation[distilled_id(CHOICE_SEED, alpha, temperature)],
        }
        for alpha, temperature in CANDIDATES
    ]
    best = max(candidates, key=lambda c: c["validation_acc"])
    return {
        "teacher_validation_acc": validation[teacher_id(CHOICE_SEED)],
        "alone_validation_acc": alone,
        "alone_augment": alone["True"] > alone["False"],
        "candidates": candidates,
        "alpha": best["alpha"],
        "temperature": best["temperature"],
    }


def _interval(differences: list[float]) -> list[float] | None:
    """The paired 95% t interval, or None with fewer than 2 seeds (no spread to show)."""
    try:
        _, low, high = t_interval(differences)
    except TooFewError:
        return None
    return [round(low, 4), round(high, 4)]


def summarize(setting: str, fraction: float, seeds, choice: dict, models: dict) -> dict:
    """The setting's figures from the trials' `models` (node id -> `measure` on test)."""
    rows = []
    for seed in seeds:
        teacher = TEACHER_SEEDS[seed % len(TEACHER_SEEDS)]
        rows.append(
            {
                "seed": seed,
                "teacher": teacher,
                "alone_acc": models[alone_id(seed, choice["alone_augment"])]["accuracy"],
                "distilled_acc": models[distilled_id(seed, choice["alpha"], choice["temperature"])][
                    "accuracy"
                ],
                "control_acc": models[distilled_id(seed, 0.0, choice["temperature"])]["accuracy"],
            }
        )
    teachers = [models[teacher_id(t)] for t in TEACHER_SEEDS]
    distilled = [models[distilled_id(s, choice["alpha"], choice["temperature"])] for s in seeds]

    def mean(values):
        return round(float(np.mean(values)), 4)

    vs_alone = [r["distilled_acc"] - r["alone_acc"] for r in rows]
    vs_control = [r["distilled_acc"] - r["control_acc"] for r in rows]
    teacher_acc = float(np.mean([t["accuracy"] for t in teachers]))
    alone_acc = float(np.mean([r["alone_acc"] for r in rows]))
    lead = teacher_acc - alone_acc
    out = {
        "setting": setting,
        "labeled_fraction": fraction,
        "seeds": len(rows),
        "teachers": len(teachers),
        "choice": choice,
        "teacher_accs": [round(t["accuracy"], 4) for t in teachers],
        "teacher_acc": round(teacher_acc, 4),
        "alone_acc": round(alone_acc, 4),
        "distilled_acc": mean([r["distilled_acc"] for r in rows]),
        "control_acc": mean([r["control_acc"] for r in rows]),
        "distilled_minus_alone": mean(vs_alone),
        "distilled_minus_alone_ci95": _interval(vs_alone),
        "distilled_minus_control": mean(vs_control),
        "distilled_minus_control_ci95": _interval(vs_control),
        "gap_recovered": round(float(np.mean(vs_alone)) / lead, 3) if lead > 0 else None,
        "param_ratio": round(distilled[0]["params"] / teachers[0]["params"], 4),
        "rows": rows,
    }
    if all("model_ms_b256" in m for m in (*teachers, *distilled)):
        for key in ("model", "serving"):
            out[f"{key}_latency_ratio_b256"] = round(
                float(np.mean([d[f"{key}_ms_b256"] for d in distilled]))
                / float(np.mean([t[f"{key}_ms_b256"] for t in teachers])),
                3,
            )
    return out


def run_stage(args, name: str, root: str, data: str, nodes: dict, split: str) -> dict:
    """Runs one stage's pipeline (cache on: resumes) and measures its models on `split`."""
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    pipeline = create_pipeline(
        root, data, nodes, args.teacher_steps, args.student_steps, args.eval_steps
    )
    start = time.perf_counter()
    BeamDagRunner().run(pipeline)
    wall = time.perf_counter() - start
    records, labels = split_examples(data, split)
    models = {}
    for node, spec in nodes.items():
        latency = split == "test" and spec["kind"] in ("teacher", "distilled")
        models[node] = measure(model_dir(root, node), records, labels, latency)
        emit({"stage": name, "split": split, "model": node, **spec, **models[node]})
    models["_seconds"] = {"pipeline_wall": round(wall, 1), **stage_seconds(root, nodes)}
    return models


def run_setting(args, setting: str, revision: str) -> dict:
    fraction = SETTINGS[setting]
    root = os.path.join(args.workdir, revision, setting)
    data = os.path.join(root, "data")
    if not os.path.exists(os.path.join(data, "test", "data.tfrecord")):
        write_examples(data, fraction, args.limit)
    choice_file = os.path.join(root, "choice.json")
    if os.path.exists(choice_file):
        with open(choice_file) as f:
            choice = json.load(f)
    else:
        validation = run_stage(args, "choice", root, data, choice_nodes(), "eval")
        choice = choose({k: v["accuracy"] for k, v in validation.items() if k != "_seconds"})
        choice["seconds"] = validation["_seconds"]
        with open(choice_file + ".tmp", "w") as f:
            json.dump(choice, f, indent=1)
        os.replace(choice_file + ".tmp", choice_file)
    emit({"setting": setting, "choice": choice})
    seeds = list(range(args.seeds))
    models = run_stage(args, "trials", root, data, trial_nodes(seeds, choice), "test")
    summary = summarize(setting, fraction, seeds, choice, models)
    summary["seconds"] = models["_seconds"]
    summary["steps"] = {"teacher": args.teacher_steps, "student": args.student_steps}
    emit(summary)
    return summary


HEADLINE_KEYS = (
    "labeled_fraction seeds teachers teacher_acc alone_acc distilled_acc control_acc "
    "distilled_minus_alone distilled_minus_alone_ci95 distilled_minus_control "
    "distilled_minus_control_ci95 gap_recovered param_ratio model_latency_ratio_b256"
).split()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="scarce,all")
    parser.add_argument("--seeds", type=int, default=5, help="student seeds (at least 5)")
    parser.add_argument("--teacher-steps", type=int, default=6000)
    parser.add_argument("--student-steps", type=int, default=12000)
    parser.add_argument("--eval-steps", type=int, default=20)
    parser.add_argument("--limit", type=int, default=0, help="images per split (0: all)")
    parser.add_argument("--workdir", default=os.path.join(REPO, ".bench", "distill_your_model"))
    parser.add_argument(
        "--shared-with",
        default="",
        help="what else ran on the cores (recorded; accuracy does not need an idle machine)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    keys = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(keys) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: unknown {unknown}; choose from {sorted(SETTINGS)}")
    if args.seeds < 2:
        parser.error("--seeds: at least 2 for an interval (5 for one that means something)")
    revision = revision_key()
    summaries = [run_setting(args, setting, revision) for setting in keys]
    headline = {"settings": [{k: s.get(k) for k in HEADLINE_KEYS} for s in summaries]}
    emit(headline)
    if not args.no_results:
        path = results_lib.write(
            "distill_your_model",
            [*summaries, headline],
            shared_with=args.shared_with or None,
            argv=sys.argv[1:] if argv is None else argv,
        )
        print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
