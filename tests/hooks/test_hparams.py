"""Hyper-parameters (HOOKS.SUMMARY.HPARAMS): the resolved config flattened, plus what the
loss and the train step add through ``dump_hparams()``, in ``summary.json`` and in
TensorBoard's HPARAMS view of the run's own event folder, read back with TensorBoard's
reader."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests._tiny_run import tiny_config, train_in_process
from vissl.hooks import default_hook_generator
from vissl.hooks.summary_hook import SUMMARY_FILE, collect_hparams
from vissl.losses import LOSS_REGISTRY, register_loss
from vissl.losses.cross_entropy_multiple_output_single_target import (
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, register_train_step
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep
from vissl.utils.hparams import flatten_hparams

tb = pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from tensorboard.plugins.hparams import metadata as hparams_metadata  # noqa: E402

LOSS_NAME = "_test_ce_with_hparams"
STEP_NAME = "_test_step_with_hparams"


class CEWithHparams(CrossEntropyMultipleOutputSingleTargetLoss):
    def dump_hparams(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "schedule": {"kind": "fixed", "steps": [1, 2]}}


class StepWithHparams(StandardTrainStep):
    def dump_hparams(self) -> dict[str, Any]:
        return {"sections": "standard"}


if LOSS_NAME not in LOSS_REGISTRY:
    register_loss(LOSS_NAME)(CEWithHparams)
if STEP_NAME not in TRAIN_STEP_REGISTRY:
    register_train_step(STEP_NAME)(StepWithHparams)


def test_flatten_keeps_scalars_and_writes_lists_as_strings() -> None:
    tree = {
        "OPTIMIZER": {"name": "sgd", "num_epochs": 2, "momentum": 0.9, "nesterov": False},
        "DATA": {"TRAIN": {"DATA_SOURCES": ["digits"], "TRANSFORMS": [{"name": "ToTensor"}]}},
        "MODEL": {"WEIGHTS_INIT": {"PARAMS_FILE": None}, "EXTRA": {}},
    }
    assert flatten_hparams(tree) == {
        "OPTIMIZER.name": "sgd",
        "OPTIMIZER.num_epochs": 2,
        "OPTIMIZER.momentum": 0.9,
        "OPTIMIZER.nesterov": False,
        "DATA.TRAIN.DATA_SOURCES": '["digits"]',
        "DATA.TRAIN.TRANSFORMS": '[{"name": "ToTensor"}]',
        "MODEL.WEIGHTS_INIT.PARAMS_FILE": "None",
        "MODEL.EXTRA": "{}",
    }


def _event_files(folder: Any) -> list[Any]:
    return sorted(p for p in folder.rglob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("hparams")
    cfg = tiny_config(
        folder,
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True",
        "config.HOOKS.TENSORBOARD_SETUP.LOG_PARAMS=False",
        f"config.LOSS.name={LOSS_NAME}",
        f"config.TRAINER.TRAIN_STEP_NAME={STEP_NAME}",
    )
    task = train_in_process(cfg, default_hook_generator(cfg))
    return folder, task


def test_hparams_in_the_summary(run: Any) -> None:
    folder, task = run
    hparams = json.loads((folder / SUMMARY_FILE).read_text())["hparams"]
    assert hparams == collect_hparams(task)
    assert hparams["OPTIMIZER.name"] == "sgd"
    assert hparams["OPTIMIZER.num_epochs"] == 2
    assert hparams["DATA.TRAIN.DATA_SOURCES"] == '["digits"]'
    assert hparams["LOSS.name"] == LOSS_NAME
    # the loss's and the step's own, prefixed
    assert hparams["loss/temperature"] == 1.0
    assert hparams["loss/schedule/kind"] == "fixed"
    assert hparams["loss/schedule/steps"] == "[1, 2]"
    assert hparams["train_step/sections"] == "standard"
    assert all(isinstance(v, bool | int | float | str) for v in hparams.values())


def test_hparams_and_final_metrics_in_the_runs_event_file(run: Any) -> None:
    folder, task = run
    tb_dir = folder / "tensorboard"
    # one run: the hparams are in the run's own event folder, not in a sub-run folder
    files = _event_files(tb_dir)
    assert files and {f.parent for f in files} == {tb_dir}
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG]
    )
    assert start.hparams["OPTIMIZER.name"].string_value == "sgd"
    assert start.hparams["OPTIMIZER.num_epochs"].number_value == 2
    assert start.hparams["loss/temperature"].number_value == 1.0
    assert start.hparams["train_step/sections"].string_value == "standard"
    experiment = hparams_metadata.parse_experiment_plugin_data(
        content[hparams_metadata.EXPERIMENT_TAG]
    )
    metric_tags = {m.name.tag for m in experiment.metric_infos}
    assert "hparams/test_accuracy_list_meter_top_1" in metric_tags
    assert "hparams/best_test_loss" in metric_tags
    # the final metric is a scalar of that tag, at the last iteration
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    final = summary["test"]["final"]["metrics"]["test_accuracy_list_meter_top_1"]
    (event,) = acc.Scalars("hparams/test_accuracy_list_meter_top_1")
    assert event.step == task.iteration == 8
    assert event.value == pytest.approx(final)
