"""Gradient accumulation: k micro-batches of B give the weights of one batch of k*B.

Comparable only without cross-sample coupling inside a batch: a GroupNorm ResNet (no
BatchNorm statistics), a per-sample-mean cross-entropy, deterministic transforms and the
same sample order (the sampler's permutation is cut into the same k*B samples per step).
"""

from __future__ import annotations

import json

import pytest

from tests.integration._runs import run_config
from vissl.utils.checkpoint import load_checkpoint

COMMON = [
    "config.MODEL.TRUNK.RESNETS.NORM=GroupNorm",
    "config.MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS=16",
    "config.DATA.TRAIN.DATA_LIMIT=64",
    "config.TEST_MODEL=False",
    "config.OPTIMIZER.num_epochs=1",
    "config.OPTIMIZER.momentum=0.9",
    "config.MULTI_PROCESSING_METHOD=fork",
]


def weights(folder):
    (path,) = folder.glob("model_final*.torch")
    model = load_checkpoint(str(path))["classy_state_dict"]["base_model"]["model"]
    return {f"trunk.{k}": v for k, v in model["trunk"].items()} | {
        f"heads.{k}": v for k, v in model["heads"].items()
    }


@pytest.mark.integration
@pytest.mark.parametrize("nproc", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_accumulating_k_micro_batches_equals_one_large_batch(tmp_path, nproc):
    big = run_config(
        "test/cpu_test/tiny_supervised",
        *COMMON,
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
        f"config.CHECKPOINT.DIR={tmp_path / 'big'}",
    )
    acc = run_config(
        "test/cpu_test/tiny_supervised",
        *COMMON,
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=4",
        f"config.CHECKPOINT.DIR={tmp_path / 'acc'}",
    )
    if nproc == 1:
        assert big.iteration == acc.iteration == 4  # optimizer steps, not micro-batches
        assert acc.num_updates == big.num_updates == 64
    a, b = weights(tmp_path / "big"), weights(tmp_path / "acc")
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < 1e-5, worst
    if nproc == 1:
        # The logged loss of a step is the mean over its micro-batches: the first step's
        # loss (same starting weights, per-sample-mean loss) equals the large batch's.
        first = [
            json.loads((tmp_path / run / "stdout.json").read_text().splitlines()[0])["loss"]
            for run in ("big", "acc")
        ]
        assert abs(first[0] - first[1]) < 1e-5, first
        # Control: the same micro-batches without accumulation (4x the optimizer steps)
        # end far away, so the comparison above is sensitive.
        run_config(
            "test/cpu_test/tiny_supervised",
            *COMMON,
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
            f"config.CHECKPOINT.DIR={tmp_path / 'small'}",
        )
        c = weights(tmp_path / "small")
        assert max((a[k].float() - c[k].float()).abs().max().item() for k in a) > 1e-3


@pytest.mark.integration
@pytest.mark.slow
def test_overridden_backward_runs_for_every_micro_batch(tmp_path):
    from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, register_train_step
    from vissl.trainer.train_steps.standard_train_step import StandardTrainStep

    calls = []

    @register_train_step("test_counting_backward_step")
    class CountingBackward(StandardTrainStep):
        def backward(self, task, local_loss):
            calls.append(task.micro_step)
            super().backward(task, local_loss)

    try:
        task = run_config(
            "test/cpu_test/tiny_supervised",
            *COMMON,
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
            "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=2",
            "config.TRAINER.TRAIN_STEP_NAME=test_counting_backward_step",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    finally:
        TRAIN_STEP_REGISTRY.unregister("test_counting_backward_step")
    assert task.iteration == 4 and calls == [0, 1] * 4


def test_the_logged_loss_is_reduced_once_per_step(tmp_path, monkeypatch):
    """#22 item 12: the loss all-reduce for logging ran for every micro-batch; now once
    per optimizer step, on the mean of the micro-batches' losses."""
    from tests._tiny_run import tiny_config, train_in_process
    from vissl.trainer.train_steps.standard_train_step import StandardTrainStep

    calls: list[int] = []
    original = StandardTrainStep.reduce_loss_for_logging

    def counted(self, task, local_loss):
        calls.append(task.iteration)
        return original(self, task, local_loss)

    monkeypatch.setattr(StandardTrainStep, "reduce_loss_for_logging", counted)
    cfg = tiny_config(
        tmp_path,
        "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=2",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        "config.TEST_MODEL=False",
    )
    task = train_in_process(cfg)
    train_steps = task.iteration
    assert train_steps == 8
    assert calls == list(range(train_steps))  # one per optimizer step
