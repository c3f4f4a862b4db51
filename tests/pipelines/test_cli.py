"""The `tfxkit` console script's commands that need no pipeline run."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from pipelines import cli
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


def _cli(*args: str) -> subprocess.CompletedProcess:
    """Runs `tfxkit ARGS` in a fresh interpreter and reports whether it imported TensorFlow."""
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
