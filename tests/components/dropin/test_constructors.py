"""The tfxkit Transform and Trainer take every stock TFX 1.16 argument; misuse fails at construction."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest
from tfx import v1 as tfx
from tfx.types import Channel, standard_artifacts
from tfx.utils import proto_utils

from components.config import (
    ConfigError,
    PipelineConfig,
    StrategyConfig,
    TrainConfig,
    TransformConfig,
    payload,
    stock_args,
)
from components.config.payload import CONFIG_KEY
from components.trainer.component import Trainer
from components.transform.component import Transform

TFX_EXAMPLES = os.path.dirname(tfx.__file__).replace("/v1", "") + "/examples"
PENGUIN_MODULE = os.path.join(TFX_EXAMPLES, "penguin", "penguin_utils_keras.py")
TAXI_MODULE = os.path.join(TFX_EXAMPLES, "chicago_taxi_pipeline", "taxi_utils_native_keras.py")


def _channel(kind):
    return Channel(type=kind)


@pytest.fixture
def channels():
    return {
        "examples": _channel(standard_artifacts.Examples),
        "schema": _channel(standard_artifacts.Schema),
        "graph": _channel(standard_artifacts.TransformGraph),
        "cache": _channel(standard_artifacts.TransformCache),
        "hyperparameters": _channel(standard_artifacts.HyperParameters),
        "model": _channel(standard_artifacts.Model),
    }


@pytest.mark.parametrize(
    "ours, stock", [(Transform, tfx.components.Transform), (Trainer, tfx.components.Trainer)]
)
def test_every_stock_argument_is_accepted_in_stock_order(ours, stock):
    stock_params = list(inspect.signature(stock.__init__).parameters)
    our_params = list(inspect.signature(ours.__init__).parameters)
    assert our_params[: len(stock_params)] == stock_params
    # The only addition is keyword-only: stock positional calls keep their meaning.
    extra = inspect.signature(ours.__init__).parameters["config"]
    assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is None


def test_stock_transform_call_with_every_argument_keeps_the_exec_properties(channels):
    kwargs = dict(
        examples=channels["examples"],
        schema=channels["schema"],
        module_file=TAXI_MODULE,
        splits_config=tfx.proto.SplitsConfig(analyze=["train"], transform=["train", "eval"]),
        analyzer_cache=channels["cache"],
        materialize=False,
        disable_analyzer_cache=False,
        force_tf_compat_v1=True,
        custom_config={"mine": 1},
        disable_statistics=True,
    )
    ours, stock = Transform(**kwargs), tfx.components.Transform(**kwargs)
    user_keys = set(stock.exec_properties) - {"custom_config"}
    assert {k: ours.exec_properties[k] for k in user_keys} == {
        k: stock.exec_properties[k] for k in user_keys
    }
    custom = json.loads(ours.exec_properties["custom_config"])
    assert custom["mine"] == 1
    assert (
        stock_args.DropInSettings.from_json(custom[payload.DROPIN_KEY])
        == stock_args.DropInSettings()
    )
    assert set(ours.outputs) == set(stock.outputs)
    assert set(ours.inputs) == set(stock.inputs)


def test_stock_trainer_call_with_every_argument_keeps_the_exec_properties(channels):
    kwargs = dict(
        examples=channels["examples"],
        transform_graph=channels["graph"],
        schema=channels["schema"],
        base_model=channels["model"],
        hyperparameters=channels["hyperparameters"],
        module_file=PENGUIN_MODULE,
        train_args=tfx.proto.TrainArgs(num_steps=7, splits=["train"]),
        eval_args=tfx.proto.EvalArgs(num_steps=3),
        custom_config={"epochs": 2},
    )
    ours, stock = Trainer(**kwargs), tfx.components.Trainer(**kwargs)
    for key in ("train_args", "eval_args", "module_file", "run_fn"):
        assert ours.exec_properties[key] == stock.exec_properties[key], key
    custom = json.loads(ours.exec_properties["custom_config"])
    assert custom["epochs"] == 2 and payload.DROPIN_KEY in custom and CONFIG_KEY not in custom
    assert set(ours.inputs) == set(stock.inputs)


def test_trainer_accepts_transformed_examples_and_a_run_fn_path(channels):
    trainer = Trainer(
        transformed_examples=channels["examples"],
        transform_graph=channels["graph"],
        run_fn="tests.components.trainer.stock_user_module.run_fn",
        config={"strategy": {"kind": "one_device"}},
    )
    settings = payload.decode(trainer.exec_properties["custom_config"]).settings
    assert settings.strategy.kind == "one_device"


def test_product_settings_are_optional_and_need_no_data_section(channels):
    transform = Transform(
        examples=channels["examples"],
        schema=channels["schema"],
        module_file=TAXI_MODULE,
        config=stock_args.DropInSettings(transform=TransformConfig(num_shards=3)),
    )
    settings = payload.decode(transform.exec_properties["custom_config"]).settings
    assert settings.transform.num_shards == 3


def _user_module_trainer(channels, config):
    return Trainer(
        examples=channels["examples"],
        transform_graph=channels["graph"],
        module_file=PENGUIN_MODULE,
        config=config,
    )


def test_a_full_config_travels_beside_the_settings(channels, taxi_config):
    trainer = _user_module_trainer(channels, taxi_config)
    custom = json.loads(trainer.exec_properties["custom_config"])
    assert json.loads(custom[CONFIG_KEY])["name"] == taxi_config.name
    assert (
        stock_args.DropInSettings.from_json(custom[payload.DROPIN_KEY]).strategy
        == taxi_config.strategy
    )


# The README's "Bring your own pipeline": a full config needs no data section
# when the user brings the module.
NO_DATA_CONFIG = {
    "name": "own-module",
    "strategy": {"kind": "mirrored"},
    "train": {"train_steps": 120, "eval_steps": 7, "checkpoint_every_steps": 20},
}


def test_a_pipeline_config_without_data_serves_a_user_module(channels):
    config = PipelineConfig(
        strategy=StrategyConfig(kind="mirrored"),
        train=TrainConfig(train_steps=120, eval_steps=7, checkpoint_every_steps=20),
    )
    assert config.data is None
    trainer = _user_module_trainer(channels, config)
    # Its step counts fill in the omitted train_args / eval_args.
    assert proto_utils.json_to_proto(
        trainer.exec_properties["train_args"], tfx.proto.TrainArgs()
    ) == tfx.proto.TrainArgs(num_steps=120)
    assert proto_utils.json_to_proto(
        trainer.exec_properties["eval_args"], tfx.proto.EvalArgs()
    ) == tfx.proto.EvalArgs(num_steps=7)
    custom = trainer.exec_properties["custom_config"]
    settings = payload.decode(custom).settings
    assert settings.strategy.kind == "mirrored" and settings.checkpoint_every_steps == 20
    # What the executor decodes: the config, still without data.
    decoded = payload.decode(custom).config
    assert decoded.data is None and decoded.train.train_steps == 120
    transform = Transform(
        examples=channels["examples"],
        schema=channels["schema"],
        module_file=TAXI_MODULE,
        config=PipelineConfig(),
    )
    assert payload.decode(transform.exec_properties["custom_config"]).config == PipelineConfig()


def test_a_config_mapping_without_data_serves_a_user_module(channels):
    trainer = _user_module_trainer(channels, NO_DATA_CONFIG)
    assert proto_utils.json_to_proto(
        trainer.exec_properties["train_args"], tfx.proto.TrainArgs()
    ) == tfx.proto.TrainArgs(num_steps=120)
    custom = trainer.exec_properties["custom_config"]
    decoded = payload.decode(custom).config
    assert decoded.name == "own-module" and decoded.data is None
    settings = payload.decode(custom).settings
    assert settings.strategy.kind == "mirrored" and settings.checkpoint_every_steps == 20
    transform = Transform(
        examples=channels["examples"],
        schema=channels["schema"],
        module_file=TAXI_MODULE,
        config={"name": "own-module", "transform": {"num_shards": 3}},
    )
    settings = payload.decode(transform.exec_properties["custom_config"]).settings
    assert settings.transform.num_shards == 3


def test_a_config_mapping_names_its_bad_field(channels):
    with pytest.raises(
        ConfigError, match=r"^config\.train\.train_steps: expected an integer >= 1, got 0"
    ):
        _user_module_trainer(channels, {"train": {"train_steps": 0}})
    with pytest.raises(
        ConfigError, match=r"^config\.trian: unknown key 'trian'; allowed keys: beam_args, data,"
    ):
        _user_module_trainer(channels, {"name": "x", "trian": {}})


def test_generated_functions_refuse_a_config_without_data_naming_it(channels):
    with pytest.raises(
        ConfigError,
        match=r"^data: without module_file or preprocessing_fn, the generated preprocessing_fn "
        r"needs the data section: set exactly one of 'builtin'",
    ):
        Transform(examples=channels["examples"], schema=channels["schema"], config=PipelineConfig())
    with pytest.raises(
        ConfigError,
        match=r"^data: without module_file or run_fn, the Trainer's generated model needs the data section",
    ):
        Trainer(examples=channels["examples"], config=PipelineConfig())


# --------------------------------------------------------------------------- #
# Misuse, named at construction
# --------------------------------------------------------------------------- #


def test_missing_module_file_is_named(channels, tmp_path):
    with pytest.raises(ConfigError, match=r"^module_file: .*nowhere\.py' does not exist"):
        Trainer(examples=channels["examples"], module_file=str(tmp_path / "nowhere.py"))


def test_module_without_run_fn_is_named(channels, tmp_path):
    module = tmp_path / "no_run_fn.py"
    module.write_text("def trainer_fn(args):\n    return None\n")
    with pytest.raises(ConfigError, match=r"^module_file: .* defines no top-level 'run_fn'"):
        Trainer(examples=channels["examples"], module_file=str(module))


def test_module_without_preprocessing_fn_is_named(channels, tmp_path):
    module = tmp_path / "no_pre.py"
    module.write_text("def run_fn(fn_args):\n    return None\n")
    with pytest.raises(
        ConfigError, match=r"^module_file: .* defines no top-level 'preprocessing_fn'"
    ):
        Transform(examples=channels["examples"], schema=channels["schema"], module_file=str(module))


def test_missing_stats_options_updater_fn_is_named(channels):
    with pytest.raises(
        ConfigError, match=r"^stats_options_updater_fn: .* defines no top-level 'nope'"
    ):
        Transform(
            examples=channels["examples"],
            schema=channels["schema"],
            module_file=TAXI_MODULE,
            stats_options_updater_fn="nope",
        )


def test_unknown_run_fn_path_is_named(channels):
    with pytest.raises(
        ConfigError, match=r"^run_fn: module 'components\.trainer\.run_fn' .* no top-level 'nope'"
    ):
        Trainer(examples=channels["examples"], run_fn="components.trainer.run_fn.nope")
    with pytest.raises(ConfigError, match=r"^preprocessing_fn: cannot find module"):
        Transform(
            examples=channels["examples"],
            schema=channels["schema"],
            preprocessing_fn="no_such_package_xyz.mod.fn",
        )


def test_a_full_config_gives_omitted_train_and_eval_args_its_step_counts(channels, taxi_config):
    # Without them fn_args.train_steps / eval_steps would be None and a stock
    # run_fn's fit(steps_per_epoch=fn_args.train_steps) would get no step count.
    trainer = _user_module_trainer(channels, taxi_config)
    train_args = proto_utils.json_to_proto(
        trainer.exec_properties["train_args"], tfx.proto.TrainArgs()
    )
    eval_args = proto_utils.json_to_proto(
        trainer.exec_properties["eval_args"], tfx.proto.EvalArgs()
    )
    assert train_args.num_steps == taxi_config.train.train_steps
    assert eval_args.num_steps == taxi_config.train.eval_steps
    # Given args are kept as given; without a full config there is nothing to fill in.
    given = Trainer(
        examples=channels["examples"],
        module_file=PENGUIN_MODULE,
        eval_args=tfx.proto.EvalArgs(num_steps=0, splits=["eval"]),
        config=taxi_config,
    )
    eval_args = proto_utils.json_to_proto(given.exec_properties["eval_args"], tfx.proto.EvalArgs())
    assert (eval_args.num_steps, list(eval_args.splits)) == (0, ["eval"])
    plain = Trainer(examples=channels["examples"], module_file=PENGUIN_MODULE)
    assert plain.exec_properties["train_args"] == "{}"


def test_zero_train_steps_are_named(channels):
    with pytest.raises(ConfigError, match=r"^train_args\.num_steps: expected an integer >= 1"):
        Trainer(
            examples=channels["examples"],
            module_file=PENGUIN_MODULE,
            train_args=tfx.proto.TrainArgs(num_steps=0),
        )


def test_settings_contradicting_train_args_are_named(channels, taxi_config):
    with pytest.raises(
        ConfigError, match=r"^train_args\.num_steps: 5 contradicts config train\.train_steps"
    ):
        Trainer(
            examples=channels["examples"],
            module_file=PENGUIN_MODULE,
            train_args=tfx.proto.TrainArgs(num_steps=5),
            config=taxi_config,
        )
    with pytest.raises(ConfigError, match=r"^train_args\.num_steps: 5 contradicts"):
        Trainer(
            config=taxi_config,
            examples=channels["examples"],
            transform_graph=channels["graph"],
            train_args=tfx.proto.TrainArgs(num_steps=5),
        )


def test_accumulation_with_a_user_run_fn_is_named(channels, taxi_config):
    import dataclasses

    config = dataclasses.replace(
        taxi_config, train=dataclasses.replace(taxi_config.train, grad_accum_steps=2)
    )
    with pytest.raises(ConfigError, match=r"^config\.train\.grad_accum_steps: "):
        Trainer(examples=channels["examples"], module_file=PENGUIN_MODULE, config=config)


def test_generated_functions_need_a_full_config(channels):
    with pytest.raises(ConfigError, match=r"^config: without module_file or preprocessing_fn"):
        Transform(examples=channels["examples"], schema=channels["schema"])
    with pytest.raises(ConfigError, match=r"^config: without module_file or run_fn"):
        Trainer(examples=channels["examples"], config={"strategy": {"kind": "mirrored"}})


def test_invalid_settings_are_named(channels):
    with pytest.raises(ConfigError, match=r"^config\.strategy\.kind: expected one of"):
        Trainer(
            examples=channels["examples"],
            module_file=PENGUIN_MODULE,
            config={"strategy": {"kind": "everywhere"}},
        )
    with pytest.raises(ConfigError, match=r"^config: expected a PipelineConfig, DropInSettings"):
        Trainer(examples=channels["examples"], module_file=PENGUIN_MODULE, config=42)


def test_reserved_custom_config_keys_are_named(channels):
    with pytest.raises(ConfigError, match=r"^custom_config: keys \['tfxkit_dropin'\] are reserved"):
        Trainer(
            examples=channels["examples"],
            module_file=PENGUIN_MODULE,
            custom_config={payload.DROPIN_KEY: "x"},
        )


def test_module_file_and_run_fn_together_are_named(channels):
    with pytest.raises(ConfigError, match=r"^run_fn: give either module_file or run_fn"):
        Trainer(
            examples=channels["examples"],
            module_file=PENGUIN_MODULE,
            run_fn="components.trainer.run_fn.run_fn",
        )


def test_local_workers_in_a_pipeline_of_ones_own_are_refused_naming_the_field(
    channels, taxi_config
):
    # Only a tfxkit run starts the servers (and hands its components their
    # address); nothing would start them here.
    with pytest.raises(
        ConfigError,
        match=r"^ingestion\.service\.local_workers: 2 asks a tfxkit local run .* start the "
        r"servers yourself",
    ):
        _user_module_trainer(channels, {"ingestion": {"service": {"local_workers": 2}}})
    service = dataclasses.replace(taxi_config.ingestion.service, local_workers=1)
    config = dataclasses.replace(
        taxi_config, ingestion=dataclasses.replace(taxi_config.ingestion, service=service)
    )
    with pytest.raises(ConfigError, match=r"^ingestion\.service\.local_workers: 1 asks"):
        Trainer(examples=channels["examples"], config=config)
