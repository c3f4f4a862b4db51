"""The `tfxkit` console script's commands that need no pipeline run."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml

from pipelines import cli, rundir
from pipelines.configs import SCHEMA_FILE

REPO = SCHEMA_FILE.parents[2]


def test_schema_prints_the_json_schema_of_a_config(capsys):
    assert cli.main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["title"] == "PipelineConfig"
    assert schema["additionalProperties"] is False


def test_shipped_schema_is_what_the_command_prints(capsys):
    # Regenerate with: tfxkit schema > pipelines/configs/tfxkit.schema.json
    assert cli.main(["schema"]) == 0
    assert capsys.readouterr().out == SCHEMA_FILE.read_text()


def test_shipped_configs_point_editors_at_the_schema():
    for path in SCHEMA_FILE.parent.glob("*.yaml"):
        assert (
            path.read_text().splitlines()[0]
            == f"# yaml-language-server: $schema=./{SCHEMA_FILE.name}"
        ), path


@pytest.mark.multiprocess
def test_help_does_not_import_tensorflow():
    # `tfxkit --help` must stay fast: the heavy imports happen after parsing.
    code = "import sys; from pipelines import cli; sys.argv = ['tfxkit', '--help']\n"
    code += "try:\n    cli.main()\nexcept SystemExit:\n    pass\nassert 'tensorflow' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)


# A fresh interpreter that imports no TensorFlow starts in seconds; the bound
# only stops a hung process.
CLI_TIMEOUT_SECONDS = 120


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `tfxkit ARGS` in a fresh interpreter and reports whether it imported TensorFlow.

    `env`: variables set for it over this process's environment.
    """
    code = (
        "import sys\nfrom pipelines import cli\n"
        "try:\n    code = cli.main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('imported tensorflow' if 'tensorflow' in sys.modules else 'no tensorflow', file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.mark.multiprocess
def test_argument_errors_do_not_import_tensorflow():
    result = _cli("run", "--runner", "spark")
    assert result.returncode == 2
    assert "argument --runner: invalid choice: 'spark'" in result.stderr
    assert result.stderr.rstrip().endswith("no tensorflow")


@pytest.mark.multiprocess
def test_output_that_is_a_file_fails_clearly_without_a_traceback(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text('{"status": "succeeded"}\n')
    result = _cli("run", "--config", "taxi", "--output", str(target))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        f"tfxkit: --output: '{target}' is a file, not a directory; "
        "pass --output a directory you can write to (it is created if missing)"
    )
    assert "Traceback" not in result.stderr
    assert result.stderr.rstrip().endswith("no tensorflow")
    assert target.read_text() == '{"status": "succeeded"}\n'  # nothing lost


@pytest.mark.multiprocess
def test_output_under_a_file_fails_clearly_without_a_traceback(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("keep me")
    result = _cli("run", "--config", "taxi", "--output", str(blocker / "taxi"))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"tfxkit: --output: cannot create '{blocker}/taxi': '{blocker}' is a file, not a directory"
    )
    assert "Traceback" not in result.stderr
    assert blocker.read_text() == "keep me"


@pytest.mark.multiprocess
def test_version_prints_the_installed_package_version():
    from importlib import metadata

    result = _cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"tfxkit {metadata.version('tfxkit')}"


def test_every_run_option_has_help_text(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--runner {beam,local} TFX orchestrator: beam (BeamDagRunner, the default) or local" in text
    )
    assert "--output OUTPUT output directory" in text


def _config_file(tmp_path, data_uri=None, **data) -> str:
    config = yaml.safe_load((REPO / "pipelines" / "configs" / "taxi.yaml").read_text())
    config["data"].pop("builtin")
    config["data"].update(data)
    if data_uri is not None:
        config["kubeflow"]["data_uri"] = data_uri
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _previous_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text(
        '{"status": "succeeded", "pushed_model": "/old/serving/taxi/1"}\n'
    )
    return out


@pytest.mark.multiprocess
def test_missing_relative_data_path_is_refused_at_once_naming_the_absolute_path(tmp_path):
    out = _previous_run(tmp_path)
    result = _cli(
        "run", "--config", _config_file(tmp_path, path="no/such.csv"), "--output", str(out)
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        f"tfxkit: bad input data: data.path: 'no/such.csv' (resolved against the current directory "
        f"{str(REPO)!r}: {str(REPO / 'no' / 'such.csv')!r}) does not exist; point it at a CSV file "
        "or a directory of them (an absolute path does not depend on where tfxkit runs)"
    )
    # Checked before TensorFlow is imported (about half a minute on a busy machine).
    assert result.stderr.rstrip().endswith("no tensorflow")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["pushed_model"] is None
    assert summary["stage"] == "input check (before any component ran)"
    assert "'no/such.csv' (resolved against the current directory" in summary["error"]


@pytest.mark.multiprocess
def test_a_beam_runner_that_cannot_start_is_refused_before_any_component(tmp_path):
    out = _previous_run(tmp_path)
    config = yaml.safe_load(open(_config_file(tmp_path, path=str(REPO / "no-data-needed.csv"))))
    config["beam_args"] = ["--runner=FlinkRunner"]
    path = tmp_path / "flink.yaml"
    path.write_text(yaml.safe_dump(config))
    result = _cli("run", "--config", str(path), "--output", str(out))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(
        "tfxkit: invalid config: beam_args[0]: --runner=FlinkRunner would download its job server"
    )
    assert result.stderr.rstrip().endswith("no tensorflow")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["pushed_model"] is None
    assert summary["stage"] == rundir.CONFIG_CHECK_STAGE and summary["components"] == {}


@pytest.mark.multiprocess
def test_prism_without_its_binary_is_refused_before_any_component(tmp_path):
    from pipelines import precheck
    from tests.pipelines.test_precheck import CLOSED_PROXY

    out = _previous_run(tmp_path)
    config = yaml.safe_load(open(_config_file(tmp_path, path=str(REPO / "no-data-needed.csv"))))
    config["beam_args"] = ["--runner=PrismRunner"]
    path = tmp_path / "prism.yaml"
    path.write_text(yaml.safe_dump(config))
    # Beam's download of Prism goes through a proxy that refuses it, as on a
    # machine without the internet.
    proxies = {k: CLOSED_PROXY for k in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")}
    url = precheck.prism_download_url()
    if os.path.isfile(os.path.join(precheck.PRISM_CACHE, os.path.basename(url))):
        pytest.skip("Beam's cache holds the Prism download: the runner starts without it")
    result = _cli(
        "run", "--config", str(path), "--output", str(out), env={**proxies, "no_proxy": ""}
    )
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        f"tfxkit: invalid config: beam_args[0]: --runner=PrismRunner without --prism_location "
        f"downloads Prism from {url} when the first Beam component starts"
    )
    assert f"build Prism with `{precheck.PRISM_BUILD}`" in first
    assert "Traceback" not in result.stderr
    assert result.stderr.rstrip().endswith("no tensorflow")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["pushed_model"] is None
    assert summary["stage"] == rundir.CONFIG_CHECK_STAGE and summary["components"] == {}
    assert "--runner=PrismRunner without --prism_location" in summary["error"]


@pytest.mark.multiprocess
def test_compile_with_local_data_is_refused_before_tensorflow_is_imported(tmp_path):
    data = tmp_path / "taxi.csv"
    data.write_text("fare,big_tipper\n1.0,0\n")
    config = _config_file(tmp_path, data_uri="", path=str(data))
    result = _cli("compile", "--config", config, "--output", str(tmp_path / "p.yaml"))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        f"tfxkit: cannot compile: kubeflow.data_uri: {str(data)!r} is a local path, which pods on "
        "the cluster cannot read; use a directory URI such as gs://<bucket>/data/<name>"
    )
    assert result.stderr.rstrip().endswith("no tensorflow")
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "config_text, error",
    [
        ("name: taxi\ndata: {builtin: taxi\n", r"is not valid YAML"),
        (None, r"distillation\.temperature: expected a number > 0"),
        (
            "name: taxi\ndata: {builtin: taxi}\ntrain: {train_steps: 5}\ntrain: {train_steps: 9}\n",
            r"train: given twice in .*bad\.yaml, at lines 3 and 4",
        ),
    ],
    ids=["yaml_error", "invalid_value", "duplicate_key"],
)
def test_config_refusal_replaces_the_previous_runs_summary(tmp_path, config_text, error):
    out = _previous_run(tmp_path)
    config = tmp_path / "bad.yaml"
    if config_text is None:
        data = yaml.safe_load((REPO / "pipelines" / "configs" / "taxi.yaml").read_text())
        data["distillation"] = {"temperature": 0}
        config_text = yaml.safe_dump(data)
    config.write_text(config_text)
    result = _cli("run", "--config", str(config), "--output", str(out))
    assert result.returncode == 2
    assert re.match(rf"tfxkit: invalid config: .*{error}", result.stderr)
    assert "Traceback" not in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["pushed_model"] is None
    assert summary["stage"] == "config check (before any component ran)"
    assert re.search(error, summary["error"])
    assert re.search(error, (out / "tfxkit.log").read_text())


def test_config_refusal_leaves_a_running_runs_summary_alone(tmp_path):
    out = _previous_run(tmp_path)
    # Another run holds the output directory: its record is its own.
    with open(out / ".tfxkit.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert rundir.record_refusal(str(out), rundir.CONFIG_CHECK_STAGE, "ConfigError: x") is None
    assert json.loads((out / "summary.json").read_text())["status"] == "succeeded"
    assert rundir.record_refusal(str(out), rundir.CONFIG_CHECK_STAGE, "ConfigError: x")
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
