"""Whether distillation paid on one run: the accuracies and one plain sentence.

Shared by the config pipeline's report and the Distiller of a `student_fn`,
which records it beside its model (`VERDICT_FILE`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Written at the root of the Distiller's model artifact (not inside its
# serving directory, which is what a Pusher copies).
VERDICT_FILE = "distillation_verdict.json"


def verdict(
    teacher: float,
    student: float,
    alone: float | None,
    others: Sequence[Mapping[str, Any]] = (),
    student_params: int | None = None,
    scratch_name: str = "",
) -> dict[str, Any]:
    """The distilled `student` against the same student trained `alone` and the `teacher`.

    Accuracies on the eval split. `improved` is True when the student beat
    the one trained alone, False when it did not, None without that
    baseline. `others` are the other models trained alone
    (`distillation.baselines`: `name`, `accuracy`, `params`): the verdict
    then also names the best model trained alone and says whether the
    distilled student (`student_params`) beat it (`beat_best_alone`;
    `best_alone` names it: a node, `scratch_name` for the scratch baseline).
    This is one run: the seed spread, and whether a difference is larger than
    it, is what `benchmarks/distillation.py` measures.
    """
    result = _against_scratch(teacher, student, alone)
    if not others:
        return result
    candidates = list(others)
    if alone is not None:
        candidates.append({"name": scratch_name, "accuracy": alone, "params": student_params})
    best = max(candidates, key=lambda c: c["accuracy"])
    # The scratch baseline is the student's own network: the message says so.
    label = best["name"] if best in others else "the student's network alone"
    gain = student - best["accuracy"]
    size = f" ({best['params']:,} parameters)" if best.get("params") else ""
    mine = f" ({student_params:,} parameters)" if student_params else ""
    result.update(
        best_alone=best["name"],
        best_alone_acc=best["accuracy"],
        gain_over_best_alone=gain,
        beat_best_alone=gain > 0,
    )
    if gain > 0:
        tail = (
            f" The best model trained alone here, {label}{size}, scored "
            f"{best['accuracy']:.4f}: {gain:+.4f} behind the distilled student{mine}."
        )
    else:
        tail = (
            f" Distillation did NOT beat the best model trained alone here: {label}{size} "
            f"scored {best['accuracy']:.4f}, the distilled student{mine} {student:.4f} ({gain:+.4f})."
        )
    result["message"] += tail
    return result


def _against_scratch(teacher: float, student: float, alone: float | None) -> dict[str, Any]:
    """`verdict` against the student's own network trained alone."""
    result: dict[str, Any] = {"teacher_acc": teacher, "student_acc": student}
    if alone is None:
        result["improved"] = None
        result["message"] = (
            f"Distilled student {student:.4f}, teacher {teacher:.4f}. This run has no "
            "scratch baseline (distillation.scratch_baseline: false), so it cannot say "
            "whether distillation beat training the student alone."
        )
        return result
    gain, lead = student - alone, teacher - alone
    result.update(scratch_acc=alone, gain_over_scratch=gain, improved=gain > 0)
    result["gap_recovered"] = gain / lead if lead > 0 else None
    if lead <= 0:
        # No lead to recover, but soft targets can still regularise the student
        # (benchmarks/results/distillation_kd_all_labels.json): by a margin one
        # run cannot tell from noise, so the numbers are given, not a verdict.
        result["message"] = (
            f"The teacher ({teacher:.4f}) is no better than the student trained alone "
            f"({alone:.4f}), so it has no lead to recover. Its soft targets can still act "
            "as a regulariser, by a margin one run cannot tell from noise: here the "
            f"distilled student scored {student:.4f} against {alone:.4f} alone "
            f"({gain:+.4f}). benchmarks/distillation.py --scenario kd measures the seed "
            "spread."
        )
    elif gain <= 0:
        result["message"] = (
            f"The distilled student did NOT improve on the same student trained alone: "
            f"{student:.4f} vs {alone:.4f} ({gain:+.4f}); the teacher scored {teacher:.4f}."
        )
    else:
        result["message"] = (
            f"The distilled student beat the same student trained alone by {gain:+.4f} "
            f"({student:.4f} vs {alone:.4f}), {gain / lead:.0%} of the teacher's lead "
            f"({teacher:.4f}). One run; benchmarks/distillation.py measures the seed spread."
        )
    return result


# A model trained alone is "at the same serving cost" as an M-on-M ensemble
# when it has at most this much more than the ensemble's parameters.
SAME_COST_TOLERANCE = 0.05


def m_on_m_verdict(
    teachers: float,
    ensemble: float,
    members: list[float],
    one_student: float | None,
    alone: Sequence[Mapping[str, Any]] = (),
    ensemble_params: int | None = None,
    teacher_accs: Sequence[float] = (),
) -> dict[str, Any]:
    """M-on-M: the students' ensemble against its mean student, one student of all the
    teachers (`EnsembleStudent`, when the run has it), the teachers' ensemble and the
    best model trained alone at the same serving cost.

    `teacher_accs` are the teachers' own accuracies, teacher i the one student
    i learned from; the message says which teacher did not beat its student
    (`teachers_beat_students`): such a teacher has nothing better to teach.

    `alone` are the run's models trained alone (`distillation.baselines` and
    the scratch baseline: `name`, `accuracy`, `params`); the ones with at most
    `ensemble_params` parameters (within `SAME_COST_TOLERANCE`) are what a user
    would serve instead at the ensemble's cost, and the best of them is the
    yardstick (`same_cost_alone`). `improved` is True when the ensemble beat its
    mean student, the one student and that yardstick (when the run has one;
    the message says when it has none). One run, as for `verdict`.
    """
    mean = sum(members) / len(members)
    result: dict[str, Any] = {
        "teacher_ensemble_acc": teachers,
        "student_acc": ensemble,
        "member_accs": list(members),
        "mean_member_acc": mean,
        "one_student_acc": one_student,
        "gain_over_mean_member": ensemble - mean,
        "ensemble_params": ensemble_params,
    }
    parts = [
        f"The ensemble of {len(members)} students scored {ensemble:.4f}: {ensemble - mean:+.4f} over "
        f"its mean student ({mean:.4f})"
    ]
    if one_student is not None:
        result["gain_over_one_student"] = ensemble - one_student
        parts.append(
            f"{ensemble - one_student:+.4f} over one student of all the teachers ({one_student:.4f})"
        )
    same_cost, sentence = _against_same_cost(ensemble, ensemble_params, alone)
    result.update(same_cost)
    if teacher_accs and len(teacher_accs) == len(members):
        behind = [
            f"teacher {i} ({t:.4f}) did not beat its student ({m:.4f})"
            for i, (t, m) in enumerate(zip(teacher_accs, members, strict=True))
            if t <= m
        ]
        result["teacher_accs"] = list(teacher_accs)
        result["teachers_beat_students"] = not behind
        if behind:
            sentence += (
                " " + "; ".join(behind).capitalize() + ": a teacher no better than its student "
                "has little to teach; train the teachers longer or larger (train.train_steps, "
                "teacher)."
            )
    result["improved"] = (
        ensemble > mean
        and (one_student is None or ensemble > one_student)
        and same_cost["beat_same_cost_alone"] is not False
    )
    result["message"] = (
        ", ".join(parts) + f"; the teachers' ensemble scored {teachers:.4f}. {sentence} One run; "
        "benchmarks/distillation.py measures the seed spread."
    )
    return result


def _against_same_cost(
    ensemble: float, ensemble_params: int | None, alone: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], str]:
    """The M-on-M ensemble against the best model trained alone at its serving cost.

    Returns:
      The verdict's `same_cost_*` fields (`beat_same_cost_alone` None without
      such a model) and the message's sentence on it.
    """
    limit = ensemble_params * (1 + SAME_COST_TOLERANCE) if ensemble_params else None
    fits = [a for a in alone if limit and a.get("params") and a["params"] <= limit]
    if not fits:
        why = (
            f"no model trained alone here has at most the ensemble's {ensemble_params:,} "
            f"parameters (within {SAME_COST_TOLERANCE:.0%}); add one to distillation.baselines"
            if ensemble_params
            else "the ensemble's parameter count is unknown"
        )
        none = {"same_cost_alone": None, "beat_same_cost_alone": None}
        return none, f"This verdict has no same-cost yardstick: {why}."
    best = max(fits, key=lambda a: a["accuracy"])
    gain = ensemble - best["accuracy"]
    fields = {
        "same_cost_alone": best["name"],
        "same_cost_alone_acc": best["accuracy"],
        "same_cost_alone_params": best["params"],
        "gain_over_same_cost_alone": gain,
        "beat_same_cost_alone": gain > 0,
    }
    outcome = "beat" if gain > 0 else "did NOT beat"
    return fields, (
        f"At the same serving cost (at most its parameters, within {SAME_COST_TOLERANCE:.0%}) "
        f"the ensemble {outcome} the best model trained alone here: "
        f"{best['name']} ({best['params']:,} parameters) scored {best['accuracy']:.4f}, the "
        f"ensemble ({ensemble_params:,} parameters) {ensemble:.4f} ({gain:+.4f})."
    )


def noisy_student_verdict(
    teacher: float, rounds: list[float], alone: float | None
) -> dict[str, Any]:
    """Noisy Student: the last round against the same network trained `alone` on the labels
    (the scratch baseline, when the run has one) and the first `teacher`.

    `improved` is True when the last round beat the network alone (None
    without it). One run, as for `verdict`.
    """
    last = rounds[-1]
    result: dict[str, Any] = {
        "teacher_acc": teacher,
        "round_accs": list(rounds),
        "student_acc": last,
        "scratch_acc": alone,
        "gain_over_teacher": last - teacher,
        "improved": None if alone is None else last > alone,
    }
    steps = " -> ".join(f"{a:.4f}" for a in [teacher, *rounds])
    if alone is None:
        against = (
            "this run has no scratch baseline (distillation.scratch_baseline: false), so it cannot "
            "say whether the unlabeled data beat training the network on the labels alone"
        )
    else:
        result["gain_over_scratch"] = last - alone
        against = (
            f"{last - alone:+.4f} over the same network trained alone on the labels ({alone:.4f})"
            if last > alone
            else f"and it did NOT beat the same network trained alone on the labels: "
            f"{last - alone:+.4f} ({alone:.4f})"
        )
    result["message"] = (
        f"Noisy Student, teacher then rounds: {steps}; the last round {last - teacher:+.4f} over its "
        f"first teacher, {against}. One run; benchmarks/distillation.py measures the seed spread."
    )
    return result
