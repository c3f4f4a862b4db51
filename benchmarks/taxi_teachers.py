"""Taxi: is there a teacher worth distilling? Teachers, small models alone and distilled students.

The shipped `taxi` config trains one model and has no distillation stage.
This benchmark is the evidence for that choice, measured as the other
distillation benchmarks are (validation choices, paired seeds, the test set
read once per final model):

Data: the taxi CSV that ships in the tfx wheel (15,002 rows), split once by
a fixed permutation (seed 0) into `test` (3,000 rows), `eval` (2,000: the
validation split every choice reads) and `train` (the other 10,002). One
Transform of the shipped config (analysers on `train`) serves every model.

1. Choice, on validation, at `CHOICE_SEED`: the best of the `TEACHERS`
   (shape and steps: the shipped teacher and a narrower one, dropout 0.3 and
   0.5, 1,000 and 3,000 steps), the best of the small models `SMALL` trained
   alone (the config's default student, 16 units, and one of 32 units, at
   1,000 and 3,000 steps), then (alpha, T) of that small model distilled
   from the chosen teacher among `CANDIDATES`.
2. Trials, seeds 0 .. n-1: the chosen teacher, the chosen small model alone
   and the distilled student taught by that seed's teacher; each model's
   test accuracy.
3. Rules, no training: "paid by credit card" and "never a big tipper"
   (the majority class), on the test rows.

Output: one JSON line per choice and trial, then the headline: test
accuracies (means over seeds), the paired differences teacher - alone and
distilled - alone with 95% t intervals over seeds, the rules, the choices
and parameter counts. Runs are saved under `--workdir`, in a directory
named by the code that trains them (`CODE`, `benchmarks/revision.py`; a run
with uncommitted changes gets a new one), and resume there; results are
written only when the run began on committed code that did not change
while it ran.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from benchmarks import distillation_common as bench_lib  # noqa: E402
from benchmarks import distillation_methods as methods  # noqa: E402
from benchmarks import revision  # noqa: E402
from components.config import PipelineConfig, from_dict, to_dict  # noqa: E402
from components.data.sources import ResolvedInput, taxi_csv_path  # noqa: E402
from components.training import strategies  # noqa: E402
from pipelines.configs import load_config  # noqa: E402
from testkit import results as results_lib  # noqa: E402
from testkit.stats import mean_std  # noqa: E402

TEST_ROWS = 3000
VALIDATION_ROWS = 2000
SPLITS = (("train", "train/*.csv"), ("eval", "eval/*.csv"), ("test", "test/*.csv"))
SHIPPED_TEACHER = {"hidden_units": [512, 256, 128], "embedding_dim": 16, "dropout": 0.5}
NARROW_TEACHER = {"hidden_units": [128, 64], "embedding_dim": 16, "dropout": 0.3}
# (name, model shape, steps): what a user would try as a teacher.
TEACHERS = tuple(
    (f"{name}_d{shape['dropout']:g}_{steps}", shape, steps)
    for name, base in (("wide", SHIPPED_TEACHER), ("narrow", NARROW_TEACHER))
    for shape in (base, {**base, "dropout": 0.3 if base["dropout"] == 0.5 else 0.5})
    for steps in (1000, 3000)
)
# (name, model shape, steps): small models a user would train alone instead.
SMALL = tuple(
    (f"mlp{shape['hidden_units'][0]}_{steps}", shape, steps)
    for shape in (
        {"hidden_units": [16], "embedding_dim": 2},
        {"hidden_units": [32], "embedding_dim": 4},
    )
    for steps in (1000, 3000)
)
# (alpha, T) of the distilled student, chosen on validation.
CANDIDATES = ((0.5, 1.0), (0.9, 2.0), (0.9, 4.0))
CHOICE_SEED = 900
# What the trained models depend on: the methods benchmark's code and this script.
CODE = revision.Code(
    (*methods.CODE.paths, "benchmarks/taxi_teachers.py"),
    methods.CODE.not_training,
    (*methods.CODE.files, "benchmarks/taxi_teachers.py"),
)
RULE_COLUMN, RULE_VALUE = "payment_type", "Credit Card"


def write_splits(directory: str) -> ResolvedInput:
    """The taxi CSV as train / eval (validation) / test, by a fixed permutation."""
    marker = os.path.join(directory, "done")
    if not os.path.exists(marker):
        with open(taxi_csv_path(), newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames), list(reader)
        order = np.random.RandomState(0).permutation(len(rows))
        parts = {
            "test": order[:TEST_ROWS],
            "eval": order[TEST_ROWS : TEST_ROWS + VALIDATION_ROWS],
            "train": order[TEST_ROWS + VALIDATION_ROWS :],
        }
        for split, indices in parts.items():
            os.makedirs(os.path.join(directory, split), exist_ok=True)
            with open(os.path.join(directory, split, "data.csv"), "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows[i] for i in indices)
        open(marker, "w").close()
    return ResolvedInput(directory, "*/*.csv", "csv", splits=SPLITS)


def rule_accuracies(test_csv: str, label: str) -> dict[str, float]:
    """Test accuracy of the two rules a model must beat: "paid by credit card"
    means a big tipper, and "never a big tipper"."""
    with open(test_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r[label] != ""]
    truth = np.array([int(float(r[label])) for r in rows])
    card = np.array([int(r[RULE_COLUMN] == RULE_VALUE) for r in rows])
    return {
        "credit_card_rule_acc": round(float(np.mean(card == truth)), 4),
        "majority_acc": round(float(np.mean(truth == 0)), 4),
    }


def base_config(directory: str) -> PipelineConfig:
    """The shipped taxi config on these splits."""
    data = to_dict(load_config("taxi"))
    data.pop("kubeflow", None)
    data["name"] = "taxi-teachers"
    data["data"].update(builtin="", path=directory)
    return from_dict(data)


def shaped(
    config: PipelineConfig, role: str, shape: dict, steps: int, cap: int = 0, **distillation
) -> PipelineConfig:
    """`config` with `role`'s model `shape` trained for `steps` (the teacher's
    `train.train_steps`, or the student's `distillation.student_train_steps`),
    at most `cap` steps when `cap` is set (a smoke run)."""
    steps = min(steps, cap) if cap else steps
    data = to_dict(config)
    data[role] = shape
    if role == "teacher":
        data["train"]["train_steps"] = steps
    else:
        data["distillation"].update(student_train_steps=steps, **distillation)
    return from_dict(data)


def choose(bench: methods.Measured, config: PipelineConfig, cap: int = 0) -> dict:
    """The teacher, the small model alone and (alpha, T), each by validation accuracy."""
    scores: dict[str, list] = {"teacher_scores": [], "small_scores": [], "distil_scores": []}
    dirs = {}
    for name, shape, steps in TEACHERS:
        cfg = bench_lib.with_seed(shaped(config, "teacher", shape, steps, cap), CHOICE_SEED)
        dirs[name] = bench.train_classifier(cfg, "teacher", f"choice/teacher_{name}")
        acc = bench.measure(dirs[name], latency=False)["accuracy"]
        scores["teacher_scores"].append({"name": name, "validation_acc": acc})
        print(f"# choice teacher {name}: validation {acc:.4f}", file=sys.stderr, flush=True)
    for name, shape, steps in SMALL:
        cfg = bench_lib.with_seed(shaped(config, "student", shape, steps, cap), CHOICE_SEED)
        d = bench.train_classifier(cfg, "student", f"choice/alone_{name}")
        acc = bench.measure(d, latency=False)["accuracy"]
        scores["small_scores"].append({"name": name, "validation_acc": acc})
        print(f"# choice alone {name}: validation {acc:.4f}", file=sys.stderr, flush=True)
    teacher = max(scores["teacher_scores"], key=lambda r: r["validation_acc"])["name"]
    small = max(scores["small_scores"], key=lambda r: r["validation_acc"])["name"]
    _, shape, steps = _named(SMALL, small)
    for alpha, temperature in CANDIDATES:
        cfg = bench_lib.with_seed(
            shaped(config, "student", shape, steps, cap, alpha=alpha, temperature=temperature),
            CHOICE_SEED,
        )
        d = bench.distil(cfg, dirs[teacher], f"choice/distilled_a{alpha:g}_T{temperature:g}")
        acc = bench.measure(d, latency=False)["accuracy"]
        scores["distil_scores"].append(
            {"alpha": alpha, "temperature": temperature, "validation_acc": acc}
        )
        print(f"# choice alpha={alpha} T={temperature}: {acc:.4f}", file=sys.stderr, flush=True)
    best = max(scores["distil_scores"], key=lambda r: r["validation_acc"])
    return {
        "teacher": teacher,
        "small": small,
        "alpha": best["alpha"],
        "temperature": best["temperature"],
        **scores,
    }


def _named(table: tuple, name: str) -> tuple:
    (row,) = [r for r in table if r[0] == name]
    return row


def trial(
    bench: methods.Measured, config: PipelineConfig, choice: dict, seed: int, cap: int = 0
) -> dict:
    """Seed `seed`'s chosen teacher, small model alone and distilled student, on test."""
    _, teacher_shape, teacher_steps = _named(TEACHERS, choice["teacher"])
    _, small_shape, small_steps = _named(SMALL, choice["small"])
    teacher_config = bench_lib.with_seed(
        shaped(config, "teacher", teacher_shape, teacher_steps, cap), seed
    )
    teacher = bench.train_classifier(teacher_config, "teacher", f"seed{seed}/teacher")
    alone = bench.train_classifier(
        bench_lib.with_seed(shaped(config, "student", small_shape, small_steps, cap), seed),
        "student",
        f"seed{seed}/alone",
    )
    distilled_config = shaped(
        config,
        "student",
        small_shape,
        small_steps,
        cap,
        alpha=choice["alpha"],
        temperature=choice["temperature"],
    )
    distilled = bench.distil(
        bench_lib.with_seed(distilled_config, seed), teacher, f"seed{seed}/distilled"
    )
    row = {"seed": seed}
    for role, d in (("teacher", teacher), ("alone", alone), ("distilled", distilled)):
        row[f"{role}_acc"] = round(bench.test_accuracy(bench.test_probabilities(d)), 4)
        row[f"{role}_params"] = bench.params(d)
    return row


def headline(rows: list[dict], choice: dict, rules: dict[str, float]) -> dict:
    """Test means over seeds, the paired differences with 95% t intervals (None
    below 2 seeds), the rules and the choices."""

    def mean(key):
        return round(mean_std([r[key] for r in rows])[0], 4)

    out: dict = {"seeds": len(rows)}
    for role in ("teacher", "alone", "distilled"):
        out[f"{role}_acc"] = mean(f"{role}_acc")
        out[f"{role}_params"] = rows[0][f"{role}_params"] if rows else None
    for name, key in (
        ("teacher_minus_alone", "teacher_acc"),
        ("distilled_minus_alone", "distilled_acc"),
    ):
        diffs = [r[key] - r["alone_acc"] for r in rows]
        out[name] = round(mean_std(diffs)[0], 4) if diffs else None
        out[f"{name}_ci95"] = methods._interval(diffs)
        out[f"{name}_wins"] = sum(d > 0 for d in diffs)
    out.update(rules)
    out["choice"] = {k: choice[k] for k in ("teacher", "small", "alpha", "temperature")}
    return out


def saved(workdir: str, name: str, make) -> dict:
    """What a run under the same code key saved as `<workdir>/saved/<name>.json`, else
    `make()` with its `provenance`, saved there at once (the work directory is named by
    the code that trains, so nothing other code made is reused)."""
    path = os.path.join(workdir, "saved", f"{name}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    record = {**make(), "provenance": results_lib.provenance()}
    methods._save(path, record)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "bench_taxi_teachers"))
    parser.add_argument(
        "--shared-with",
        default="",
        help="what else ran on the cores (recorded; accuracy does not need an idle machine)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="cap every model's steps (a smoke run: its own directory, no results written)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds: at least 2, or the paired intervals mean nothing")
    started, trees = results_lib.commit(), CODE.trees()
    key = CODE.key(trees)
    workdir = os.path.join(args.workdir, key + (f"-max{args.max_steps}" if args.max_steps else ""))
    data = write_splits(os.path.join(workdir, "data"))
    config = base_config(data.input_base)
    paths = bench_lib.run_transform(config, workdir, data)
    bench = methods.Measured(config, paths, workdir, strategies.create_strategy(config.strategy))
    choice = saved(workdir, "choice", lambda: choose(bench, config, args.max_steps))
    lines = [{"stage": "choice", **choice}]
    bench_lib.emit(lines[0])
    rows = []
    for i in range(args.seeds):
        rows.append(
            saved(workdir, f"trial{i}", lambda i=i: trial(bench, config, choice, i, args.max_steps))
        )
        print(f"# seed {i}: {rows[-1]}", file=sys.stderr, flush=True)
    lines += [{"stage": "trial", **row} for row in rows]
    rules = rule_accuracies(
        os.path.join(data.input_base, "test", "data.csv"), config.data.label.name
    )
    lines.append(headline(rows, choice, rules))
    for line in lines[1:]:
        bench_lib.emit(line)
    if not args.no_results and not args.max_steps:
        revision.check_writable(key, started, trees, CODE)
        path = results_lib.write(
            "taxi_teachers",
            lines,
            shared_with=args.shared_with or None,
            argv=sys.argv[1:] if argv is None else argv,
        )
        print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
