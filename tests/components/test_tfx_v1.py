"""`components.tfx_v1`: `tfx.v1` with this product's Trainer and Transform, nothing else changed."""

from __future__ import annotations

from tfx import v1 as stock
from tfx.components import Trainer as StockTrainer
from tfx.components import Transform as StockTransform

from components import tfx_v1
from components.trainer.component import Trainer
from components.transform.component import Transform
from testkit import tfx_examples


def test_the_mirror_swaps_the_trainer_and_transform_only():
    assert tfx_v1.components.Trainer is Trainer
    assert tfx_v1.components.Transform is Transform
    names = {n for n in vars(stock.components) if not n.startswith("__")}
    assert names <= set(vars(tfx_v1.components))
    for name in names - {"Trainer", "Transform"}:
        assert getattr(tfx_v1.components, name) is getattr(stock.components, name), name
    for section in ("dsl", "extensions", "orchestration", "proto", "testing", "types", "utils"):
        assert getattr(tfx_v1, section) is getattr(stock, section), section
    # Stock's own module is untouched: a pipeline that imports tfx.v1 still gets stock's.
    assert stock.components.Trainer is StockTrainer
    assert stock.components.Transform is StockTransform


def test_the_penguin_example_swaps_in_one_line(tmp_path):
    (old, new), *others = tfx_examples.PENGUIN.swap
    assert not others
    assert (old, new) == ("from tfx import v1 as tfx\n", "from components import tfx_v1 as tfx\n")
    module = tfx_examples.load_pipeline(tfx_examples.PENGUIN, str(tmp_path), swapped=True)
    pipeline = tfx_examples.create_pipeline(
        tfx_examples.PENGUIN, module, str(tmp_path), str(tmp_path / "data"), enable_tuning=True
    )
    kinds = {type(c) for c in pipeline.components}
    assert {Trainer, Transform} <= kinds
    assert not {StockTrainer, StockTransform} & kinds
    assert stock.components.Tuner in kinds
