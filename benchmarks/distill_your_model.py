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

Per setting, as a skeptic asks:

1. **choice**, on the validation split, with seeds outside the trials': one
   teacher; the student alone without and with augmentation (what a user
   would train instead; the better one is the baseline); the student
   distilled at each (alpha, T) of `CANDIDATES`. One seed decides, so two
   candidates within the validation split's noise (about 0.004) may be
   chosen either way; the `choice` in the output keeps every score.
2. **trials**: `len(TEACHER_SEEDS)` teachers; per student seed (`--seeds`,
   at least 5), the chosen student alone, the student distilled at the
   chosen (alpha, T) from teacher `seed mod len(TEACHER_SEEDS)`, and an
   alpha = 0 control trained through the Distiller's own input pipeline
   (hard labels only), so the pipeline cannot be the cause of a gain.
   Differences are paired by seed (the same seed, not the same initial
   weights: the Trainer's module and the Distiller seed their own way),
   with 95% t intervals on n - 1 degrees of freedom over the student seeds
   for these teachers; `per_teacher` shows each teacher's seeds apart.

What the design leaves as it is, and the docs say:
- the validation images keep every label, also in `scarce` (a user with
  10% of the labels would have fewer to choose with);
- in `scarce` the Distiller's batches carry the unlabeled images too, so
  the alpha = 0 control learns from about a tenth of the labeled images a
  step that the student alone does: against it, a gain is the soft
  targets' and the transfer set's together; against the student alone,
  the one a user would pick instead, it is the headline.

Resuming and reuse: each stage's pipeline runs with TFX's cache on, under
`--workdir`/<code>/<recipe>: <code> digests the git objects of what the
models depend on (`CODE_PATHS`: the product less its test helpers, the
module files, the lock file; uncommitted changes there get a directory of
their own), <recipe> the arguments, constants and functions that decide the
data, the choice and the pipeline (`recipe_key`). A stopped run resumes
where it stopped, across sessions and commits that change neither; no model
trained by other code or another recipe is reused. Each model measured is
the one ML Metadata says its node's newest execution output. If the code
changes while the benchmark runs, it writes nothing.

The work directory does not outlive its machine, and one setting outlasts a
working session here (its choice stage took 50 minutes, its trials about two
hours more); so each setting's choice is also written to
`benchmarks/results/distill_your_model_choice_<setting>.json` (a results
file: git-commit it after the run or after a `--choice-only` run, since a
commit during a run changes the commit the final check compares), with the
keys of the code, the recipe and the scoring that made it and the commit,
date and machine of its choice stage (`measured`), and a run with the same
keys starts at the trials (`--choice-only` stops after the choices). A
choice written before a later setting's code check fails stays: it was
checked when written. `make bench-report` marks such a file STALE on any
change to this script or the product, more strictly than the keys.

    python -m benchmarks.distill_your_model [--settings scarce,all] [--seeds 5]
        [--teacher-steps 6000] [--student-steps 12000] [--workdir DIR]
        [--shared-with TEXT] [--no-results] [--choice-only]

JSON lines: one per model, one per setting (with the latency ratios at
batch 256: one median a model, in a fixed order, an indication only), and
last `{"settings": [...]}` with per setting `setting`, `labeled_fraction`, `seeds`,
`teachers`, `teacher_acc`, `alone_acc`, `distilled_acc`, `control_acc`,
`distilled_minus_alone` and `distilled_minus_control` (each with its
`_ci95`), `per_teacher`, `gap_recovered`, `param_ratio`; the file
`benchmarks/results/distill_your_model_<setting>.json` (that setting's line
and its headline) and the choice files (neither with `--limit` or
`--no-results`).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import textwrap
import time

import numpy as np

from benchmarks import revision as revision_lib
from testkit import results as results_lib
from testkit.stats import TooFewError, t_interval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = os.path.join(REPO, "benchmarks", "your_model")
SETTINGS = {"scarce": 0.1, "all": 1.0}
SPLITS = ("train", "eval", "test")
# What the pipeline reads: the test images never enter it (they are read raw, once
# per final model, by `split_examples`).
PIPELINE_SPLITS = ("train", "eval")
VALIDATION = 5000
# (alpha, T) candidates; the older design's fixed 0.5 / 2 is one of them.
CANDIDATES = ((0.5, 1.0), (0.5, 2.0), (0.9, 4.0))
CHOICE_SEED = 900
PIPELINE_NAME = "distill_your_model"
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
# TFX's cache keys on): the product, the user's module files (loaded by path, so `make
# bench-report` is told through DEPENDS_ON) and the locked dependencies.
# The test helpers (`testkit/`) train nothing and lie outside these paths.
DEPENDS_ON = ("benchmarks/your_model",)
CODE_PATHS = ("components", "benchmarks/your_model", "requirements.lock")
LOCKS = ("requirements.lock",)


# A run's directory is named by `CODE.key()` (benchmarks/revision.py).
CODE = revision_lib.Code(CODE_PATHS, files=LOCKS)


def recipe_key(args, setting: str) -> str:
    """What decides a setting's data, choice and models beyond the code: the arguments,
    the constants and the functions that write the data, build the pipeline and choose.
    A run with another recipe gets a directory of its own (a smoke run's data or choice
    is never a real run's)."""
    recipe = {
        "setting": setting,
        "fraction": SETTINGS[setting],
        "limit": args.limit,
        "steps": [args.teacher_steps, args.student_steps, args.eval_steps],
        "constants": [VALIDATION, CANDIDATES, CHOICE_SEED, TEACHER_SEEDS, PIPELINE_SPLITS],
        # Their code, not their docstrings or comments.
        "code": [
            results_lib._code_of(textwrap.dedent(inspect.getsource(fn)))
            for fn in (
                split_indices,
                masked_labels,
                write_examples,
                choice_nodes,
                trial_nodes,
                create_pipeline,
                choose,
            )
        ],
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode())
    return f"{setting}-{digest.hexdigest()[:12]}"


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
            splits=[tfx.proto.Input.Split(name=s, pattern=f"{s}/*") for s in PIPELINE_SPLITS]
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
        pipeline_name=PIPELINE_NAME,
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


def trained_models(root: str, nodes) -> dict[str, dict]:
    """Per node of `nodes`, from ML Metadata (`pipelines.summary`, which the run
    summary reads the same way): the serving model its execution in the newest run
    output (a cache hit outputs the model an earlier run trained) and the seconds of
    the execution that trained it."""
    from ml_metadata.proto import metadata_store_pb2

    from pipelines import summary

    store = summary.open_store(os.path.join(root, "metadata.db"))
    executions = summary.latest_run_executions(store, PIPELINE_NAME)
    found = {}
    for node in set(nodes) & set(executions):
        last = executions[node]
        ((_, model),) = summary.artifacts_of(store, last.id, "Model")
        producers = store.get_executions_by_id(
            [
                e.execution_id
                for e in store.get_events_by_artifact_ids([model.id])
                if e.type == metadata_store_pb2.Event.OUTPUT
            ]
        )
        (trained,) = [
            e for e in producers if e.last_known_state == metadata_store_pb2.Execution.COMPLETE
        ]
        found[node] = {
            "serving_dir": os.path.join(model.uri, "Format-Serving"),
            "seconds": round(
                (trained.last_update_time_since_epoch - trained.create_time_since_epoch) / 1000, 1
            ),
            "cached": last.last_known_state == metadata_store_pb2.Execution.CACHED,
        }
    missing = sorted(set(nodes) - set(found))
    if missing:
        raise RuntimeError(f"{root}: no model in ML Metadata for {missing}")
    return found


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
        # The interval above is over student seeds with these teachers; how much
        # the teacher matters shows here: each teacher's seeds apart.
        "per_teacher": {
            str(t): {
                "teacher_acc": round(models[teacher_id(t)]["accuracy"], 4),
                "seeds": [r["seed"] for r in rows if r["teacher"] == t],
                "distilled_minus_alone": mean(
                    [r["distilled_acc"] - r["alone_acc"] for r in rows if r["teacher"] == t]
                ),
            }
            for t in TEACHER_SEEDS
            if any(r["teacher"] == t for r in rows)
        },
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
    trained = trained_models(root, nodes)
    records, labels = split_examples(data, split)
    models = {}
    for node, spec in nodes.items():
        latency = split == "test" and spec["kind"] in ("teacher", "distilled")
        models[node] = measure(trained[node]["serving_dir"], records, labels, latency)
        emit({"stage": name, "split": split, "model": node, **spec, **models[node]})
    models["_seconds"] = {
        "pipeline_wall": round(wall, 1),
        **{node: t["seconds"] for node, t in trained.items()},
    }
    return models


def choice_stem(setting: str) -> str:
    """The committed file of a setting's choice, without `.json`."""
    return f"distill_your_model_choice_{setting}"


def scoring_key() -> str:
    """A digest of the code that turns trained models into the choice's scores (the
    recipe covers the data, the pipeline and `choose`): a committed choice outlives
    its work directory, so it is keyed by these too."""
    code = [
        results_lib._code_of(textwrap.dedent(inspect.getsource(fn)))
        for fn in (run_stage, trained_models, split_examples, measure)
    ]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()[:12]


def committed_choice(
    setting: str, revision: str, recipe: str, results_dir: str = results_lib.RESULTS_DIR
) -> dict | None:
    """The choice a run committed for this setting, code and recipe, or None.

    The work directory does not outlive a machine, and one setting (a 50-minute
    choice stage, then about two hours of trials here) outlasts a working session;
    so the choice is committed with the keys of the code, the recipe and the
    scoring that made it, and a later run (another session, another machine)
    starts at its trials. A choice that differs in any key, or a file that is not
    such a choice, is not used: that run chooses again.
    """
    path = results_lib.results_path(choice_stem(setting), results_dir)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    saved = record.get("headline") or {}
    keys = {"revision": revision, "recipe": recipe, "scoring": scoring_key()}
    if record.get("benchmark") != "distill_your_model" or "choice" not in saved:
        return None
    if any(saved.get(name) != value for name, value in keys.items()):
        return None
    source = {"file": os.path.relpath(path, REPO), "commit": record.get("commit")}
    return {**saved["choice"], "from": {**source, "date": record.get("date")}}


def run_setting(
    args,
    setting: str,
    revision: str,
    unchanged=lambda: None,
    results_dir: str = results_lib.RESULTS_DIR,
) -> dict:
    """One setting: its choice (from its work directory, the committed choice for this
    code and recipe, or its choice stage), then, unless `args.choice_only`, its trials.
    `unchanged` raises `revision_lib.CodeChanged` if the code changed since the run
    started; it is called before a choice is written to `results_dir`, which happens
    when none there matches, results are on, and the code is committed (a `-dirty-`
    revision no run can match)."""
    fraction = SETTINGS[setting]
    recipe = recipe_key(args, setting)
    root = os.path.join(args.workdir, revision, recipe)
    data = os.path.join(root, "data")
    if not os.path.exists(os.path.join(data, "test", "data.tfrecord")):
        write_examples(data, fraction, args.limit)
    choice_file = os.path.join(root, "choice.json")
    committed = None if args.limit else committed_choice(setting, revision, recipe, results_dir)
    if os.path.exists(choice_file):
        with open(choice_file) as f:
            choice = json.load(f)
    elif committed is not None:
        choice = committed
    else:
        validation = run_stage(args, "choice", root, data, choice_nodes(), "eval")
        choice = choose({k: v["accuracy"] for k, v in validation.items() if k != "_seconds"})
        choice["seconds"] = validation["_seconds"]
        # The file that commits the choice records the run that writes it, which may
        # be a later one (resumed from this work directory): this is the stage's own.
        choice["measured"] = results_lib.provenance()
    if not os.path.exists(choice_file):
        with open(choice_file + ".tmp", "w") as f:
            json.dump(choice, f, indent=1)
        os.replace(choice_file + ".tmp", choice_file)
    clean = "-dirty-" not in revision
    if committed is None and clean and not args.no_results and not args.limit:
        unchanged()
        choice = {k: v for k, v in choice.items() if k != "from"}
        line = {
            "setting": setting,
            "revision": revision,
            "recipe": recipe,
            "scoring": scoring_key(),
            "choice": choice,
        }
        path = results_lib.write(
            "distill_your_model",
            [line],
            shared_with=args.shared_with or None,
            results_dir=results_dir,
            argv=args.argv,
            stem=choice_stem(setting),
        )
        print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)
    emit({"setting": setting, "choice": choice})
    if args.choice_only:
        return {"setting": setting, "choice": choice}
    seeds = list(range(args.seeds))
    models = run_stage(args, "trials", root, data, trial_nodes(seeds, choice), "test")
    summary = summarize(setting, fraction, seeds, choice, models)
    summary["seconds"] = models["_seconds"]
    summary["steps"] = {"teacher": args.teacher_steps, "student": args.student_steps}
    summary["directory"] = os.path.relpath(root, args.workdir)
    emit(summary)
    return summary


# The latency ratios stay in each setting's line: they are one median a model, taken
# in a fixed order on whatever shared the cores, not a timing to headline.
HEADLINE_KEYS = (
    "setting labeled_fraction seeds teachers teacher_acc alone_acc distilled_acc control_acc "
    "distilled_minus_alone distilled_minus_alone_ci95 distilled_minus_control "
    "distilled_minus_control_ci95 per_teacher gap_recovered param_ratio"
).split()
MIN_SEEDS = 5


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="scarce,all")
    parser.add_argument(
        "--seeds", type=int, default=MIN_SEEDS, help=f"student seeds (at least {MIN_SEEDS})"
    )
    parser.add_argument("--teacher-steps", type=int, default=6000)
    parser.add_argument("--student-steps", type=int, default=12000)
    parser.add_argument("--eval-steps", type=int, default=20)
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help="images per split (0: all); a smoke run, which may use 2 seeds and writes no results",
    )
    parser.add_argument("--workdir", default=os.path.join(REPO, ".bench", "distill_your_model"))
    parser.add_argument(
        "--shared-with",
        default="",
        help="what else ran on the cores (recorded; accuracy does not need an idle machine)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument(
        "--choice-only",
        action="store_true",
        help="stop after each setting's choice (committed to benchmarks/results for the trials "
        "of a later run)",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    keys = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(keys) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: unknown {unknown}; choose from {sorted(SETTINGS)}")
    least = 2 if args.limit else MIN_SEEDS
    if args.seeds < least:
        parser.error(
            f"--seeds: at least {MIN_SEEDS} for an interval that means something "
            "(2 in a smoke run with --limit)"
        )
    started, trees = results_lib.commit(), CODE.trees()
    revision = CODE.key(trees)

    def unchanged() -> None:
        revision_lib.check_unchanged(started, trees, results_lib.commit(), CODE.trees())

    summaries = [run_setting(args, setting, revision, unchanged) for setting in keys]
    unchanged()
    if args.choice_only:
        return
    emit({"settings": [{k: s.get(k) for k in HEADLINE_KEYS} for s in summaries]})
    if not args.no_results and not args.limit:
        for path in write_results(summaries, args):
            print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)


def write_results(
    summaries: list[dict], args, results_dir: str = results_lib.RESULTS_DIR
) -> list[str]:
    """Writes each setting's line and headline to `distill_your_model_<setting>.json`:
    a setting outlasts a working session, so the settings run apart, and one's run
    must not overwrite the other's result. Returns the files written."""
    return [
        results_lib.write(
            "distill_your_model",
            [summary, {"settings": [{k: summary.get(k) for k in HEADLINE_KEYS}]}],
            shared_with=args.shared_with or None,
            results_dir=results_dir,
            argv=args.argv,
            stem=f"distill_your_model_{summary['setting']}",
        )
        for summary in summaries
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
