"""`tfxkit submit` through `kfp.Client` against a local HTTP endpoint that
speaks the KFP API (the transport boundary), uploading the shipped pipelines
as compiled.
"""

from __future__ import annotations

import email.parser
import email.policy
import json

from components.kubernetes import submit
from pipelines import cli
from tests.fake_http import FakeJsonApi


class FakeKfp(FakeJsonApi):
    """A KFP API v2beta1 endpoint on a free port that records every request."""

    def __init__(self, existing_pipeline=None):
        super().__init__()
        self.existing = existing_pipeline

    def describe(self, headers, raw):
        if headers.get_content_type() == "multipart/form-data":
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + raw
            )
            return {
                "files": {
                    part.get_param("name", header="content-disposition"): (
                        part.get_filename(),
                        part.get_payload(decode=True),
                    )
                    for part in message.iter_parts()
                }
            }
        return {"body": json.loads(raw)} if raw else {}

    def answer(self, method, path, record):
        return 200, self.reply(method, path)

    def reply(self, method, path):
        api = "/apis/v2beta1"
        if path == f"{api}/healthz":
            return {"multi_user": False}
        if path == f"{api}/pipelines" and method == "GET":
            return (
                {"pipelines": [{"pipeline_id": "p-1", "display_name": self.existing}]}
                if self.existing
                else {}
            )
        if path == f"{api}/pipelines/upload":
            return {"pipeline_id": "p-1", "display_name": "taxi"}
        if path == f"{api}/pipelines/upload_version":
            return {"pipeline_id": "p-1", "pipeline_version_id": "v-2"}
        if path == f"{api}/pipelines/p-1/versions":
            return {"pipeline_versions": [{"pipeline_id": "p-1", "pipeline_version_id": "v-1"}]}
        if path == f"{api}/experiments" and method == "GET":
            return {}
        if path == f"{api}/experiments":
            return {"experiment_id": "e-1", "display_name": "Default"}
        if path == f"{api}/runs":
            return {"run_id": "r-1", "experiment_id": "e-1"}
        return {}

    def paths(self):
        return [(r["method"], r["path"]) for r in self.requests]


def test_submit_uploads_the_compiled_file_and_starts_a_run(compiled, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    _, _, path = compiled["taxi"]
    with FakeKfp() as fake:
        code = cli.main(
            [
                "submit",
                "--package",
                path,
                "--host",
                fake.host,
                "--name",
                "taxi",
                "--run",
                "--experiment",
                "nightly",
            ]
        )
    assert code == 0, capsys.readouterr().err
    assert "pipeline_id=p-1, version_id=v-1, run_id=r-1" in capsys.readouterr().out
    (upload,) = [r for r in fake.requests if r["path"] == "/apis/v2beta1/pipelines/upload"]
    assert upload["method"] == "POST" and upload["query"]["name"] == ["taxi"]
    filename, content = upload["files"]["uploadfile"]
    with open(path, "rb") as f:
        assert content == f.read()
    (run,) = [r for r in fake.requests if r["path"] == "/apis/v2beta1/runs"]
    assert run["body"]["pipeline_version_reference"] == {
        "pipeline_id": "p-1",
        "pipeline_version_id": "v-1",
    }
    assert run["body"]["experiment_id"] == "e-1"
    (experiment,) = [
        r
        for r in fake.requests
        if r["method"] == "POST" and r["path"] == "/apis/v2beta1/experiments"
    ]
    assert experiment["body"]["display_name"] == "nightly"


def test_submit_adds_a_version_when_the_pipeline_exists(compiled, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _, _, path = compiled["digits"]
    with FakeKfp(existing_pipeline="digits") as fake:
        assert cli.main(["submit", "--package", path, "--host", fake.host, "--version", "v2"]) == 0
    assert "pipeline_id=p-1, version_id=v-2" in capsys.readouterr().out
    (upload,) = [r for r in fake.requests if r["path"] == "/apis/v2beta1/pipelines/upload_version"]
    assert upload["query"]["name"] == ["v2"] and upload["query"]["pipelineid"] == ["p-1"]
    with open(path, "rb") as f:
        assert upload["files"]["uploadfile"][1] == f.read()
    assert ("POST", "/apis/v2beta1/pipelines/upload") not in fake.paths()
    assert not any(p == "/apis/v2beta1/runs" for _, p in fake.paths())


def test_submit_of_a_missing_package_fails_clearly(capsys, tmp_path):
    assert (
        cli.main(
            ["submit", "--package", str(tmp_path / "nope.yaml"), "--host", "http://127.0.0.1:9"]
        )
        == 2
    )
    assert "--package:" in capsys.readouterr().err


def test_submit_without_run_returns_the_new_pipeline_and_its_first_version(
    compiled, monkeypatch, tmp_path
):
    monkeypatch.setenv("HOME", str(tmp_path))
    _, _, path = compiled["taxi"]
    with FakeKfp() as fake:
        ids = submit.submit(path, fake.host, "taxi")
    assert ids == {"pipeline_id": "p-1", "version_id": "v-1"}
    assert not any(p == "/apis/v2beta1/runs" for _, p in fake.paths())
