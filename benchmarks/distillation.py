"""Distillation: teacher vs student from scratch vs distilled student.

One run, one machine, per dataset (`digits`, `mnist` = `tests/data/
mnist_1000.tfrecord`, `taxi`, `fashion_mnist`: the 70,000 real images of the
Debian package `dataset-fashion-mnist`, `make fashion-mnist`):

1. ExampleGen -> StatisticsGen -> SchemaGen -> tfxkit Transform run once
   through TFX (BeamDagRunner) into `--workdir` (reused when it is there,
   whatever the step, label and mixup options);
2. for each of `--seeds` seeds, on that Transform output and with the
   config's `train` settings (same steps, batch and learning rate for all):
   the teacher (`teacher` shape, hard labels), the student from scratch
   (`student` shape, hard labels only) and the distilled student (`student`
   shape, `distillation` settings, taught by that seed's teacher), each
   trained with the Trainer's `training.fit` and exported with the Trainer's
   serving export; with `--mixup 0,0.2` the two students are trained once
   per listed `train.augmentation.mixup` alpha, all taught by the same
   teachers (trained with the config's own setting);
3. every exported model is measured through its `serving_default`
   signature on the raw eval split (`pipelines.report.measure_model`):
   accuracy, trainable parameters, median latency at batch 1 and 256;
4. the speed-up of teacher-target caching: steady-state steps/s of the
   distilled student (Keras epochs after the first, when every example has
   been seen) with `distillation.cache_teacher_logits` off and on (seed 0);
5. on `--sweep-dataset` (digits), distilled accuracy for T in {1, 2, 5, 10,
   20} x alpha in {0.1, 0.5, 0.9} over the first `--sweep-seeds` teachers.

Output: one JSON line per dataset (and `--mixup` value) with `dataset`,
`mixup` (the students'), `labeled_fraction`, the step counts, `teacher_acc`,
`scratch_acc`, `distilled_acc` (means over seeds, with `_std`),
`gap_recovered` = (distilled - scratch) / (teacher - scratch),
`param_ratio` and `latency_ratio_b1` / `latency_ratio_b256` (student /
teacher), the cache figures and the targets; a line for the sweep; and last,
one JSON object with key `datasets` holding the per-dataset objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from benchmarks.distillation_common import (  # noqa: E402
    Bench,
    SteadyStateTimer,
    dataset_config,
    emit,
    run_transform,
    timed,
    with_mixup,
    with_seed,
)
from components.config import PipelineConfig  # noqa: E402
from components.training import strategies  # noqa: E402
from pipelines import report  # noqa: E402
from pipelines.configs import load_config  # noqa: E402
from testkit.stats import mean_std  # noqa: E402

TEMPERATURES = (1.0, 2.0, 5.0, 10.0, 20.0)
ALPHAS = (0.1, 0.5, 0.9)


def bench_dataset(
    bench: Bench,
    seeds: list[int],
    ensemble_size: int = 0,
    ensemble_students: int = 0,
    *,
    mixup: float | None = None,
    teachers: dict[int, str] | None = None,
    cache_timing: bool = True,
) -> tuple[dict, list[str]]:
    """Teacher, scratch and distilled student per seed; then the ensemble of the first teachers.

    The scratch student has the distilled student's shape, steps, schedule and
    augmentation and learns from hard labels only, so the difference is the
    teachers' soft targets. The teacher-target cache is timed only without
    augmentation (augmented views are never repeated, so it cannot apply).

    Args:
      mixup: `train.augmentation.mixup` of the students (None: the config's).
        The teachers keep the config's setting.
      teachers: Seed -> exported teacher, reused where present and filled in
        here, so that students at several mixup values learn from the same
        teachers.
      cache_timing: Time the teacher-target cache (a second distilled
        student of the first seed, without the cache).
    """
    config = bench.config
    students = config if mixup is None else with_mixup(config, mixup)
    runs = "" if mixup is None else f"mixup{mixup:g}/"
    teachers = {} if teachers is None else teachers
    rows = {"teacher": [], "scratch": [], "distilled": []}
    teacher_dirs = []
    timers = {}
    seconds: dict[str, float] = {}
    augmented = students.train.augmentation.enabled
    for seed in seeds:
        if seed not in teachers:
            teachers[seed] = timed(
                seconds,
                "teacher",
                bench.train_classifier,
                with_seed(config, seed),
                "teacher",
                f"seed{seed}/teacher",
            )
        teacher_dir = teachers[seed]
        teacher_dirs.append(teacher_dir)
        seeded = with_seed(students, seed)
        scratch_dir = timed(
            seconds,
            "scratch",
            bench.train_classifier,
            seeded,
            "student",
            f"{runs}seed{seed}/scratch",
        )
        cached = not augmented and (seed == seeds[0] or config.distillation.cache_teacher_logits)
        timer = SteadyStateTimer()
        distilled_dir = timed(
            seconds,
            "distilled",
            bench.distil,
            with_seed(students, seed, cache_teacher_logits=cached),
            teacher_dir,
            f"{runs}seed{seed}/distilled",
            timer,
        )
        if seed == seeds[0] and not augmented and cache_timing:
            timers["cached"] = timer
            timers["uncached"] = SteadyStateTimer()
            bench.distil(
                with_seed(students, seed, cache_teacher_logits=False),
                teacher_dir,
                f"{runs}seed{seed}/distilled_uncached",
                timers["uncached"],
            )
        for role, d in (
            ("teacher", teacher_dir),
            ("scratch", scratch_dir),
            ("distilled", distilled_dir),
        ):
            rows[role].append(bench.measure(d))
        print(
            f"# {config.name} seed {seed}: "
            + ", ".join(f"{role} {rows[role][-1]['accuracy']:.4f}" for role in rows),
            file=sys.stderr,
            flush=True,
        )
    result: dict = {
        "dataset": config.name,
        "seeds": len(seeds),
        "labeled_fraction": config.data.labeled_fraction,
        "mixup": students.train.augmentation.mixup,
        "train_steps": config.train.train_steps,
        "student_steps": config.student_train_steps(),
    }
    for role in rows:
        mean, std = mean_std([r["accuracy"] for r in rows[role]])
        result[f"{role}_acc"], result[f"{role}_acc_std"] = mean, std
    gap = result["teacher_acc"] - result["scratch_acc"]
    result["gap_recovered"] = (
        (result["distilled_acc"] - result["scratch_acc"]) / gap if gap > 0 else None
    )
    # Paired by seed: the distilled and scratch students of a seed share its initialisation.
    diffs = [
        d["accuracy"] - s["accuracy"]
        for d, s in zip(rows["distilled"], rows["scratch"], strict=True)
    ]
    diff_mean, diff_std = mean_std(diffs)
    result["distilled_minus_scratch"] = diff_mean
    result["distilled_minus_scratch_se"] = diff_std / len(diffs) ** 0.5 if len(diffs) > 1 else None
    result["retained"] = result["distilled_acc"] / result["teacher_acc"]
    teacher_params, student_params = rows["teacher"][0]["params"], rows["distilled"][0]["params"]
    result["teacher_params"], result["student_params"] = teacher_params, student_params
    result["param_ratio"] = student_params / teacher_params
    for batch in report.LATENCY_BATCHES:
        for prefix in ("", "model_"):
            t = statistics.median(r[f"{prefix}latency_ms_b{batch}"] for r in rows["teacher"])
            s = statistics.median(r[f"{prefix}latency_ms_b{batch}"] for r in rows["distilled"])
            (
                result[f"teacher_{prefix}latency_ms_b{batch}"],
                result[f"student_{prefix}latency_ms_b{batch}"],
            ) = t, s
            result[f"{prefix}latency_ratio_b{batch}"] = s / t
    if timers:
        result["distill_steps_per_s_uncached"] = timers["uncached"].steps_per_second
        result["distill_steps_per_s_cached"] = timers["cached"].steps_per_second
        result["cache_speedup"] = (
            timers["cached"].steps_per_second / timers["uncached"].steps_per_second
        )
    if ensemble_size > 1 and ensemble_students > 0:
        members = teacher_dirs[:ensemble_size]
        result["ensemble_size"] = len(members)
        result["ensemble_acc"] = bench.ensemble_accuracy(members)
        accs = []
        for seed in seeds[:ensemble_students]:
            d = timed(
                seconds,
                "ensemble_distilled",
                bench.distil,
                # The cache keeps the ensemble's combined targets: same
                # targets, one pass of the teachers per distinct example.
                with_seed(
                    students,
                    seed,
                    cache_teacher_logits=not augmented and config.distillation.cache_teacher_logits,
                ),
                members,
                f"{runs}seed{seed}/ensemble_distilled",
            )
            accs.append(bench.measure(d, latency=False)["accuracy"])
            print(
                f"# {config.name} seed {seed}: ensemble-distilled {accs[-1]:.4f}",
                file=sys.stderr,
                flush=True,
            )
        result["ensemble_distilled_acc"], result["ensemble_distilled_acc_std"] = mean_std(accs)
        result["ensemble_students"] = len(accs)
        # Against the same seeds' scratch students.
        scratch = float(np.mean([r["accuracy"] for r in rows["scratch"][: len(accs)]]))
        egap = result["ensemble_acc"] - scratch
        result["ensemble_gap_recovered"] = (
            (result["ensemble_distilled_acc"] - scratch) / egap if egap > 0 else None
        )
    result["seconds_per_stage"] = {k: round(v, 1) for k, v in seconds.items()}
    se = result["distilled_minus_scratch_se"]
    result["targets"] = {
        "teacher_beats_scratch": result["teacher_acc"] > result["scratch_acc"],
        "param_ratio_le_0.1": result["param_ratio"] <= 0.1,
        "model_latency_ratio_b256_le_1/3": result["model_latency_ratio_b256"] <= 1 / 3,
        "distilled_minus_scratch_gt_2se": se is not None and diff_mean > 2 * se,
        "gap_recovered_ge_0.5": result["gap_recovered"] is not None
        and result["gap_recovered"] >= 0.5,
        "retained_ge_0.97": result["retained"] >= 0.97,
    }
    if "ensemble_gap_recovered" in result:
        result["targets"]["ensemble_recovers_at_least_one_teacher"] = (
            result["ensemble_gap_recovered"] is not None
            and result["gap_recovered"] is not None
            and result["ensemble_gap_recovered"] >= result["gap_recovered"]
        )
    return result, teacher_dirs


def sweep(bench: Bench, teacher_dirs: list[str], seeds: list[int]) -> dict:
    results = []
    for temperature in TEMPERATURES:
        for alpha in ALPHAS:
            accs = []
            for seed, teacher_dir in zip(seeds, teacher_dirs, strict=False):
                config = with_seed(
                    bench.config,
                    seed,
                    temperature=temperature,
                    alpha=alpha,
                    cache_teacher_logits=True,
                )
                accs.append(
                    bench.measure(
                        bench.distil(config, teacher_dir, f"sweep/T{temperature}_a{alpha}_s{seed}"),
                        latency=False,
                    )["accuracy"]
                )
            mean, std = mean_std(accs)
            results.append(
                {
                    "temperature": temperature,
                    "alpha": alpha,
                    "distilled_acc": mean,
                    "distilled_acc_std": std,
                }
            )
            print(f"# sweep T={temperature} alpha={alpha}: {mean:.4f}", file=sys.stderr, flush=True)
    best = max(results, key=lambda r: r["distilled_acc"])
    return {
        "sweep": bench.config.name,
        "seeds": len(teacher_dirs),
        "results": results,
        "best": best,
    }


def scaled_steps(
    config: PipelineConfig, train_steps: int, student_steps: int, factor: float
) -> PipelineConfig:
    """The config with overridden (and, for --quick, scaled-down) step counts."""
    train = config.train
    teacher = max(10, int((train_steps or train.train_steps) * factor))
    student = int((student_steps or config.distillation.student_train_steps) * factor)
    warmup = min(int(train.warmup_steps * factor), teacher - 1, (student or teacher) - 1)
    return dataclasses.replace(
        config,
        train=dataclasses.replace(
            train,
            train_steps=teacher,
            warmup_steps=warmup,
            steps_per_epoch=min(train.steps_per_epoch, teacher),
        ),
        distillation=dataclasses.replace(config.distillation, student_train_steps=student),
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--scenario"]:
        # The distillation methods' scenarios (methods = noisy_student then m_on_m, or one
        # of them, or kd), with their own options.
        from benchmarks import distillation_methods

        distillation_methods.main(argv)
        return
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="'--scenario methods|m_on_m|noisy_student|kd [options]' (first) runs "
        "benchmarks/distillation_methods.py instead",
    )
    parser.add_argument("--datasets", default="digits,mnist,taxi")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sweep-dataset", default="digits")
    parser.add_argument("--sweep-seeds", type=int, default=3, help="0 skips the T x alpha sweep")
    parser.add_argument(
        "--train-steps", type=int, default=0, help="override train.train_steps (0: the config's)"
    )
    parser.add_argument(
        "--student-steps",
        type=int,
        default=0,
        help="override distillation.student_train_steps (0: the config's)",
    )
    parser.add_argument(
        "--ensemble-size",
        type=int,
        default=3,
        help="teachers (the first seeds') distilled together; <2 skips",
    )
    parser.add_argument(
        "--ensemble-students", type=int, default=2, help="seeds that also distil the ensemble"
    )
    parser.add_argument(
        "--labeled-fraction",
        type=float,
        default=1.0,
        help="scarce labels: teacher and scratch student see this fraction of the labels; "
        "the distilled student also sees every other training image, unlabeled",
    )
    parser.add_argument(
        "--mixup",
        default="",
        help="comma-separated train.augmentation.mixup alphas of the students, e.g. 0,0.2: scratch "
        "and distilled students per value, one JSON line each, all taught by the same teachers "
        "(trained with the config's setting); '' keeps the config's setting for every role",
    )
    parser.add_argument(
        "--no-cache-timing",
        action="store_true",
        help="skip timing the teacher-target cache (a second distilled student of the first seed)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="development run: 2 seeds, 1/10 of the steps, no sweep"
    )
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "bench_distillation"))
    args = parser.parse_args(argv)

    if args.quick:
        args.seeds, args.sweep_seeds, args.ensemble_students = (
            min(args.seeds, 2),
            0,
            min(args.ensemble_students, 1),
        )
    choice = strategies.create_strategy(load_config("digits").strategy)
    seeds = list(range(args.seeds))
    summaries = []
    sweep_line = None
    alphas = [float(a) for a in args.mixup.split(",")] if args.mixup else [None]
    for name in args.datasets.split(","):
        started = time.perf_counter()
        # Transform sees the dataset's config as shipped: its output does not
        # depend on steps, labels used or augmentation, so the workdir's
        # Transform is reused whatever those options are.
        paths = run_transform(dataset_config(name), args.workdir)
        config = scaled_steps(
            dataset_config(name), args.train_steps, args.student_steps, 0.1 if args.quick else 1.0
        )
        if args.labeled_fraction < 1.0:
            config = dataclasses.replace(
                config,
                data=dataclasses.replace(config.data, labeled_fraction=args.labeled_fraction),
            )
        bench = Bench(config, paths, args.workdir, choice)
        teachers: dict[int, str] = {}
        for alpha in alphas:
            result, teacher_dirs = bench_dataset(
                bench,
                seeds,
                args.ensemble_size,
                args.ensemble_students,
                mixup=alpha,
                teachers=teachers,
                cache_timing=not args.no_cache_timing,
            )
            result["seconds"] = round(time.perf_counter() - started, 1)
            started = time.perf_counter()
            emit(result)
            summaries.append(result)
        if name == args.sweep_dataset and args.sweep_seeds:
            sweep_line = sweep(bench, teacher_dirs[: args.sweep_seeds], seeds[: args.sweep_seeds])
    if sweep_line is not None:
        emit(sweep_line)
    emit({"datasets": summaries})


if __name__ == "__main__":
    main()
