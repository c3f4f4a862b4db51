"""Distillation methods on Fashion-MNIST, measured as a skeptic asks: M-on-M, Noisy Student, kd.

`benchmarks/distillation.py --scenario m_on_m [options]` runs this (or run it alone).

Data: the official 60,000 training images split once (a fixed permutation,
seed 0) into 55,000 to train on (`train`) and 5,000 to choose settings on
(`eval`, the validation split every training run evaluates on); the official
10,000 test images (`test`) are read once per final model. One Transform
(analysers on `train`) serves every run.

M-on-M, per labeled fraction (`--fractions`, e.g. 1 and 0.1: the other
training images are an unlabeled transfer set the students learn from the
teachers alone), per trial (`--trials`, at least 5 for an interval that
means something):

1. three teachers (`TEACHER`, seeds differ), trained on the labels;
2. the product's M-on-M (`components.distiller.run_fn.train_m_on_m`, what
   the Distiller runs with `distillation.method: m_on_m`): student i
   (`STUDENT`) from teacher i alone, served as one SavedModel of their
   mean logits;
3. what a user would pick instead at the ensemble's serving cost: one
   student of the ensemble's size (`EQUAL_COST_STUDENT`, its parameters
   within 5%) distilled from all three teachers (the `EnsembleStudent`,
   method `kd`), and three `STUDENT`s trained alone on the labels,
   ensembled as M-on-M serves (mean logits);
4. on the test set: each teacher, the teachers' ensemble (mean
   probabilities), each student, the students' ensemble and both
   alternatives (`ensemble_minus_equal_cost_single`,
   `ensemble_minus_alone_ensemble`, paired over trials).

The distillation settings (alpha, T) are chosen before the trials, on the
validation split, per fraction: one teacher and one student per candidate
(seeds outside the trials'). Step counts are fixed by this machine's budget,
not chosen. The models live under `--workdir`, in a directory named by the
code that trains them (`CODE`, `benchmarks/revision.py`; a run with
uncommitted code gets a new one), so no model other code trained is reused.
Each finished trial (its accuracies and `provenance`) and each settings
choice is saved at once under `--trials-dir`, keyed by the settings
(`benchmarks/results/trials/distillation_methods/`, committed), and read back
by a later run while it still describes HEAD by the rule a results file
goes stale by (measured on committed code, nothing this benchmark measures
changed since but for declared neutral changes): the benchmark resumes
across sessions and machines. Results are written only when the run began
on committed code that did not change while it ran.

Noisy Student (`--scenario noisy_student`, fractions 0.01 and 0.1): first,
on the validation split and before any test read (`choose_noise`, a teacher
and a seed outside the trials'), which noise the rounds' students train with
(`NS_ARMS`: the paper's dropout, views and mixup; none; mixup alone, the
reference study's 1% recipe), by their last round, and which the network
trained alone on the labels trains with, by its accuracy. Then per seed
(`noisy_trial`): a teacher on the labels (`NS_MODEL` with `NS_NOISE`), the
chosen rounds, the network alone without noise (`final_minus_unnoised_alone`)
and as validation chose it (`final_minus_chosen_alone`); the pseudo-labels
are `NS_RECIPE`, fixed before any run.

kd (`--scenario kd`): plain distillation of make run's models (the shipped
`fashion_mnist` teacher and conv student, at its steps) with `KD_TEACHERS`
teachers and one student seed per trial (seed s learns from teacher s mod
`KD_TEACHERS`: with 5 seeds, one teacher each, so the pairs are
independent): the student alone (with or without image views, whichever validation
prefers), the distilled student (alpha, T chosen on validation) and an
alpha = 0 control trained through the Distiller's own input pipeline
(`kd_trial`). At fractions below 1 the Distiller's batches carry the
unlabeled images too, so the control learns from that fraction of the
labeled images a step that the student alone does (which drops them):
against the control a gain is the soft targets' and the transfer set's
together; against the student alone, what a user would train instead, it
is the headline. The validation images keep every label at every fraction
(a user with few labels would have fewer to choose with).

`--scenario methods` (the default) runs Noisy Student, then M-on-M, each at
its own fractions and step counts (`STEPS`), into one results file.

Output: one JSON line per scenario and fraction (trial rows, means, paired
95% t intervals over trials or seeds, seconds per stage), and last one JSON
object `{scenario: {fraction: {...}}}` with the issues' keys. `--saved-only`
summarises what earlier runs saved without training.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import distillation_common as bench_lib  # noqa: E402
from benchmarks import revision  # noqa: E402
from components.config import PipelineConfig, from_dict, payload, to_dict  # noqa: E402
from components.data.sources import ResolvedInput, image_example  # noqa: E402
from components.distiller.run_fn import member_inputs, train_m_on_m  # noqa: E402
from components.training import strategies  # noqa: E402
from components.training import task as task_lib  # noqa: E402
from pipelines import report  # noqa: E402
from pipelines.configs import load_config  # noqa: E402
from testkit import results as results_lib  # noqa: E402
from testkit.stats import mean_std, t_interval  # noqa: E402

VALIDATION_IMAGES = 5000
# What the trained models depend on: the product (the shipped configs
# included; the test helpers in `testkit/` train nothing), the benchmark code
# that trains and the lock.
BENCH_FILES = ("benchmarks/distillation_common.py", "benchmarks/distillation_methods.py")
CODE = revision.Code(
    ("components", "pipelines", *BENCH_FILES, "requirements.lock"),
    files=(*BENCH_FILES, "requirements.lock"),
)
# The shipped fashion_mnist config, read once: every scenario's base.
_SHIPPED = to_dict(load_config("fashion_mnist"))
SPLITS = (("train", "train/*.tfrecord"), ("eval", "eval/*.tfrecord"), ("test", "test/*.tfrecord"))
# A conv teacher this machine trains in minutes (about 390k parameters), and
# a student small enough that three of them weigh under a third of it.
TEACHER = {
    "hidden_units": [256],
    "dropout": 0.5,
    "conv": {"filters": [32, 64, 128], "convs_per_block": 1, "batch_norm": True, "dropout": 0.25},
}
STUDENT = {
    "hidden_units": [32],
    "conv": {"filters": [8, 16, 32], "convs_per_block": 1, "batch_norm": True},
}
# One student as large as the ensemble of `NUM_TEACHERS` students (its parameters
# within 5%, `tests/benchmarks/test_distillation_methods.py`): what a user would
# serve instead at the ensemble's cost, distilled from the teachers' ensemble.
EQUAL_COST_STUDENT = {
    "hidden_units": [56],
    "conv": {"filters": [14, 28, 56], "convs_per_block": 1, "batch_norm": True},
}
# (alpha, T) candidates, chosen between on the validation split.
CANDIDATES = ((0.5, 1.0), (0.9, 2.0), (0.9, 4.0))
NUM_TEACHERS = 3
# Seeds of the settings choice: outside every trial's (10 * trial + i).
CHOICE_SEED = 900


def write_splits(directory: str) -> ResolvedInput:
    """Fashion-MNIST as train (55,000) / eval (5,000 validation) / test (official 10,000)."""
    from components.data import fashion_mnist

    marker = os.path.join(directory, "done")
    if not os.path.exists(marker):
        images, labels = fashion_mnist.load_split("train")
        order = np.random.RandomState(0).permutation(len(images))
        test_images, test_labels = fashion_mnist.load_split("eval")
        parts = {
            "train": (images[order[VALIDATION_IMAGES:]], labels[order[VALIDATION_IMAGES:]]),
            "eval": (images[order[:VALIDATION_IMAGES]], labels[order[:VALIDATION_IMAGES]]),
            "test": (test_images, test_labels),
        }
        for split, (x, y) in parts.items():
            os.makedirs(os.path.join(directory, split), exist_ok=True)
            pixels = x.reshape(len(x), -1).astype("float32") / 255.0
            with tf.io.TFRecordWriter(os.path.join(directory, split, "data.tfrecord")) as w:
                for image, label in zip(pixels, y, strict=True):
                    w.write(image_example(image, int(label)))
        open(marker, "w").close()
    return ResolvedInput(directory, "*/*.tfrecord", "tfrecord", splits=SPLITS)


def base_config(directory: str, teacher_steps: int, student_steps: int) -> PipelineConfig:
    """The shipped fashion_mnist config on these splits, with `TEACHER` / `STUDENT`."""
    data = copy.deepcopy(_SHIPPED)
    data.pop("kubeflow", None)
    data["name"] = "fashion-mnist-methods"
    data["data"].update(builtin="", path=directory)
    data.update(teacher=TEACHER, student=STUDENT)
    data["train"].update(train_steps=teacher_steps, eval_steps=20)
    data["distillation"].update(
        student_train_steps=student_steps, scratch_baseline=False, baselines=[]
    )
    return from_dict(data)


def with_fraction(config: PipelineConfig, fraction: float) -> PipelineConfig:
    return dataclasses.replace(
        config, data=dataclasses.replace(config.data, labeled_fraction=fraction)
    )


class Measured(bench_lib.Bench):
    """`distillation_common.Bench` with the test split read apart from the validation split."""

    def __init__(self, config, paths, workdir, choice):
        super().__init__(config, paths, workdir, choice)
        self.test = report.read_eval_examples(paths["raw_test"], config.data.label.name)

    def test_probabilities(self, serving_dir: str) -> np.ndarray:
        serve = tf.saved_model.load(serving_dir).signatures["serving_default"]
        return report.probabilities(serve, self.test[0])

    def test_accuracy(self, probs: np.ndarray) -> float:
        return report.scores(probs, self.test[1])["accuracy"]

    def params(self, serving_dir: str) -> int:
        from components.distillation.model import count_params

        return count_params(tf.saved_model.load(serving_dir).trainable_variables)


def _trained(bench: Measured, seconds: dict, stage: str, config: PipelineConfig, seed: int,
             role: str, path: str) -> str:  # fmt: skip
    """`role`'s serving directory, trained by `config` at `seed` under `path`; its seconds
    are added to `seconds[stage]`."""
    return bench_lib.timed(
        seconds, stage, bench.train_classifier, bench_lib.with_seed(config, seed), role, path
    )


def choose_settings(bench: Measured, config: PipelineConfig, seconds: dict) -> dict:
    """(alpha, T) with the best validation accuracy of one distilled student."""
    teacher = _trained(bench, seconds, "choice", config, CHOICE_SEED, "teacher", "choice/teacher")
    scores = []
    for alpha, temperature in CANDIDATES:
        cfg = bench_lib.with_seed(config, CHOICE_SEED, alpha=alpha, temperature=temperature)
        d = bench_lib.timed(
            seconds, "choice", bench.distil, cfg, teacher, f"choice/a{alpha}_T{temperature}"
        )
        acc = bench.measure(d, latency=False)["accuracy"]
        scores.append({"alpha": alpha, "temperature": temperature, "validation_acc": acc})
        print(f"# choice alpha={alpha} T={temperature}: validation {acc:.4f}", file=sys.stderr)
    best = max(scores, key=lambda r: r["validation_acc"])
    return {"candidates": scores, "alpha": best["alpha"], "temperature": best["temperature"]}


def mean_logit_probabilities(member_probs: list[np.ndarray]) -> np.ndarray:
    """The probabilities of the members' mean logits: how an M-on-M ensemble serves."""
    mean_logits = np.mean([np.log(np.clip(p, 1e-30, 1.0)) for p in member_probs], axis=0)
    shifted = np.exp(mean_logits - mean_logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def with_student(config: PipelineConfig, student: dict) -> PipelineConfig:
    data = to_dict(config)
    data["student"] = student
    return from_dict(data)


def m_on_m_trial(bench: Measured, config: PipelineConfig, trial: int) -> dict:
    """Three teachers, the product's M-on-M, and what a user would pick instead: one
    student of the ensemble's size distilled from the three teachers, and three students
    trained alone, ensembled as M-on-M serves; scored on test."""
    seconds: dict[str, float] = {}
    seeds = [10 * trial + i for i in range(NUM_TEACHERS)]
    teachers = [
        _trained(bench, seconds, "teachers", config, seed, "teacher", f"trial{trial}/teacher{i}")
        for i, seed in enumerate(seeds)
    ]
    m_on_m = bench_lib.with_seed(
        config, seeds[0], method="m_on_m", num_teachers=NUM_TEACHERS, cache_teacher_logits=True
    )
    inputs = bench.inputs(f"trial{trial}/m_on_m", config.student_train_steps())
    task = task_lib.Task("Distiller", bench.choice, payload.Payload(config=m_on_m))
    bench_lib.timed(seconds, "m_on_m_students", train_m_on_m, task, inputs, teachers)
    members = [member_inputs(inputs, i).serving_model_dir for i in range(NUM_TEACHERS)]
    equal_cost = bench_lib.timed(
        seconds,
        "equal_cost_single",
        bench.distil,
        bench_lib.with_seed(
            with_student(config, EQUAL_COST_STUDENT), seeds[0], cache_teacher_logits=True
        ),
        teachers,
        f"trial{trial}/equal_cost_single",
    )
    alone = [
        _trained(bench, seconds, "alone", config, seed, "student", f"trial{trial}/alone{i}")
        for i, seed in enumerate(seeds)
    ]
    teacher_probs = [bench.test_probabilities(d) for d in teachers]
    member_probs = [bench.test_probabilities(d) for d in members]
    ensemble_probs = bench.test_probabilities(inputs.serving_model_dir)
    # The served ensemble is the students' mean logits: check it is what was scored.
    served = mean_logit_probabilities(member_probs)
    assert np.allclose(served, ensemble_probs, atol=1e-4), "ensemble != mean of students' logits"
    alone_probs = [bench.test_probabilities(d) for d in alone]
    row = {
        "trial": trial,
        "teacher_accs": [bench.test_accuracy(p) for p in teacher_probs],
        "teacher_ensemble_acc": bench.test_accuracy(np.mean(teacher_probs, axis=0)),
        "single_accs": [bench.test_accuracy(p) for p in member_probs],
        "student_ensemble_acc": bench.test_accuracy(ensemble_probs),
        "equal_cost_single_acc": bench.test_accuracy(bench.test_probabilities(equal_cost)),
        "alone_accs": [bench.test_accuracy(p) for p in alone_probs],
        "alone_ensemble_acc": bench.test_accuracy(mean_logit_probabilities(alone_probs)),
        "teacher_params": bench.params(teachers[0]),
        "ensemble_params": bench.params(inputs.serving_model_dir),
        "equal_cost_single_params": bench.params(equal_cost),
        "alone_ensemble_params": sum(bench.params(d) for d in alone),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }
    row["mean_single_acc"] = float(np.mean(row["single_accs"]))
    return row


def _interval(values: list[float]) -> list[float] | None:
    if len(values) < 2:
        return None
    _, low, high = t_interval(values)
    return [round(low, 4), round(high, 4)]


def summarize_m_on_m(rows: list[dict], fraction: float, choice: dict) -> dict:
    """Means over trials and paired 95% intervals of the students' ensemble against its
    mean student, one student of its size distilled from the teachers' ensemble, and
    three students trained alone and ensembled."""

    def mean(key):
        return round(mean_std([r[key] for r in rows])[0], 4)

    ratio = rows[0]["ensemble_params"] / rows[0]["teacher_params"]
    out = {
        "labeled_fraction": fraction,
        "trials": len(rows),
        "choice": choice,
        "teacher_acc": round(float(np.mean([np.mean(r["teacher_accs"]) for r in rows])), 4),
        "teacher_ensemble_acc": mean("teacher_ensemble_acc"),
        "mean_single_acc": mean("mean_single_acc"),
        "student_ensemble_acc": mean("student_ensemble_acc"),
        "equal_cost_single_acc": mean("equal_cost_single_acc"),
        "alone_ensemble_acc": mean("alone_ensemble_acc"),
    }
    for key, against in (
        ("ensemble_minus_mean_single", "mean_single_acc"),
        ("ensemble_minus_equal_cost_single", "equal_cost_single_acc"),
        ("ensemble_minus_alone_ensemble", "alone_ensemble_acc"),
    ):
        diffs = [r["student_ensemble_acc"] - r[against] for r in rows]
        out[key] = round(float(np.mean(diffs)), 4)
        out[f"{key}_ci95"] = _interval(diffs)
    out.update(
        teacher_params=rows[0]["teacher_params"],
        ensemble_params=rows[0]["ensemble_params"],
        equal_cost_single_params=rows[0]["equal_cost_single_params"],
        param_ratio_vs_one_teacher=round(ratio, 4),
        rows=rows,
    )
    out["targets"] = {
        f"ensemble_beats_{name}_ci_excludes_0": ci is not None and ci[0] > 0
        for name, ci in (
            (name, out[f"ensemble_minus_{name}_ci95"])
            for name in ("mean_single", "equal_cost_single", "alone_ensemble")
        )
    }
    out["targets"]["param_ratio_le_1/3"] = ratio <= 1 / 3
    return out


# Noisy Student: one conv net for teacher, students and the architecture alone
# (equal sizes, as the reference study's 1% recipe), and its pseudo-labels, taken
# from that study (none of it chosen on this test set): hard pseudo-labels at
# confidence 0.7, balanced. The teacher trains on the labels with dropout,
# translate / flip views and mixup 0.2.
NS_MODEL = {
    "hidden_units": [64],
    "dropout": 0.3,
    "conv": {"filters": [16, 32, 64], "convs_per_block": 1, "batch_norm": True, "dropout": 0.25},
}
NS_NOISE = {"translate": 2, "flip": True, "mixup": 0.2}
NS_RECIPE = {"pseudo_labels": "hard", "confidence": 0.7, "balance": True}
# The students' noise the validation split chooses between (and, the same way, the
# network trained alone on the labels): the paper's (dropout, views, mixup), none, and
# mixup 0.2 as the only noise (the reference study's 1% recipe: 0.833 -> 0.851 -> 0.861
# over two rounds on a GPU).
NS_ARMS = {
    "paper": {"dropout": True, "augmentation": NS_NOISE},
    "none": {"dropout": False, "augmentation": {"translate": 0, "flip": False, "mixup": 0.0}},
    "mixup": {"dropout": False, "augmentation": {"translate": 0, "flip": False, "mixup": 0.2}},
}
# The network alone without noise: the baseline every arm is judged against too.
UNNOISED = "none"


def noisy_config(config: PipelineConfig, arm: str, rounds: int = 2) -> PipelineConfig:
    """The Noisy Student config: `NS_MODEL` for every role, the students noised as
    `NS_ARMS[arm]` says; the teacher keeps `NS_MODEL`'s dropout (its augmentation is
    `NS_NOISE`, `teacher_config`)."""
    noise = NS_ARMS[arm]
    data = to_dict(config)
    model = json.loads(json.dumps(NS_MODEL))
    if not noise["dropout"]:
        model["dropout"] = 0.0
        model["conv"]["dropout"] = 0.0
    data.update(teacher=NS_MODEL, student=model)
    data["train"]["augmentation"] = dict(noise["augmentation"])
    data["distillation"].update(
        method="noisy_student",
        cache_teacher_logits=False,
        require_compression=False,
        noisy_student={"rounds": rounds, **NS_RECIPE},
    )
    return from_dict(data)


def teacher_config(config: PipelineConfig, rounds: int = 2) -> PipelineConfig:
    """What trains the Noisy Student teacher: `NS_MODEL` with `NS_NOISE`."""
    return noisy_config(config, "paper", rounds)


def _noisy_chain(bench: Measured, cfg: PipelineConfig, teacher: str, seed: int, rounds: int,
                 name: str, seconds: dict) -> tuple[list[str], list[dict]]:  # fmt: skip
    """The product's rounds (what the Distiller runs with `method: noisy_student`) from
    `teacher`: each round's serving directory and what its pseudo-labelling kept."""
    from components.distiller.run_fn import train_noisy_student

    # Timed as `<chain>s` (`rounds`, `alone`), whatever the run's directory.
    stage = name.rsplit("/", 1)[-1] + "s"
    previous, served, kept = teacher, [], []
    for k in range(1, rounds + 1):
        inputs = bench.inputs(f"{name}{k}", cfg.student_train_steps())
        seeded = bench_lib.with_seed(cfg, seed + k)
        task = task_lib.Task("Distiller", bench.choice, payload.Payload(config=seeded))
        summary = bench_lib.timed(seconds, stage, train_noisy_student, task, inputs, [previous])
        previous = inputs.serving_model_dir
        served.append(previous)
        kept.append({k2: summary[k2] for k2 in ("unlabeled", "confident", "kept", "per_class")})
    return served, kept


def _alone(bench: Measured, config: PipelineConfig, arm: str, seed: int, run: str,
           seconds: dict) -> str:  # fmt: skip
    """The students' network (as `arm` noises it) trained on the labels alone, for the
    rounds' student steps."""
    return _trained(bench, seconds, "alone", noisy_config(config, arm), seed, "student", run)


def choose_noise(bench: Measured, config: PipelineConfig, rounds: int) -> dict:
    """On the validation split (seed `CHOICE_SEED`, outside the trials'), before any test
    read: which of `NS_ARMS` the rounds' students train with, by their last round's
    accuracy, and which the network alone trains with, by its accuracy."""
    seconds: dict[str, float] = {}
    teacher = _trained(
        bench, seconds, "teacher", teacher_config(config, rounds), CHOICE_SEED, "teacher",
        "nschoice/teacher",
    )  # fmt: skip
    rounds_scores, alone_scores = [], []
    for arm in NS_ARMS:
        served, _ = _noisy_chain(
            bench, noisy_config(config, arm, rounds), teacher, CHOICE_SEED, rounds,
            f"nschoice/{arm}/round", seconds,
        )  # fmt: skip
        accs = [round(bench.measure(d, latency=False)["accuracy"], 4) for d in served]
        rounds_scores.append({"arm": arm, "validation_round_accs": accs})
        alone = _alone(bench, config, arm, CHOICE_SEED, f"nschoice/{arm}/alone", seconds)
        acc = round(bench.measure(alone, latency=False)["accuracy"], 4)
        alone_scores.append({"arm": arm, "validation_acc": acc})
        print(f"# noisy_student choice {arm}: rounds {accs}, alone {acc}", file=sys.stderr)
    return {
        "candidates": rounds_scores,
        "arm": max(rounds_scores, key=lambda r: r["validation_round_accs"][-1])["arm"],
        "alone_candidates": alone_scores,
        "alone_arm": max(alone_scores, key=lambda r: r["validation_acc"])["arm"],
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


def noisy_trial(bench: Measured, config: PipelineConfig, seed: int, rounds: int,
                choice: dict) -> dict:  # fmt: skip
    """Teacher, the rounds validation chose, the network alone without noise and as
    validation chose it; scored on test."""
    seconds: dict[str, float] = {}
    teacher = _trained(
        bench, seconds, "teacher", teacher_config(config, rounds), seed, "teacher",
        f"seed{seed}/teacher",
    )  # fmt: skip
    served, kept = _noisy_chain(
        bench, noisy_config(config, choice["arm"], rounds), teacher, seed, rounds,
        f"seed{seed}/round", seconds,
    )  # fmt: skip
    row = {
        "seed": seed,
        "arm": choice["arm"],
        "teacher_acc": bench.test_accuracy(bench.test_probabilities(teacher)),
        "round_accs": [bench.test_accuracy(bench.test_probabilities(d)) for d in served],
        "round_kept": kept,
    }
    for name, arm in (("unnoised_alone", UNNOISED), ("chosen_alone", choice["alone_arm"])):
        if name == "chosen_alone" and arm == UNNOISED:
            row["chosen_alone_acc"] = row["unnoised_alone_acc"]
            continue
        alone = _alone(bench, config, arm, seed, f"seed{seed}/alone_{arm}", seconds)
        row[f"{name}_acc"] = bench.test_accuracy(bench.test_probabilities(alone))
    row["params"] = bench.params(teacher)
    row["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    return row


def summarize_noisy(rows: list[dict], fraction: float, choice: dict | None) -> dict:
    """Means over seeds and paired 95% intervals: the last round against the network alone
    without noise, against it as validation chose it, and against the teacher."""
    final = [r["round_accs"][-1] for r in rows]
    rounds = len(rows[0]["round_accs"])

    def mean(values):
        return round(float(np.mean(values)), 4)

    def minus(key):
        return [f - r[key] for f, r in zip(final, rows, strict=True)]

    out = {
        "labeled_fraction": fraction,
        "seeds": len(rows),
        "model": NS_MODEL,
        "arm": rows[0]["arm"],
        "noise": NS_ARMS[rows[0]["arm"]],
        "params": rows[0]["params"],
        "teacher_acc": mean([r["teacher_acc"] for r in rows]),
        "round_accs": [mean([r["round_accs"][k] for r in rows]) for k in range(rounds)],
        "unnoised_alone_acc": mean([r["unnoised_alone_acc"] for r in rows]),
        "chosen_alone_acc": mean([r["chosen_alone_acc"] for r in rows]),
        # What validation chose (the trials' arm and the alone's).
        "choice": choice,
        "rows": rows,
    }
    for key, against in (
        ("final_minus_unnoised_alone", "unnoised_alone_acc"),
        ("final_minus_chosen_alone", "chosen_alone_acc"),
        ("final_minus_teacher", "teacher_acc"),
    ):
        out[key] = mean(minus(against))
        out[f"{key}_ci95"] = _interval(minus(against))
    ci = out["final_minus_unnoised_alone_ci95"]
    best = out["final_minus_chosen_alone_ci95"]
    out["targets"] = {
        "final_beats_unnoised_alone_ci_excludes_0": ci is not None and ci[0] > 0,
        "final_beats_chosen_alone_ci_excludes_0": best is not None and best[0] > 0,
    }
    return out


def run_noisy(bench: Measured, config: PipelineConfig, seeds: int, rounds: int):
    fraction = config.data.labeled_fraction
    settings = {
        "model": NS_MODEL,
        "teacher_noise": NS_NOISE,
        "arms": NS_ARMS,
        "steps": _steps(config),
        "noisy_student": {"rounds": rounds, **NS_RECIPE},
    }
    # Chosen before the trials, on validation; the trials read the test set once each.
    choice = _saved_choice(
        _settings_key("nschoice", fraction, **settings),
        lambda: choose_noise(bench, config, rounds),
    )
    if choice is None:
        return None
    rows = _resumable(
        _settings_key(
            "noisy_student", fraction, arm=choice["arm"], alone=choice["alone_arm"], **settings
        ),  # fmt: skip
        seeds,
        lambda seed: noisy_trial(bench, config, seed, rounds, choice),
        lambda seed, r: (
            f"noisy_student {fraction:g} seed {seed}: teacher {r['teacher_acc']:.4f}, rounds "
            f"{r['round_accs']} ({r['arm']}), alone unnoised {r['unnoised_alone_acc']:.4f}, "
            f"chosen {r['chosen_alone_acc']:.4f}"
        ),
    )
    return summarize_noisy(rows, fraction, choice) if rows else None


# `--saved-only`: summarise the rows earlier runs saved, train nothing.
SAVED_ONLY = False
BENCHMARK = "distillation_methods"
# Where finished trials and settings choices are saved (`--trials-dir`): committed with
# the results, so a trial that took most of an hour outlives the machine it ran on and
# a later session goes on from it; the models stay under `--workdir`.
TRIALS_DIR = os.path.join(REPO, "benchmarks", "results", "trials", BENCHMARK)


# kd: the shipped `fashion_mnist` demo's teacher and small conv student
# (1,283,818 and 56,290 parameters; make run's models, at its steps by
# default); what a user would train alone instead is the same student
# network, with or without image views, whichever the validation split
# prefers (the demo's two baselines).
KD_TEACHER = _SHIPPED["teacher"]
KD_STUDENT = _SHIPPED["student"]
VIEWS = {"translate": 2, "flip": True, "mixup": 0.0}
NO_VIEWS = {"translate": 0, "flip": False, "mixup": 0.0}
# One teacher per student seed: the seeds' pairs are independent (two teachers shared
# by five seeds gave per-teacher gains of +0.0043 and +0.0083).
KD_TEACHERS = 5


def kd_config(config: PipelineConfig, views: bool = False, **distillation) -> PipelineConfig:
    """`KD_TEACHER` and `KD_STUDENT` with or without image views (cache on only without)."""
    data = to_dict(config)
    data.update(teacher=KD_TEACHER, student=KD_STUDENT)
    data["train"]["augmentation"] = dict(VIEWS if views else NO_VIEWS)
    data["distillation"].update(cache_teacher_logits=not views, **distillation)
    return from_dict(data)


def _teacher(bench: Measured, config: PipelineConfig, seed: int, workdir: str, key: str) -> str:
    """The teacher of `seed`, trained once per setting and reused by every trial (resumable)."""
    marker = os.path.join(workdir, "trials", key, f"teacher{seed}.json")
    if os.path.exists(marker):
        with open(marker) as f:
            return json.load(f)["serving_dir"]
    serving = bench.train_classifier(
        bench_lib.with_seed(config, seed), "teacher", f"{key}/teacher{seed}"
    )
    _save(marker, {"serving_dir": serving, "provenance": results_lib.provenance()})
    return serving


def choose_kd(bench: Measured, config: PipelineConfig, teacher: str) -> dict:
    """On the validation split: (alpha, T) of the distilled student, and the student alone
    with or without views."""
    scores = []
    for alpha, temperature in CANDIDATES:
        cfg = kd_config(config, alpha=alpha, temperature=temperature)
        d = bench.distil(
            bench_lib.with_seed(cfg, CHOICE_SEED), teacher, f"kdchoice/a{alpha}_T{temperature}"
        )
        scores.append(
            {
                "alpha": alpha,
                "temperature": temperature,
                "validation_acc": bench.measure(d, latency=False)["accuracy"],
            }
        )
    alone = {}
    for views in (False, True):
        d = bench.train_classifier(
            bench_lib.with_seed(kd_config(config, views), CHOICE_SEED),
            "student",
            f"kdchoice/alone_views{views}",
        )
        alone[str(views)] = bench.measure(d, latency=False)["accuracy"]
    best = max(scores, key=lambda r: r["validation_acc"])
    return {
        "candidates": scores,
        "alpha": best["alpha"],
        "temperature": best["temperature"],
        "alone_validation_acc": alone,
        "alone_views": alone["True"] > alone["False"],
    }


def kd_trial(
    bench: Measured, config: PipelineConfig, seed: int, teacher: str, choice: dict
) -> dict:
    """At one student seed: the student alone (the chosen variant), distilled, and the
    alpha = 0 control through the Distiller's own input pipeline; scored on test."""
    seconds: dict[str, float] = {}
    chosen = kd_config(config, alpha=choice["alpha"], temperature=choice["temperature"])
    runs = {
        "alone": lambda: bench.train_classifier(
            bench_lib.with_seed(kd_config(config, choice["alone_views"]), seed),
            "student",
            f"kd/seed{seed}/alone",
        ),
        "distilled": lambda: bench.distil(
            bench_lib.with_seed(chosen, seed), teacher, f"kd/seed{seed}/distilled"
        ),
        "control": lambda: bench.distil(
            bench_lib.with_seed(chosen, seed, alpha=0.0), teacher, f"kd/seed{seed}/control"
        ),
    }
    row = {"seed": seed, "teacher": teacher}
    for name, run in runs.items():
        d = bench_lib.timed(seconds, name, run)
        row[f"{name}_acc"] = bench.test_accuracy(bench.test_probabilities(d))
    row["params"] = bench.params(d)
    row["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    return row


def run_kd(bench: Measured, config: PipelineConfig, seeds: int, workdir: str):
    """Issue-37 statistics for plain distillation: `KD_TEACHERS` teachers, `seeds` student
    seeds (seed s learns from teacher s mod `KD_TEACHERS`), choices on validation."""
    fraction = config.data.labeled_fraction
    key = _settings_key(
        "kd",
        fraction,
        teacher=KD_TEACHER,
        student=KD_STUDENT,
        steps=_steps(config),
        candidates=CANDIDATES,
        teachers=KD_TEACHERS,
    )
    choice = _saved_choice(
        key,
        lambda: choose_kd(
            bench, config, _teacher(bench, kd_config(config), CHOICE_SEED, workdir, key)
        ),
    )
    if choice is None:
        return None
    teachers = [
        _teacher(bench, kd_config(config), 100 + t, workdir, key) for t in range(KD_TEACHERS)
    ]
    rows = _resumable(
        f"{key}-a{choice['alpha']:g}-T{choice['temperature']:g}",
        seeds,
        lambda seed: kd_trial(bench, config, seed, teachers[seed % KD_TEACHERS], choice),
        lambda seed, r: (
            f"kd {fraction:g} seed {seed}: alone {r['alone_acc']:.4f}, distilled "
            f"{r['distilled_acc']:.4f}, alpha=0 control {r['control_acc']:.4f}"
        ),
    )
    if not rows:
        return None
    teacher_accs = [bench.test_accuracy(bench.test_probabilities(t)) for t in teachers]
    vs_alone = [r["distilled_acc"] - r["alone_acc"] for r in rows]
    vs_control = [r["distilled_acc"] - r["control_acc"] for r in rows]
    alone = float(np.mean([r["alone_acc"] for r in rows]))
    lead = float(np.mean(teacher_accs)) - alone
    out = {
        "labeled_fraction": fraction,
        "seeds": len(rows),
        "teachers": KD_TEACHERS,
        "choice": choice,
        "teacher_accs": [round(a, 4) for a in teacher_accs],
        "alone_acc": round(alone, 4),
        "distilled_acc": round(float(np.mean([r["distilled_acc"] for r in rows])), 4),
        "control_acc": round(float(np.mean([r["control_acc"] for r in rows])), 4),
        "distilled_minus_alone": round(float(np.mean(vs_alone)), 4),
        "distilled_minus_alone_ci95": _interval(vs_alone),
        "distilled_minus_control": round(float(np.mean(vs_control)), 4),
        "distilled_minus_control_ci95": _interval(vs_control),
        "gap_recovered": round(float(np.mean(vs_alone)) / lead, 3) if lead > 0 else None,
        "student_params": rows[0]["params"],
        "rows": rows,
    }
    return out


def _resumable(key: str, count: int, run_one, describe) -> list[dict]:
    """Rows 0 .. count - 1 of one setting: read back where a run saved them and they still
    describe HEAD (`_reusable`), else `run_one(i)` with its `provenance` (commit, date,
    machine, stack), saved at once (and `describe(i, row)` printed); with `SAVED_ONLY`, the
    saved rows before the first missing one."""
    rows = []
    for i in range(count):
        path = _saved_file(key, f"trial{i}")
        saved = _read_saved(path)
        if saved is not None:
            rows.append(saved)
            continue
        if SAVED_ONLY:
            break
        rows.append({**run_one(i), "provenance": results_lib.provenance()})
        _save(path, rows[-1])
        print(f"# {describe(i, rows[-1])}", file=sys.stderr, flush=True)
    return rows


def _saved_choice(key: str, choose) -> dict | None:
    """The settings choice saved under `key` (where it still describes HEAD), else
    `choose()` saved there (None with `SAVED_ONLY`, which trains nothing), with its
    `provenance`."""
    path = _saved_file(key, "choice")
    choice = _read_saved(path)
    if choice is not None:
        return choice
    if SAVED_ONLY:
        return None
    choice = {**choose(), "provenance": results_lib.provenance()}
    _save(path, choice)
    return choice


def _read_saved(path: str) -> dict | None:
    """The record saved at `path` when `_reusable` says it still describes HEAD, else None
    (saying why on stderr where one is there but is not reused)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    why = _reusable(record)
    if why is None:
        return record
    print(f"# {os.path.relpath(path, REPO)}: not reused ({why})", file=sys.stderr, flush=True)
    return None


def _reusable(record: dict) -> str | None:
    """Why a saved trial or choice no longer describes HEAD, or None when it does: it was
    measured on committed code that did not change while it trained (its `provenance`:
    `commit_start` and `commit`) and nothing this benchmark measures
    changed since, but for changes `benchmarks/neutral_changes.json` declares neutral, the
    rule a results file goes stale by (`testkit.results.staleness`)."""
    made = record.get("provenance") or {}
    if made.get("dirty") is not False:
        return "measured on uncommitted code, or no provenance"
    # Records saved before `commit_start` was recorded name only the commit at the save.
    started = made.get("commit_start", made)
    if started.get("commit") != made.get("commit") or started.get("dirty") is not False:
        return "the checkout changed while it trained"
    return results_lib.staleness({"benchmark": BENCHMARK, **made})


def _save(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _saved_file(key: str, name: str) -> str:
    return os.path.join(TRIALS_DIR, key, f"{name}.json")


def _settings_key(scenario: str, fraction: float, **settings) -> str:
    """Names one experiment's saved trials by the settings it fixes, written out (a digest of
    the whole config would change with every config field added since the trials ran)."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return f"{scenario}-{fraction:g}-{digest}"


def _steps(config: PipelineConfig) -> list[int]:
    return [config.train.train_steps, config.student_train_steps()]


def run_m_on_m(bench: Measured, config: PipelineConfig, trials: int) -> dict:
    fraction = config.data.labeled_fraction
    models = {"teacher": TEACHER, "student": STUDENT, "steps": _steps(config)}

    def choose() -> dict:
        seconds: dict[str, float] = {}
        return {**choose_settings(bench, config, seconds), "seconds": seconds}

    choice = _saved_choice(
        _settings_key("choice", fraction, candidates=CANDIDATES, **models), choose
    )
    if choice is None:
        return None
    chosen = bench_lib.with_seed(
        config, 0, alpha=choice["alpha"], temperature=choice["temperature"]
    )
    rows = _resumable(
        _settings_key(
            "m_on_m",
            fraction,
            kd=[choice["alpha"], choice["temperature"]],
            equal_cost=EQUAL_COST_STUDENT,
            **models,
        ),  # fmt: skip
        trials,
        lambda trial: m_on_m_trial(bench, chosen, trial),
        lambda trial, r: (
            f"m_on_m {fraction:g} trial {trial}: singles {r['single_accs']}, ensemble "
            f"{r['student_ensemble_acc']:.4f}, equal-cost student {r['equal_cost_single_acc']:.4f}, "
            f"alone ensemble {r['alone_ensemble_acc']:.4f}, teachers {r['teacher_ensemble_acc']:.4f}"
        ),
    )
    return summarize_m_on_m(rows, fraction, choice) if rows else None


# The headline's keys, exactly as the issue names them (the line before it
# carries every other figure: intervals against the one student, counts).
M_ON_M_KEYS = (
    "mean_single_acc",
    "student_ensemble_acc",
    "ensemble_minus_mean_single",
    "ensemble_minus_mean_single_ci95",
    "equal_cost_single_acc",
    "ensemble_minus_equal_cost_single",
    "ensemble_minus_equal_cost_single_ci95",
    "alone_ensemble_acc",
    "ensemble_minus_alone_ensemble",
    "ensemble_minus_alone_ensemble_ci95",
    "teacher_ensemble_acc",
    "param_ratio_vs_one_teacher",
)
KD_KEYS = (
    "teacher_accs",
    "alone_acc",
    "distilled_acc",
    "control_acc",
    "distilled_minus_alone",
    "distilled_minus_alone_ci95",
    "distilled_minus_control",
    "distilled_minus_control_ci95",
    "gap_recovered",
    "seeds",
)
NOISY_KEYS = (
    "arm",
    "teacher_acc",
    "round_accs",
    "unnoised_alone_acc",
    "final_minus_unnoised_alone",
    "final_minus_unnoised_alone_ci95",
    "chosen_alone_acc",
    "final_minus_chosen_alone",
    "final_minus_chosen_alone_ci95",
    "final_minus_teacher",
    "final_minus_teacher_ci95",
)


# Step counts (teacher, student) this machine trains in minutes per trial,
# fixed per scenario by the budget, not chosen.
STEPS = {
    "m_on_m": (2000, 3000),
    "noisy_student": (3000, 4000),
    # make run's own schedule.
    "kd": (_SHIPPED["train"]["train_steps"], _SHIPPED["distillation"]["student_train_steps"]),
}
FRACTIONS = {"m_on_m": "1,0.1", "noisy_student": "0.01,0.1", "kd": "1,0.1"}
HEADLINE_KEYS = {"m_on_m": M_ON_M_KEYS, "noisy_student": NOISY_KEYS, "kd": KD_KEYS}
# `--scenario methods`: both methods the issue measures, one headline.
METHODS = ("noisy_student", "m_on_m")


def run_scenario(scenario: str, args, data: ResolvedInput, paths: dict, choice) -> tuple:
    """One scenario over its fractions: its JSON lines and its headline part."""
    default_teacher, default_student = STEPS[scenario]
    config = base_config(
        data.input_base,
        args.teacher_steps or default_teacher,
        args.student_steps or default_student,
    )
    lines, headline = [], {}
    for fraction in (float(f) for f in (args.fractions or FRACTIONS[scenario]).split(",")):
        started = time.perf_counter()
        cfg = with_fraction(config, fraction)
        bench = Measured(cfg, paths, args.workdir, choice)
        if scenario == "noisy_student":
            line = run_noisy(bench, cfg, args.trials, args.rounds)
        elif scenario == "kd":
            line = run_kd(bench, cfg, args.trials, args.workdir)
        else:
            line = run_m_on_m(bench, cfg, args.trials)
        if line is None:
            print(f"# {scenario} {fraction:g}: no saved trial", file=sys.stderr)
            continue
        line = {"scenario": scenario, **line, "seconds": round(time.perf_counter() - started, 1)}
        bench_lib.emit(line)
        lines.append(line)
        headline[f"{fraction:g}"] = {k: line[k] for k in HEADLINE_KEYS[scenario]}
    return lines, headline


def main(argv: list[str] | None = None) -> None:
    global SAVED_ONLY, TRIALS_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scenario", choices=("m_on_m", "noisy_student", "kd", "methods"), default="methods"
    )
    parser.add_argument(
        "--fractions",
        default="",
        help="default: 1,0.1 (m_on_m, kd), 0.01,0.1 (noisy_student); each its own with methods",
    )
    parser.add_argument("--trials", type=int, default=5, help="trials (m_on_m) or seeds")
    parser.add_argument("--rounds", type=int, default=2, help="Noisy Student rounds")
    parser.add_argument("--teacher-steps", type=int, default=0, help="default: STEPS[scenario]")
    parser.add_argument("--student-steps", type=int, default=0, help="default: STEPS[scenario]")
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "bench_methods"))
    parser.add_argument(
        "--shared-with",
        default="",
        help="what else ran on the cores (recorded; accuracy does not need an idle machine)",
    )
    parser.add_argument(
        "--trials-dir",
        default=TRIALS_DIR,
        help="where finished trials and choices are saved and read back (default: committed)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument(
        "--saved-only",
        action="store_true",
        help="summarise the trials earlier runs saved (resumed sessions); train nothing new",
    )
    args = parser.parse_args(argv)
    SAVED_ONLY, TRIALS_DIR = args.saved_only, os.path.abspath(args.trials_dir)
    started, trees = results_lib.commit(), CODE.trees()
    key = CODE.key(trees)
    args.workdir = os.path.join(args.workdir, key)

    data = write_splits(os.path.join(args.workdir, "data"))
    # Transform's output does not depend on step counts: fixed ones keep its cached run.
    paths = bench_lib.run_transform(base_config(data.input_base, 2000, 3000), args.workdir, data)
    choice = strategies.create_strategy(base_config(data.input_base, 2000, 3000).strategy)
    scenarios = METHODS if args.scenario == "methods" else (args.scenario,)
    lines, headline = [], {}
    for scenario in scenarios:
        scenario_lines, headline[scenario] = run_scenario(scenario, args, data, paths, choice)
        lines += scenario_lines
    bench_lib.emit(headline)
    if not args.no_results:
        revision.check_writable(key, started, trees, CODE)
        path = results_lib.write(
            "distillation",
            [*lines, headline],
            shared_with=args.shared_with or None,
            argv=sys.argv[1:] if argv is None else argv,
            stem=f"distillation_{args.scenario}",
        )
        print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
