"""MoCo v3 end to end: both quick configs (ResNet, and ViT with the frozen random patch
projection) run unchanged through the CLI; the checkpoint holds the momentum encoder (the
model less its predictor); the ViT's patch projection is the same, untrained, in the model
and the encoder, from the first checkpoint to the last; a crash (and, with ``-m slow``, a
real SIGKILL through the CLI) plus auto-resume ends bitwise equal to an uninterrupted run
(model, predictor and momentum encoder)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli
from vissl.utils.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

QUICK = "test/integration_test/"
PATCH = ("trunk.patch_embed.proj.weight", "trunk.patch_embed.proj.bias")


def assert_momentum_encoder(state: dict[str, torch.Tensor]) -> None:
    """The checkpoint's momentum encoder is the model less its predictor, and lags."""
    model = {k: v for k, v in state.items() if not k.startswith("loss.")}
    encoder = {
        k.removeprefix("loss.target_network."): v
        for k, v in state.items()
        if k.startswith("loss.target_network.")
    }
    predictor = {k for k in model if k.startswith("heads.1.")}
    assert predictor  # the model has its predictor...
    assert encoder.keys() == model.keys() - predictor  # ...the encoder has all but it
    floats = [k for k in encoder if encoder[k].is_floating_point() and "running" not in k]
    assert any(not torch.equal(encoder[k], model[k]) for k in floats)  # it lags


def _phase0_model(folder: Path) -> dict[str, torch.Tensor]:
    classy = load_checkpoint(str(folder / "model_phase0.torch"))["classy_state_dict"]
    return {f"trunk.{k}": v for k, v in classy["base_model"]["model"]["trunk"].items()}


@pytest.mark.parametrize("name", ["moco_v3", "moco_v3_vit"])
def test_quick_config_runs_unchanged(tmp_path: Path, name: str) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}quick_{name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / f"quick_{name}"
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    # each term is 2 tau x a cross entropy over 8 keys: about 2 tau ln 8 at the start
    tau = 1.0 if name == "moco_v3" else 0.2
    for r in records:
        assert math.isfinite(r["loss"])
        assert 0 < r["loss"] < 2 * (2 * tau * math.log(8)) * 1.5
    state = final_state(folder)
    assert_momentum_encoder(state)
    if name == "moco_v3_vit":
        start = _phase0_model(folder)
        for key in PATCH:
            assert torch.equal(state[key], state[f"loss.target_network.{key}"])
            assert torch.equal(state[key], start[key])  # never trained
        moved = "trunk.blocks.0.attn.qkv.weight"
        assert not torch.equal(state[moved], start[moved])
        assert "FREEZE_PATCH_EMBED" in proc.stderr + proc.stdout


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def assert_bitwise_equal(full: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor]) -> None:
    assert full.keys() == resumed.keys()
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moco_v3", "moco_v3_vit"])
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path, name: str) -> None:
    """A crash right after iteration 7 (the iteration checkpoint at 6 is inside phase 1),
    then auto-resume: model, predictor and momentum encoder as if never stopped."""
    config = QUICK + f"quick_{name}"
    run_config(config, *RESUME, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    assert not list(crashed.glob("model_final*"))
    run_config(config, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    full = final_state(tmp_path / "full")
    assert_momentum_encoder(full)
    assert_bitwise_equal(full, final_state(crashed))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moco_v3", "moco_v3_vit"])
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path, name: str) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(
        tmp_path, [f"config={QUICK}quick_{name}", *RESUME], iteration=7
    )
    assert_bitwise_equal(final_state(full), final_state(killed))
