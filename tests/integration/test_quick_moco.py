"""MoCo end to end: the VISSL-language quick config runs unchanged, and a crash plus
auto-resume ends with bitwise the weights, queue and momentum encoder of an uninterrupted
run (tools/kill_and_resume.py does the same with real SIGKILLs)."""

from __future__ import annotations

import pytest
import torch

from tests.integration._runs import run_config
from tests.integration.test_exact_resume import crash_generator
from vissl.utils.checkpoint import load_checkpoint

QUICK = "test/integration_test/quick_moco"


def final_state(folder) -> dict[str, torch.Tensor]:
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    classy = load_checkpoint(str(path))["classy_state_dict"]
    model = classy["base_model"]["model"]
    state = {f"trunk.{k}": v for k, v in model["trunk"].items()}
    state |= {f"heads.{k}": v for k, v in model["heads"].items()}
    state |= {f"loss.{k}": v for k, v in classy["loss"].items()}
    return state


def test_quick_moco_runs_and_checkpoints_its_queue_and_encoder(tmp_path) -> None:
    run_config(QUICK, f"config.CHECKPOINT.DIR={tmp_path}")
    state = final_state(tmp_path)
    assert state["loss.queue"].shape == (16, 32)
    assert int(state["loss.queue_ptr"]) == (8 * 4) % 16  # 8 steps of 4 keys
    encoder = {k.removeprefix("loss.momentum_encoder."): v for k, v in state.items()}
    # the encoder follows the model but is not equal to it (m = 0.99)
    name = "trunk.base_model._feature_blocks.conv1.weight"
    if name not in encoder:
        name = next(k for k in encoder if k.startswith("trunk.") and k.endswith("weight"))
    assert not torch.equal(encoder[name], state[name])
    assert (
        torch.norm(torch.nn.functional.normalize(state["loss.queue"], dim=1) - state["loss.queue"])
        < 1e-4
    )


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_crash_and_resume_restores_queue_and_momentum_encoder_bitwise(tmp_path, nproc) -> None:
    common = [
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",  # 8 (1 process) or 4 steps per phase
        "config.LOSS.moco_loss.queue_size=8",
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
        "config.CHECKPOINT.AUTO_RESUME=True",
    ]
    run_config(QUICK, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *common, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    run_config(QUICK, *common, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    full, resumed = final_state(tmp_path / "full"), final_state(crashed)
    assert full.keys() == resumed.keys()
    assert any(k.startswith("loss.momentum_encoder.") for k in full)
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
