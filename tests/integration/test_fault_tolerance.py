"""Fault tolerance: SIGTERM, NaN, truncated checkpoints, pickled checkpoints, weights init,
keep-last-N."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.integration._runs import REPO, run_config
from vissl.errors import ConfigError, TrainingPreempted
from vissl.hooks import VisslHook, default_hook_generator
from vissl.losses import register_loss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from vissl.utils.checkpoint import list_checkpoints, load_checkpoint

TINY = "test/cpu_test/tiny_simclr"


@pytest.mark.integration
@pytest.mark.parametrize("to", [pytest.param("process", marks=pytest.mark.slow), "process group"])
def test_sigterm_saves_a_checkpoint_and_exits_with_the_documented_code(tmp_path, to):
    """SIGTERM to the process, or to its whole process group as `timeout`, `kill -- -PGID`
    and SLURM's scancel send it: the data loader workers get it too, and must not die."""
    folder = tmp_path / "run"
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "run_distributed_engines.py"),
        f"config={TINY}",
        "config.DATA.TRAIN.DATA_LIMIT=400",
        "config.LOG_FREQUENCY=1",
        "config.CHECKPOINT.AUTO_RESUME=True",
        "config.DATA.NUM_DATALOADER_WORKERS=1",
        f"config.CHECKPOINT.DIR={folder}",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=to == "process group",
    )
    deadline = time.monotonic() + 120
    while not (folder / "stdout.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if to == "process group":
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == TrainingPreempted.exit_code == 75, out[-2000:]
    ckpts = list_checkpoints(str(folder))
    assert ckpts and ckpts[-1][0] == "iteration", ckpts
    state = load_checkpoint(str(folder / "checkpoint.torch"))
    assert state["classy_state_dict"]["phase_complete"] is False
    assert "SIGTERM received" in out


@register_loss("test_poisonable_simclr")
class PoisonableSimclr(SimclrInfoNCELoss):
    """SimCLR whose loss becomes NaN once ``poison`` is set (by the hook below)."""

    poison = False

    def forward(self, output, target=None):
        loss = super().forward(output, target)
        return loss * float("nan") if self.poison else loss


class InjectNaN(VisslHook):
    """Poison the loss from iteration k on."""

    def __init__(self, k: int):
        self.k = k

    def on_forward(self, task):
        task.loss.poison = task.train and task.iteration + 1 >= self.k


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("k", [pytest.param(6, marks=pytest.mark.slow), 7])
def test_nan_at_step_k_names_k_and_keeps_a_finite_checkpoint(tmp_path, k):
    with pytest.raises(FloatingPointError, match=f"non-finite loss nan at train iteration {k} "):
        run_config(
            TINY,
            "config.LOSS.name=test_poisonable_simclr",
            "config.LOG_FREQUENCY=4",
            "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
            f"config.CHECKPOINT.DIR={tmp_path}",
            hook_generator=lambda cfg: [*default_hook_generator(cfg), InjectNaN(k)],
        )
    assert (tmp_path / "rank0_model_output.pth").exists() and (
        tmp_path / "rank0_input_sample.pth"
    ).exists()
    newest = load_checkpoint(str(tmp_path / "checkpoint.torch"))
    assert newest["iteration"] < k
    model = newest["classy_state_dict"]["base_model"]["model"]
    for part in ("trunk", "heads"):
        for name, t in model[part].items():
            if t.is_floating_point():
                assert torch.isfinite(t).all(), name


@pytest.mark.integration
def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    with pytest.raises(RuntimeError, match="stop here"):
        run_config(
            TINY,
            "config.OPTIMIZER.num_epochs=2",
            "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
            f"config.CHECKPOINT.DIR={tmp_path}",
            hook_generator=lambda cfg: [*default_hook_generator(cfg), StopAt(7)],
        )
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names[-1] == "model_iteration6.torch", names
    newest = tmp_path / names[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])
    import logging

    with caplog.at_level(logging.WARNING):
        logging.getLogger("vissl").propagate = True
        task = run_config(
            TINY,
            "config.OPTIMIZER.num_epochs=2",
            "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
            "config.CHECKPOINT.AUTO_RESUME=True",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    assert task.iteration == 8
    # The resume choice skips the unreadable file, says so, and takes the previous one.
    assert "['model_iteration6.torch']" in caplog.text and "cannot be read" in caplog.text
    text = (tmp_path / "log.txt").read_text()
    assert f"resuming from {tmp_path / 'model_phase0.torch'}" in text


class StopAt(VisslHook):
    priority = 1000

    def __init__(self, iteration):
        self.iteration = iteration

    def on_step(self, task):
        if task.train and task.iteration == self.iteration:
            raise RuntimeError("stop here")


@pytest.mark.integration
def test_keep_last_n_checkpoints(tmp_path):
    run_config(
        TINY,  # 8 steps: iteration checkpoints 2, 4 (phase 0), 6 and the final one
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
        "config.CHECKPOINT.KEEP_LAST_N_CHECKPOINTS=2",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    kinds = [(k, n) for k, _, n in list_checkpoints(str(tmp_path))]
    assert len([k for k, _ in kinds if k != "final"]) == 2
    assert kinds[-1][0] == "final"


@pytest.mark.integration
def test_weights_init_from_our_checkpoint_and_from_a_plain_state_dict(tmp_path):
    src = tmp_path / "src"
    run_config(TINY, "config.OPTIMIZER.num_epochs=1", f"config.CHECKPOINT.DIR={src}")
    (final,) = src.glob("model_final*.torch")
    trunk = load_checkpoint(str(final))["classy_state_dict"]["base_model"]["model"]["trunk"]

    class Capture(VisslHook):
        def on_start(self, task):
            self.trunk = {k: v.clone() for k, v in task.base_model.trunk.state_dict().items()}

    cap = Capture()
    run_config(
        TINY,
        "config.OPTIMIZER.num_epochs=1",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={final}",
        f"config.CHECKPOINT.DIR={tmp_path / 'a'}",
        hook_generator=lambda cfg: [cap],
    )
    loaded = [k for k in trunk if not k.endswith("num_batches_tracked")]  # default SKIP_LAYERS
    assert all(torch.equal(cap.trunk[k], trunk[k]) for k in loaded)

    # A torchvision-style plain state dict of the trunk, with a prefix to add.
    plain = tmp_path / "plain.torch"
    torch.save({k: v for k, v in trunk.items()}, plain)
    cap2 = Capture()
    run_config(
        TINY,
        "config.OPTIMIZER.num_epochs=1",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={plain}",
        "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=''",
        "config.MODEL.WEIGHTS_INIT.APPEND_PREFIX=trunk.",
        f"config.CHECKPOINT.DIR={tmp_path / 'b'}",
        hook_generator=lambda cfg: [cap2],
    )
    assert all(torch.equal(cap2.trunk[k], trunk[k]) for k in loaded)

    # Without the prefix the file is recognised as the trunk's own names and prefixed.
    cap3 = Capture()
    run_config(
        TINY,
        "config.OPTIMIZER.num_epochs=1",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={plain}",
        "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=''",
        f"config.CHECKPOINT.DIR={tmp_path / 'c'}",
        hook_generator=lambda cfg: [cap3],
    )
    assert all(torch.equal(cap3.trunk[k], trunk[k]) for k in loaded)

    # Names in no layout we know: an error that lists the missing keys.
    odd = tmp_path / "odd.torch"
    torch.save({"encoder." + k: v for k, v in trunk.items()}, odd)
    with pytest.raises(ConfigError, match="missing in the file") as info:
        run_config(
            TINY,
            "config.OPTIMIZER.num_epochs=1",
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={odd}",
            "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=''",
            f"config.CHECKPOINT.DIR={tmp_path / 'd'}",
        )
    assert "trunk._feature_blocks" in str(info.value) and "APPEND_PREFIX" in str(info.value)
