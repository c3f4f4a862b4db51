"""The `tfxkit` console script's commands that need no pipeline run."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema

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


def test_help_does_not_import_tensorflow():
    # `tfxkit --help` must stay fast: the heavy imports happen after parsing.
    code = "import sys; from pipelines import cli; sys.argv = ['tfxkit', '--help']\n"
    code += "try:\n    cli.main()\nexcept SystemExit:\n    pass\nassert 'tensorflow' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
