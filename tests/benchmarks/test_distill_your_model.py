"""`benchmarks/distill_your_model.py`: its splits, its choice on validation, its paired
summary and the pipeline it builds (no training)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

from benchmarks import distill_your_model as bench
from benchmarks import revision as revision_lib
from components.config import payload
from testkit import results as results_lib


def _model(accuracy, params=56_000, model_ms=1.0, serving_ms=3.0):
    return {
        "accuracy": accuracy,
        "params": params,
        "model_ms_b256": model_ms,
        "serving_ms_b256": serving_ms,
    }


CHOICE = {"alone_augment": True, "alpha": 0.9, "temperature": 4.0}


def _trial_models(alone, distilled, control, teachers=(0.93, 0.91)):
    models = {
        bench.teacher_id(t): _model(acc, params=584_000, model_ms=10.0, serving_ms=12.0)
        for t, acc in zip(bench.TEACHER_SEEDS, teachers, strict=True)
    }
    for seed, (a, d, c) in enumerate(zip(alone, distilled, control, strict=True)):
        models[bench.alone_id(seed, True)] = _model(a)
        models[bench.distilled_id(seed, 0.9, 4.0)] = _model(d)
        models[bench.distilled_id(seed, 0.0, 4.0)] = _model(c)
    return models


def test_the_summary_pairs_each_seed_and_gives_a_t_interval_on_n_minus_1():
    alone = [0.90, 0.89, 0.91, 0.90, 0.90]
    distilled = [0.91, 0.91, 0.91, 0.91, 0.91]  # differences 0.01 0.02 0 0.01 0.01
    control = [0.90, 0.90, 0.90, 0.90, 0.90]  # differences 0.01 each: no spread
    out = bench.summarize("scarce", 0.1, range(5), CHOICE, _trial_models(alone, distilled, control))
    # By hand: mean 0.01, sd sqrt(0.0002 / 4) = 0.0070711, se 0.0031623,
    # t(0.975, 4) = 2.776445, half width 0.0087798.
    assert out["distilled_minus_alone"] == pytest.approx(0.01)
    assert out["distilled_minus_alone_ci95"] == pytest.approx([0.0012, 0.0188])
    assert out["distilled_minus_control"] == pytest.approx(0.01)
    assert out["distilled_minus_control_ci95"] == pytest.approx([0.01, 0.01])
    assert out["teacher_acc"] == pytest.approx(0.92)
    assert out["alone_acc"] == pytest.approx(0.90)
    # The teachers' mean lead is 0.02; distillation recovers 0.01 of it.
    assert out["gap_recovered"] == pytest.approx(0.5)
    assert [r["teacher"] for r in out["rows"]] == [100, 101, 100, 101, 100]
    # Teacher 100 taught seeds 0, 2, 4 (0.01, 0, 0.01); teacher 101 seeds 1, 3 (0.02, 0.01).
    assert out["per_teacher"]["100"]["seeds"] == [0, 2, 4]
    assert out["per_teacher"]["100"]["distilled_minus_alone"] == pytest.approx(0.0067)
    assert out["per_teacher"]["101"]["distilled_minus_alone"] == pytest.approx(0.015)
    assert out["per_teacher"]["101"]["teacher_acc"] == pytest.approx(0.91)
    assert out["param_ratio"] == pytest.approx(56_000 / 584_000, abs=1e-4)
    assert out["model_latency_ratio_b256"] == pytest.approx(0.1)
    assert out["serving_latency_ratio_b256"] == pytest.approx(0.25)


def test_each_setting_writes_its_own_results_file_naming_it(tmp_path):
    scarce = bench.summarize(
        "scarce", 0.1, range(5), CHOICE, _trial_models([0.88] * 5, [0.89] * 5, [0.87] * 5)
    )
    every = bench.summarize(
        "all", 1.0, range(5), CHOICE, _trial_models([0.92] * 5, [0.925] * 5, [0.92] * 5)
    )
    args = argparse.Namespace(shared_with="a test", argv=["--settings", "scarce,all"])
    paths = bench.write_results([scarce, every], args, results_dir=str(tmp_path))
    assert paths == [
        results_lib.results_path("distill_your_model_scarce", str(tmp_path)),
        results_lib.results_path("distill_your_model_all", str(tmp_path)),
    ]
    for path, setting, fraction in zip(paths, ("scarce", "all"), (0.1, 1.0), strict=True):
        with open(path) as f:
            record = json.load(f)
        assert record["benchmark"] == "distill_your_model"
        assert [line["setting"] for line in record["lines"][:-1]] == [setting]
        (headline,) = record["headline"]["settings"]
        assert (headline["setting"], headline["labeled_fraction"]) == (setting, fraction)


def test_one_seed_gives_no_interval_and_no_lead_gives_no_gap_recovered():
    out = bench.summarize(
        "all", 1.0, [0], CHOICE, _trial_models([0.95], [0.96], [0.95], teachers=(0.94, 0.94))
    )
    assert out["distilled_minus_alone_ci95"] is None
    assert out["distilled_minus_control_ci95"] is None
    assert out["gap_recovered"] is None


def test_fewer_than_5_seeds_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "4", "--workdir", str(tmp_path)])
    assert "--seeds: at least 5" in capsys.readouterr().err
    # A smoke run (--limit) may use 2, not 1.
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1", "--limit", "100", "--workdir", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_the_choice_takes_the_better_student_alone_and_the_best_alpha_and_t():
    validation = {
        bench.teacher_id(bench.CHOICE_SEED): 0.90,
        bench.alone_id(bench.CHOICE_SEED, False): 0.871,
        bench.alone_id(bench.CHOICE_SEED, True): 0.889,
        bench.distilled_id(bench.CHOICE_SEED, 0.5, 1.0): 0.893,
        bench.distilled_id(bench.CHOICE_SEED, 0.5, 2.0): 0.897,
        bench.distilled_id(bench.CHOICE_SEED, 0.9, 4.0): 0.895,
    }
    choice = bench.choose(validation)
    assert choice["alone_augment"] is True
    assert (choice["alpha"], choice["temperature"]) == (0.5, 2.0)
    validation[bench.alone_id(bench.CHOICE_SEED, False)] = 0.9
    assert bench.choose(validation)["alone_augment"] is False


def test_the_trials_train_two_teachers_and_per_seed_the_chosen_alone_distilled_and_control():
    nodes = bench.trial_nodes(range(5), CHOICE)
    teachers = [n for n, s in nodes.items() if s["kind"] == "teacher"]
    assert teachers == ["Teacher_100", "Teacher_101"]
    assert len(nodes) == 2 + 5 * 3
    assert not any(s["kind"] == "alone" and not s["augment"] for s in nodes.values())
    control = nodes[bench.distilled_id(3, 0.0, 4.0)]
    assert (control["alpha"], control["teacher"], control["seed"]) == (0.0, 101, 3)
    distilled = nodes[bench.distilled_id(3, 0.9, 4.0)]
    assert (distilled["alpha"], distilled["temperature"], distilled["teacher"]) == (0.9, 4.0, 101)
    # No trial shares a seed with the choice stage.
    assert bench.CHOICE_SEED not in {s["seed"] for s in nodes.values()}
    assert bench.CHOICE_SEED not in bench.TEACHER_SEEDS


def test_validation_is_carved_from_training_and_only_train_labels_are_masked():
    train, valid = bench.split_indices(60_000)
    assert (len(train), len(valid)) == (55_000, 5_000)
    assert not set(train) & set(valid)
    assert sorted({*train, *valid}) == list(range(60_000))
    again = bench.split_indices(60_000)
    assert (again[0] == train).all() and (again[1] == valid).all()
    labels = np.arange(1000) % 10
    masked = bench.masked_labels(labels, 0.1)
    assert (masked >= 0).sum() == 100
    kept = masked >= 0
    assert (masked[kept] == labels[kept]).all()
    assert (bench.masked_labels(labels, 1.0) == labels).all()


def test_the_code_key_reads_the_product_less_its_test_helpers_the_modules_and_the_lock():
    trees = bench.CODE.trees()
    assert "requirements.lock" in trees and "components/training" in trees
    assert "benchmarks/your_model/student.py" in trees
    assert not any(name.startswith("testkit") for name in trees)
    assert all(len(tree) == 40 for tree in trees.values())


def _commit_choice(directory, name="distill_your_model", **keys):
    line = {
        "setting": "scarce",
        "revision": "r1",
        "recipe": "scarce-x",
        "scoring": bench.scoring_key(),
        "choice": CHOICE,
        **keys,
    }
    results_lib.write(
        name, [line], shared_with=None, results_dir=str(directory), stem=bench.choice_stem("scarce")
    )


def test_a_committed_choice_serves_only_the_code_recipe_and_scoring_that_made_it(tmp_path):
    _commit_choice(tmp_path)
    saved = bench.committed_choice("scarce", "r1", "scarce-x", str(tmp_path))
    assert {k: saved[k] for k in CHOICE} == CHOICE
    suffix = results_lib.stack_suffix(results_lib.installed_stack())
    assert saved["from"]["file"].endswith(f"distill_your_model_choice_scarce{suffix}.json")
    assert {"commit", "date"} <= set(saved["from"])
    assert bench.committed_choice("scarce", "r2", "scarce-x", str(tmp_path)) is None
    assert bench.committed_choice("scarce", "r1", "scarce-y", str(tmp_path)) is None
    assert bench.committed_choice("all", "r1", "scarce-x", str(tmp_path)) is None
    _commit_choice(tmp_path / "scored", scoring="0" * 12)
    assert bench.committed_choice("scarce", "r1", "scarce-x", str(tmp_path / "scored")) is None
    _commit_choice(tmp_path / "other", name="distillation")
    assert bench.committed_choice("scarce", "r1", "scarce-x", str(tmp_path / "other")) is None


def _workdir(tmp_path, name, revision, recipe, choice=None):
    """A setting's work directory with its data written (empty files: nothing reads
    them here) and, optionally, its choice."""
    root = tmp_path / name / revision / recipe
    (root / "data" / "test").mkdir(parents=True)
    (root / "data" / "test" / "data.tfrecord").write_bytes(b"")
    if choice is not None:
        (root / "choice.json").write_text(json.dumps(choice))
    return root


def _choice_only_args(workdir, **change):
    """A `--choice-only` run's arguments at the default steps, writing its work under
    `workdir`."""
    args = dict(
        limit=0,
        teacher_steps=6000,
        student_steps=12000,
        eval_steps=20,
        seeds=5,
        workdir=str(workdir),
        no_results=False,
        choice_only=True,
        shared_with="",
        argv=["--choice-only"],
    )
    return argparse.Namespace(**{**args, **change})


def test_a_later_run_elsewhere_starts_at_the_trials_from_the_committed_choice(
    tmp_path, monkeypatch
):
    def the_choice_stage(*args, **kwargs):
        raise AssertionError("the choice stage ran")

    monkeypatch.setattr(bench, "run_stage", the_choice_stage)
    args = _choice_only_args(tmp_path / "first")
    recipe = bench.recipe_key(args, "scarce")
    results = str(tmp_path / "results")
    checked = []
    # A run that stopped after its choice, resumed: the choice is committed, after
    # the code check.
    _workdir(tmp_path, "first", "r1", recipe, {**CHOICE, "seconds": {"pipeline_wall": 1.0}})
    out = bench.run_setting(args, "scarce", "r1", lambda: checked.append("first"), results)
    assert out == {"setting": "scarce", "choice": {**CHOICE, "seconds": {"pipeline_wall": 1.0}}}
    assert checked == ["first"]
    with open(results_lib.results_path(bench.choice_stem("scarce"), results)) as f:
        record = json.load(f)
    assert record["headline"]["revision"] == "r1" and record["headline"]["recipe"] == recipe
    # Another machine, an empty work directory, the same code: no choice stage, and
    # the choice lands in the work directory for the trials.
    second = argparse.Namespace(**{**vars(args), "workdir": str(tmp_path / "second")})
    root = _workdir(tmp_path, "second", "r1", recipe)
    out = bench.run_setting(second, "scarce", "r1", lambda: checked.append("second"), results)
    assert out["choice"]["alpha"] == 0.9 and out["choice"]["from"]["commit"] == record["commit"]
    assert json.loads((root / "choice.json").read_text())["temperature"] == 4.0
    assert checked == ["first"]  # nothing committed again
    # Other code: the choice stage runs again.
    _workdir(tmp_path, "second", "r2", recipe)
    with pytest.raises(AssertionError, match="the choice stage ran"):
        bench.run_setting(second, "scarce", "r2", lambda: None, results)


def test_no_choice_is_written_from_changed_or_uncommitted_code_a_smoke_run_or_without_results(
    tmp_path,
):
    base = _choice_only_args(tmp_path / "work")
    results = tmp_path / "results"

    def changed():
        raise revision_lib.CodeChanged("the code changed")

    cases = (
        ("r1", {}, changed),
        ("r2-dirty-0123abcd", {}, lambda: None),
        ("r3", {"no_results": True}, lambda: None),
        ("r4", {"limit": 100}, lambda: None),
    )
    for revision, change, unchanged in cases:
        args = argparse.Namespace(**{**vars(base), **change})
        _workdir(tmp_path, "work", revision, bench.recipe_key(args, "scarce"), CHOICE)
        if unchanged is changed:
            with pytest.raises(revision_lib.CodeChanged):
                bench.run_setting(args, "scarce", revision, unchanged, str(results))
        else:
            assert bench.run_setting(args, "scarce", revision, unchanged, str(results))["choice"]
        assert not results.exists(), revision


def test_another_recipe_gets_a_directory_of_its_own():
    args = argparse.Namespace(limit=0, teacher_steps=6000, student_steps=12000, eval_steps=20)
    key = bench.recipe_key(args, "scarce")
    assert (
        key.startswith("scarce-")
        and bench.recipe_key(argparse.Namespace(**vars(args)), "scarce") == key
    )
    assert bench.recipe_key(args, "all") != key
    for change in ({"limit": 2000}, {"teacher_steps": 50}, {"eval_steps": 2}):
        assert bench.recipe_key(argparse.Namespace(**{**vars(args), **change}), "scarce") != key


def test_the_pipeline_trains_on_train_evaluates_on_validation_and_has_no_test_split(tmp_path):
    nodes = bench.trial_nodes(range(2), CHOICE)
    pipeline = bench.create_pipeline(str(tmp_path), str(tmp_path / "data"), nodes, 10, 20, 2)
    by_id = {c.id: c for c in pipeline.components}
    example_gen = json.loads(by_id["ImportExampleGen"].exec_properties["input_config"])
    assert [split["name"] for split in example_gen["splits"]] == ["train", "eval"]
    assert set(nodes) <= set(by_id)
    for node, spec in nodes.items():
        properties = by_id[node].exec_properties
        # The protos travel as JSON.
        train_args, eval_args = (json.loads(properties[k]) for k in ("train_args", "eval_args"))
        assert train_args["splits"] == ["train"] and eval_args["splits"] == ["eval"]
        assert int(train_args["num_steps"]) == (10 if spec["kind"] == "teacher" else 20)
    for alpha in (0.9, 0.0):
        config = payload.decode_exec_properties(
            by_id[bench.distilled_id(1, alpha, 4.0)].exec_properties
        ).config
        assert (config.distillation.alpha, config.distillation.temperature) == (alpha, 4.0)
    assert pipeline.enable_cache


def _store(path):
    import ml_metadata as mlmd
    from ml_metadata.proto import metadata_store_pb2 as pb

    config = pb.ConnectionConfig()
    config.sqlite.filename_uri = str(path / "metadata.db")
    config.sqlite.connection_mode = pb.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return mlmd.MetadataStore(config), pb


def test_each_model_is_what_its_node_output_last_and_its_seconds_those_that_trained_it(tmp_path):
    """On a real ML Metadata store: a cache hit's model is the older run's (not a failed
    run's newer directory), a retrain's the newer."""
    store, pb = _store(tmp_path)
    model_type = store.put_artifact_type(pb.ArtifactType(name="Model"))
    run_type = store.put_artifact_type(pb.ArtifactType(name="ModelRun"))
    execution_type = store.put_execution_type(pb.ExecutionType(name="Trainer"))
    context_type = store.put_context_type(pb.ContextType(name="node"))
    run_type_id = store.put_context_type(pb.ContextType(name="pipeline_run"))

    def execute(node, state, run, artifact=None, uri=""):
        output = pb.Event(type=pb.Event.OUTPUT)
        if artifact is None:
            pairs = [
                (pb.Artifact(type_id=model_type, uri=uri), output),
                (pb.Artifact(type_id=run_type, uri=uri + "_run"), output),
            ]
        else:
            pairs = [(store.get_artifacts_by_id([artifact])[0], output)]
        execution_id, artifacts, _ = store.put_execution(
            pb.Execution(type_id=execution_type, last_known_state=state),
            pairs,
            [
                pb.Context(type_id=context_type, name=f"distill_your_model.{node}"),
                pb.Context(type_id=run_type_id, name=f"run{run}"),
            ],
            reuse_context_if_already_exist=True,
        )
        if state == pb.Execution.COMPLETE:
            # Training takes time; a cache hit does not.
            time.sleep(0.3)
            [trained] = store.get_executions_by_id([execution_id])
            trained.custom_properties["done"].int_value = 1
            store.put_executions([trained])
        return artifacts[0]

    # Run 1 failed after writing its model directory 7; run 2 trained both teachers;
    # run 3 (the newest) hit the cache for Teacher_100 and retrained Teacher_101.
    execute("Teacher_100", pb.Execution.FAILED, 1, uri="/m/Teacher_100/model/7")
    time.sleep(0.01)
    first = execute("Teacher_100", pb.Execution.COMPLETE, 2, uri="/m/Teacher_100/model/5")
    execute("Teacher_101", pb.Execution.COMPLETE, 2, uri="/m/Teacher_101/model/6")
    execute("Teacher_100", pb.Execution.CACHED, 3, artifact=first)
    execute("Teacher_101", pb.Execution.COMPLETE, 3, uri="/m/Teacher_101/model/9")
    found = bench.trained_models(str(tmp_path), ["Teacher_100", "Teacher_101"])
    assert found["Teacher_100"]["serving_dir"] == "/m/Teacher_100/model/5/Format-Serving"
    assert found["Teacher_100"]["cached"] is True
    assert found["Teacher_101"]["serving_dir"] == "/m/Teacher_101/model/9/Format-Serving"
    assert found["Teacher_101"]["cached"] is False
    # The cached node's seconds are those of the execution that trained its model.
    assert found["Teacher_100"]["seconds"] >= 0.3 and found["Teacher_101"]["seconds"] >= 0.3
    with pytest.raises(RuntimeError, match=r"no model in ML Metadata for \['Teacher_102'\]"):
        bench.trained_models(str(tmp_path), ["Teacher_100", "Teacher_102"])
