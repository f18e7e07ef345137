"""MAE end to end: the quick config runs unchanged through the CLI (the encoder on the
visible patches, the decoder, the loss falling from its start); a crash (and, with
``-m slow``, a real SIGKILL through the CLI) plus auto-resume ends bitwise equal to an
uninterrupted run: the resumed steps draw the same crops and the same masks from (seed,
epoch, index)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration._runs import crash_and_resume_states, read_jsonl
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli
from tests.integration.test_quick_vicreg import assert_bitwise_equal

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_mae"
QUICK = "test/integration_test/" + NAME


def test_quick_mae_runs_unchanged(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    assert state["heads.0.mask_token"].shape == (1, 1, 16)
    assert state["heads.0.decoder_pred.weight"].shape == (4 * 4 * 3, 16)  # pixels per patch
    assert not any(k.startswith("loss.") for k in state)  # a stateless loss
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    losses = [r["loss"] for r in records]
    # normalised pixels: about 1 + the prediction's variance at the start
    assert all(math.isfinite(v) and 0.3 < v < 3 for v in losses)
    assert losses[-1] < losses[0]


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    crash_and_resume_states(tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8)


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}", *RESUME], iteration=7)
    assert_bitwise_equal(final_state(full), final_state(killed))
