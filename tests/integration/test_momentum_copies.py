"""Momentum copies of the model (MoCo's key encoder, DINO's teacher, SwAV's momentum
encoder, the EMA hook's average) follow the student everywhere it goes: they start from
``MODEL.WEIGHTS_INIT``, and a model with SyncBatchNorm over sub-groups can be copied."""

from __future__ import annotations

import pytest
import torch

from tests.integration._runs import run_config
from vissl.utils.checkpoint import load_checkpoint


def _final(folder) -> dict:
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    return load_checkpoint(str(path))["classy_state_dict"]


def _flat(model: dict) -> dict[str, torch.Tensor]:
    return {f"trunk.{k}": v for k, v in model["trunk"].items()} | {
        f"heads.{k}": v for k, v in model["heads"].items()
    }


# the student never moves: its learning rate is 0 throughout
_LR_0 = ("config.OPTIMIZER.param_schedulers.lr.start_value=0.0",)
_COMPOSITE_LR_0 = (  # quick_ibot's warm-up + cosine
    "config.OPTIMIZER.param_schedulers.lr.schedulers.0.end_value=0.0",
    "config.OPTIMIZER.param_schedulers.lr.schedulers.1.start_value=0.0",
    "config.OPTIMIZER.param_schedulers.lr.schedulers.1.end_value=0.0",
)


@pytest.mark.integration
@pytest.mark.parametrize(
    "config,copy_prefix,exact,lr_0",
    [
        ("test/integration_test/quick_moco", "momentum_encoder.", True, _LR_0),
        ("test/integration_test/quick_dino", "teacher.", True, _LR_0),
        ("test/integration_test/quick_ibot", "teacher.", True, _COMPOSITE_LR_0),
        # SwAV normalises its prototypes after every step: equal to rounding
        ("test/integration_test/quick_swav_momentum", "momentum_encoder.", False, _LR_0),
    ],
)
@pytest.mark.slow
def test_weights_init_reaches_every_momentum_copy(
    tmp_path, config, copy_prefix, exact, lr_0
) -> None:
    run_config(config, f"config.CHECKPOINT.DIR={tmp_path / 'pretrained'}")
    (weights,) = (tmp_path / "pretrained").glob("model_final_checkpoint_phase*.torch")
    run_config(
        config,
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
        *lr_0,
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        "config.HOOKS.EMA_MODEL.DECAY=0.5",
        f"config.CHECKPOINT.DIR={tmp_path / 'init'}",
    )
    loaded = _flat(load_checkpoint(str(weights))["classy_state_dict"]["base_model"]["model"])
    final = _final(tmp_path / "init")
    student = _flat(final["base_model"]["model"])
    ema = _flat(final["ema_model"]["model"])
    copy = {
        k.removeprefix(copy_prefix): v
        for k, v in final["loss"].items()
        if k.startswith(copy_prefix)
    }
    params = [k for k in student if "running_" not in k and "num_batches" not in k]
    trunk = [k for k in params if k.startswith("trunk.")]
    assert trunk and all(torch.equal(student[k], loaded[k]) for k in trunk)  # loaded, kept

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=0, atol=1e-6)

    differ = [k for k in params if not same(copy[k], student[k])]
    assert not differ, f"{copy_prefix} differs from the loaded student: {differ[:3]}"
    differ = [k for k in params if not same(ema[k], student[k])]
    assert not differ, f"the EMA model differs from the loaded student: {differ[:3]}"


@pytest.mark.integration
def test_moco_with_sync_bn_sub_groups_builds_and_trains_on_two_processes(tmp_path) -> None:
    run_config(
        "test/integration_test/quick_moco",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
        "config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE=1",
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    final = _final(tmp_path)
    assert any(k.startswith("momentum_encoder.") for k in final["loss"])
    assert final["ema_model"]["model"]["trunk"]
