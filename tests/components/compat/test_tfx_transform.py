"""The TFX / TFT compatibility module: the Transform refuses to run on anything it was not written for."""

from __future__ import annotations

import json
import os
import re

import pytest
import tensorflow_transform.beam as tft_beam
from tfx.components.transform import executor as tfx_transform_executor
from tfx.components.transform import labels
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs as specs

from components.compat import tfx_transform as tfx_compat
from components.config.payload import CONFIG_KEY
from components.transform import executor
from testkit.tiny import tiny

# A release the patches were not written for.
OTHER_VERSION = "1.17.0"


def _do(root, config) -> None:
    """Calls the tfxkit Transform executor on artifacts under `root` (nothing exists there)."""
    examples, schema = standard_artifacts.Examples(), standard_artifacts.Schema()
    examples.uri, schema.uri = os.path.join(root, "examples"), os.path.join(root, "schema")
    graph, transformed = standard_artifacts.TransformGraph(), standard_artifacts.Examples()
    graph.uri, transformed.uri = (
        os.path.join(root, "transform_graph"),
        os.path.join(root, "transformed_examples"),
    )
    context = executor.Executor.Context(beam_pipeline_args=[], tmp_dir=os.path.join(root, "tmp"))
    executor.Executor(context).Do(
        {specs.EXAMPLES_KEY: [examples], specs.SCHEMA_KEY: [schema]},
        {specs.TRANSFORM_GRAPH_KEY: [graph], specs.TRANSFORMED_EXAMPLES_KEY: [transformed]},
        {
            specs.PREPROCESSING_FN_KEY: "components.data.preprocessing.preprocessing_fn",
            specs.CUSTOM_CONFIG_KEY: json.dumps({CONFIG_KEY: config.to_json()}),
        },
    )


@pytest.fixture
def stock_do_must_not_run(monkeypatch):
    """Makes TFX's own `Executor.Do` fail the test if it is reached."""

    def ran(*args, **kwargs):
        pytest.fail("TFX's Transform ran although the compatibility check should have failed first")

    monkeypatch.setattr(tfx_transform_executor.Executor, "Do", ran)


def test_supported_versions_pass():
    tfx_compat.check()
    assert any(tfx_compat.TFX_VERSION.startswith(v + ".") for v in tfx_compat.EXPECTED_TFX)
    assert any(tfx_compat.TFT_VERSION.startswith(v + ".") for v in tfx_compat.EXPECTED_TFT)


@pytest.mark.parametrize(
    "attribute,package,pin",
    [
        ("TFX_VERSION", "TFX", r"tfx==1\.16\.\* or tfx==1\.21\.\*"),
        (
            "TFT_VERSION",
            "TFT",
            r"tensorflow-transform==1\.16\.\* or tensorflow-transform==1\.21\.\*",
        ),
    ],
)
def test_other_version_fails_before_the_transform_runs(
    monkeypatch, tmp_path, taxi_config, stock_do_must_not_run, attribute, package, pin
):
    monkeypatch.setattr(tfx_compat, attribute, OTHER_VERSION)
    expected = rf"found {package} 1\.17\.0 but expected {package} 1\.16\.x or 1\.21\.x: .*; pin {pin} or update components/compat/tfx_transform\.py"
    with pytest.raises(tfx_compat.TfxCompatError, match=expected):
        _do(str(tmp_path), tiny(taxi_config))
    assert os.listdir(tmp_path) == [], "the Transform wrote something before failing"
    # The patches refuse on their own too.
    with pytest.raises(tfx_compat.TfxCompatError, match=expected), tfx_compat.without_deep_copy():
        pass


@pytest.mark.parametrize(
    "owner,name,qualified",
    [
        (
            tfx_transform_executor,
            "TransformProcessor",
            "tfx.components.transform.executor.TransformProcessor",
        ),
        (
            tfx_transform_executor,
            "_TRANSFORM_INTERNAL_FEATURE_FOR_KEY",
            "tfx.components.transform.executor._TRANSFORM_INTERNAL_FEATURE_FOR_KEY",
        ),
        (
            tfx_compat.STOCK_PROCESSOR,
            "_EncodeAndWrite",
            "tfx.components.transform.executor.TransformProcessor._EncodeAndWrite",
        ),
        (
            tft_beam.Context,
            "get_use_deep_copy_optimization",
            "tensorflow_transform.beam.Context.get_use_deep_copy_optimization",
        ),
    ],
    ids=["processor", "internal_key", "encode_and_write", "deep_copy"],
)
def test_missing_internal_name_fails_naming_it(
    monkeypatch, tmp_path, taxi_config, stock_do_must_not_run, owner, name, qualified
):
    monkeypatch.delattr(owner, name)
    expected = (
        rf"{re.escape(qualified)} no longer exists .*update components/compat/tfx_transform\.py"
    )
    with pytest.raises(tfx_compat.TfxCompatError, match=expected):
        _do(str(tmp_path), tiny(taxi_config))
    assert os.listdir(tmp_path) == [], "the Transform wrote something before failing"


def test_patches_are_undone_after_a_run():
    written = []
    deep_copy = vars(tft_beam.Context)["get_use_deep_copy_optimization"]
    with (
        tfx_compat.without_deep_copy(),
        tfx_compat.tfrecord_writer(lambda schema, path: written.append(path) or "writer"),
    ):
        assert tft_beam.Context.get_use_deep_copy_optimization() is False
        processor = tfx_transform_executor.TransformProcessor()
        assert isinstance(processor, tfx_compat.STOCK_PROCESSOR)
        assert (
            processor._EncodeAndWrite(
                schema=None, file_format=labels.FORMAT_TFRECORD, output_path="out"
            )
            == "writer"
        )
    assert written == ["out"]
    assert tfx_transform_executor.TransformProcessor is tfx_compat.STOCK_PROCESSOR
    assert vars(tft_beam.Context)["get_use_deep_copy_optimization"] is deep_copy
