"""I-JEPA end to end: the quick config runs unchanged through the CLI (the context encoder
on the context patches, the predictor, the EMA target encoder checkpointed with the loss
and lagging the trunk, the loss falling); a crash plus auto-resume ends bitwise equal to an
uninterrupted run (trunk, predictor, target encoder; the resumed steps draw the same crops
and the same masks), and so does, with ``-m slow``, a real SIGKILL through the CLI; a data
loader started mid-epoch gives the same masks as the uninterrupted epoch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import crash_and_resume_states, read_jsonl
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli
from tests.integration.test_quick_vicreg import assert_bitwise_equal

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_ijepa"
QUICK = "test/integration_test/" + NAME


def test_quick_ijepa_runs_unchanged(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    assert state["heads.0.mask_token"].shape == (1, 1, 16)
    assert state["heads.0.predictor_proj.weight"].shape == (32, 16)  # back to the trunk width
    trunk = {k: v for k, v in state.items() if k.startswith("trunk.")}
    target = {
        k.removeprefix("loss.target_encoder."): v
        for k, v in state.items()
        if k.startswith("loss.target_encoder.")
    }
    assert target.keys() == trunk.keys()  # the trunk only: the predictor is not copied
    assert any(not torch.equal(target[k], trunk[k]) for k in trunk)  # it lags
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    losses = [r["loss"] for r in records]
    # layer-normed targets of width 32: about 32 (+ the prediction's norm) at the start
    assert all(math.isfinite(v) and 10 < v < 100 for v in losses)
    assert losses[-1] < losses[0]


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    full, resumed = crash_and_resume_states(
        tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8
    )
    target = [k for k in full if k.startswith("loss.target_encoder.")]
    assert target and all(torch.equal(full[k], resumed[k]) for k in target)


def test_masks_of_a_mid_epoch_start_are_those_of_the_whole_epoch() -> None:
    from vissl.data import build_dataset, get_loader
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate([f"config={QUICK}", *RESUME[:1]])

    def batches(start_iter: int) -> list[dict]:
        loader = get_loader(
            build_dataset(cfg, "TRAIN"),
            cfg,
            "TRAIN",
            num_replicas=1,
            rank=0,
            seed=0,
            device_is_cuda=False,
        )
        loader.sampler.set_epoch(1)
        loader.sampler.set_start_iter(start_iter)
        return list(loader)

    whole, tail = batches(0), batches(2)
    assert len(whole) == 4 and len(tail) == 2
    for a, b in zip(whole[2:], tail, strict=True):
        for key in ("data", "mask", "target_masks"):
            assert torch.equal(a[key][0], b[key][0]), key
    assert not torch.equal(whole[0]["target_masks"][0], whole[1]["target_masks"][0])


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}", *RESUME], iteration=7)
    assert_bitwise_equal(final_state(full), final_state(killed))


@pytest.mark.slow
def test_two_processes_train_and_checkpoint_the_target_encoder(tmp_path: Path) -> None:
    """DDP on 2 gloo ranks: the collators of the two ranks draw their own masks (each
    truncates to its own batch), the loss of each rank is its images' mean, and the
    checkpoint holds a target encoder that lags the trunk."""
    from tests.integration._runs import run_config

    run_config(
        QUICK,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    state = final_state(tmp_path)
    target = state["loss.target_encoder.trunk.pos_embed"]
    assert torch.isfinite(target).all() and not torch.equal(target, state["trunk.pos_embed"])
    losses = [r["loss"] for r in read_jsonl(str(tmp_path / "stdout.json"))]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
