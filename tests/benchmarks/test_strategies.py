"""`benchmarks/strategies.py`: its per-round ratios and intervals, its argument checks, the\norder of its runs and the cleanup of a failed one (no training)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types

import pytest

from benchmarks import strategies as bench


def _figures(examples_per_s, step_s):
    return {"replicas": 1, "is_chief": True, "examples_per_s": examples_per_s, "step_s": step_s}


# Per round, over one_device in the same round: mirrored 1.5, 1.6, 1.55 (examples/s),
# multi_worker 0.8, 0.9, 0.85 (examples/s), accumulation 1.3, 1.4, 1.35 (step time).
ROUNDS = [
    {
        "one_device": _figures(1000.0, 0.256),
        "mirrored": _figures(1500.0, 0.1707),
        "multi_worker": _figures(800.0, 0.32),
        "grad_accum_4x64": _figures(769.2, 0.3328),
    },
    {
        "one_device": _figures(1000.0, 0.256),
        "mirrored": _figures(1600.0, 0.16),
        "multi_worker": _figures(900.0, 0.2844),
        "grad_accum_4x64": _figures(714.3, 0.3584),
    },
    {
        "one_device": _figures(2000.0, 0.128),
        "mirrored": _figures(3100.0, 0.0826),
        "multi_worker": _figures(1700.0, 0.1506),
        "grad_accum_4x64": _figures(1481.5, 0.1728),
    },
]


def test_each_ratio_is_the_geometric_mean_of_the_rounds_with_a_t_interval():
    out = bench.summarize(ROUNDS)
    # By hand, on the logs, t(0.975, 2) = 4.3027.
    assert out["mirrored_speedup"] == pytest.approx(1.549)
    assert out["mirrored_speedup_ci95"] == pytest.approx([1.43, 1.679])
    assert out["multi_worker_speedup"] == pytest.approx(0.849)
    assert out["multi_worker_speedup_ci95"] == pytest.approx([0.733, 0.983])
    assert out["grad_accum_overhead"] == pytest.approx(1.349)
    assert out["grad_accum_overhead_ci95"] == pytest.approx([1.231, 1.479])
    assert out["rounds"] == 3
    assert out["examples_per_s"] == {
        "one_device": 1000.0,
        "mirrored": 1600.0,
        "multi_worker": 900.0,
        "grad_accum_4x64": 769.2,
    }


def test_a_ratio_whose_modes_did_not_run_is_left_out():
    # No GPU: no mixed-precision ratio, rather than one against the CPU.
    assert "mixed_float16_speedup" not in bench.summarize(ROUNDS)


def test_mixed_precision_is_measured_against_float32_on_the_gpu():
    # gpu_mixed_float16 / gpu_float32 examples/s: 2.0 and 2.5 (one_device is not the base).
    rounds = [
        {**r, "gpu_float32": _figures(f32, 0.1), "gpu_mixed_float16": _figures(f16, 0.05)}
        for r, f32, f16 in zip(ROUNDS[:2], (4000.0, 4000.0), (8000.0, 10000.0), strict=True)
    ]
    out = bench.summarize(rounds)
    # By hand: sqrt(5) = 2.236; logs 0.6931 and 0.9163, SE 0.1116, t(0.975, 1) = 12.706.
    assert out["mixed_float16_speedup"] == pytest.approx(2.236)
    assert out["mixed_float16_speedup_ci95"] == pytest.approx([0.542, 9.229])


def test_one_round_gives_its_ratios_and_no_interval():
    out = bench.summarize(ROUNDS[:1])
    assert out["mirrored_speedup"] == pytest.approx(1.5)
    assert out["mirrored_speedup_ci95"] is None


class _Reached(Exception):
    """The benchmark got past its argument checks (to the transform)."""


def _reached(*args, **kwargs):
    raise _Reached


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats", "1"], "--repeats: at least 2"),
        (["--steps", "203"], "--steps: a multiple of 5, at least 10"),
        (["--steps", "5"], "--steps: a multiple of 5, at least 10"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(bench, "materialize", _reached)
    monkeypatch.setattr(sys, "argv", ["strategies.py", *argv, "--no-results"])
    with pytest.raises(SystemExit):
        bench.main()
    assert message in capsys.readouterr().err


def test_the_smallest_steps_and_repeats_are_accepted(monkeypatch):
    monkeypatch.setattr(bench, "materialize", _reached)
    monkeypatch.setattr(
        sys, "argv", ["strategies.py", "--steps", "10", "--repeats", "2", "--no-results"]
    )
    with pytest.raises(_Reached):
        bench.main()


def test_a_workdir_holding_runs_is_refused_before_anything_runs(monkeypatch, capsys, tmp_path):
    (tmp_path / "round0").mkdir()
    monkeypatch.setattr(bench, "materialize", _reached)
    monkeypatch.setattr(sys, "argv", ["strategies.py", "--workdir", str(tmp_path), "--no-results"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "is not empty; runs never reuse a directory" in capsys.readouterr().err


def test_a_run_never_reuses_a_directory(tmp_path):
    # An earlier run's backup there would be resumed instead of trained.
    with pytest.raises(FileExistsError):
        bench.run_mode("one_device", None, {}, str(tmp_path))


def test_main_warms_up_then_alternates_the_rounds_each_run_in_a_new_directory(
    monkeypatch, tmp_path
):
    calls, written = [], {}
    figures = {"a": _figures(1000.0, 0.256), "b": _figures(1500.0, 0.1707)}

    def tf_configs():
        calls.append("tf_configs")
        return (None,)

    def run_mode(name, config, materialized, rundir, configs):
        calls.append((name, os.path.relpath(rundir, tmp_path)))
        return figures[name]

    monkeypatch.setattr(bench, "materialize", lambda root: {"rows": 3})
    monkeypatch.setattr(
        bench, "modes", lambda steps, gpus: {"a": (None, tf_configs), "b": (None, tf_configs)}
    )
    monkeypatch.setattr(bench, "run_mode", run_mode)

    def write(name, lines, **kwargs):
        written.update(name=name, lines=lines)
        return str(tmp_path / "strategies.json")

    monkeypatch.setattr(bench.results_lib, "write", write)
    monkeypatch.setattr(
        sys, "argv", ["strategies.py", "--repeats", "2", "--workdir", str(tmp_path)]
    )
    bench.main()
    runs = [c for c in calls if c != "tf_configs"]
    assert runs == [
        ("a", "warmup/a"),
        ("b", "warmup/b"),
        ("a", "round0/a"),
        ("b", "round0/b"),
        ("b", "round1/b"),
        ("a", "round1/a"),
    ]
    # Fresh TF_CONFIGs (ports) for every run.
    assert calls.count("tf_configs") == len(runs)
    assert written["name"] == "strategies"
    measured = [line for line in written["lines"] if "round" in line]
    assert [(line["round"], line["position"], line["mode"]) for line in measured] == [
        (0, 0, "a"),
        (0, 1, "b"),
        (1, 0, "b"),
        (1, 1, "a"),
    ]
    assert written["lines"][-1]["rounds"] == 2


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failed_worker_fails_the_run_at_once_naming_it(tmp_path, failing):
    # One worker fails at once; the other would wait on its peer for a minute.
    codes = ["import time; time.sleep(60)"] * 2
    codes[failing] = "import sys; sys.exit(3)"
    processes = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    try:
        with pytest.raises(
            RuntimeError, match=rf"process {failing} exited with 3; see .*process{failing}\.log"
        ):
            bench._wait_all("multi_worker", processes, str(tmp_path), timeout_s=30)
        # run_mode's cleanup, not _wait_all, kills the peer.
        assert processes[1 - failing].poll() is None
    finally:
        for p in processes:
            p.kill()
            p.wait()


def _open_logs(directory) -> list[str]:
    fds = "/proc/self/fd"
    targets = [os.path.realpath(os.path.join(fds, fd)) for fd in os.listdir(fds)]
    return [t for t in targets if t.startswith(str(directory)) and t.endswith(".log")]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to list open files")
def test_run_mode_kills_the_peers_and_closes_the_logs_when_a_worker_fails(monkeypatch, tmp_path):
    started, real_popen = [], subprocess.Popen

    def popen(args, **kwargs):
        # Worker 0 fails at once; worker 1 would wait for it for a minute.
        code = "import sys; sys.exit(3)" if not started else "import time; time.sleep(60)"
        started.append(real_popen([sys.executable, "-c", code], **kwargs))
        return started[-1]

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    config = types.SimpleNamespace(
        to_json=lambda: "{}", train=types.SimpleNamespace(train_steps=10, eval_steps=1)
    )
    materialized = {"train_files": [], "eval_files": [], "transform_output": ""}
    rundir = tmp_path / "multi_worker"
    try:
        with pytest.raises(RuntimeError, match="multi_worker: process 0 exited with 3") as raised:
            bench.run_mode("multi_worker", config, materialized, str(rundir), (None, None))
        assert len(started) == 2
        assert started[1].poll() == -signal.SIGKILL  # killed, not left waiting (or waited on)
        # Closed by run_mode, not by the garbage collector: the traceback `raised` holds
        # keeps run_mode's frame, and so any log it left open, alive.
        assert _open_logs(rundir) == [] and raised.traceback
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_run_past_its_deadline_fails_naming_the_mode(tmp_path):
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="mirrored: not finished after 0.5 s"):
            bench._wait_all("mirrored", [waiting], str(tmp_path), timeout_s=0.5)
    finally:
        waiting.kill()
        waiting.wait()
