"""Loss-scale stress of the masked-image methods (MAE, iBOT, DINOv2, I-JEPA, MSN).

fp16 training multiplies the loss by a large scale (GradScaler: 2**16 at the start, more
as it grows) so that small gradients survive the fp16 backward; bf16 needs no scaling,
but a loss that is scaled anyway must give the same gradients. For each method's quick
config, one real step through the trainer (its collator, masks, EMA teacher hooks) under
bf16 autocast backpropagates the loss at the scales 2**16, 2**20 and 2**24 as well: the
gradients are finite and, divided by the scale, equal the unscaled loss's gradients to
bf16 precision (a power-of-two scale is exact in bf16, so any gap would be an overflow,
an underflow or a scale-dependent op in the loss).

Then a run through the trainer with fp16 autocast and a GradScaler that starts at 2**32
(our AMP config gives fp16 with a GradScaler on CUDA only and bf16 on a CPU, so the test
builds the fp16 precision for the CPU itself; torch runs fp16 autocast and GradScaler on a
CPU): the first steps overflow and are skipped (the weights do not move), the scale backs
off until a step is taken, the weights never hold NaN or inf, and the run finishes.

In the default run: MSN, MAE and I-JEPA (a prototype softmax against an EMA target, a
pixel regression, a regression on an EMA target's features; about 10 s on 2 cores); iBOT
and DINOv2 (self-distillation, like MSN's) with ``-m slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import vissl.trainer.task as task_module
from tests.integration._runs import read_jsonl, run_config
from vissl.hooks import VisslHook, default_hook_generator
from vissl.trainer.precision import AutocastPrecision, GradScalerPrecision

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

SCALES = (2.0**16, 2.0**20, 2.0**24)
ONE_STEP = [  # one step of 8 images, one process
    "config.DATA.TRAIN.DATA_LIMIT=8",
    "config.OPTIMIZER.num_epochs=1",
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
]


class StressedBf16(AutocastPrecision):
    """bf16 autocast; its first backward also takes the gradients of the scaled losses."""

    def __init__(self) -> None:
        super().__init__("cpu", torch.bfloat16)
        self.params: list[torch.nn.Parameter] = []
        #: scale -> (all finite, the largest |g / scale - g| over max |g|)
        self.report: dict[float, tuple[bool, float]] = {}
        self.loss_dtype: torch.dtype | None = None

    def backward(self, loss: torch.Tensor) -> None:
        if not self.report:
            self.loss_dtype = loss.dtype
            params = [p for p in self.params if p.requires_grad]
            plain = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            pairs = [(i, g) for i, g in enumerate(plain) if g is not None]
            assert pairs, "no parameter has a gradient"
            top = max(float(g.abs().max()) for _, g in pairs)
            assert top > 0
            for scale in SCALES:  # measured: a gap of 0 for the five methods (bitwise)
                scaled = torch.autograd.grad(
                    loss * scale, params, retain_graph=True, allow_unused=True
                )
                finite = all(torch.isfinite(scaled[i]).all() for i, _ in pairs)
                gap = max(float((scaled[i] / scale - g).abs().max()) for i, g in pairs)
                self.report[scale] = (finite, gap / top)
        loss.backward()


class BindParams(VisslHook):
    """Hands the model's parameters to the precision before the first step."""

    def __init__(self, precision: StressedBf16) -> None:
        self.precision = precision

    def on_start(self, task: Any) -> None:
        self.precision.params = list(task.base_model.parameters())


METHODS = [
    "quick_msn",
    "quick_mae",
    "quick_ijepa",
    pytest.param("quick_ibot", marks=pytest.mark.slow),
    pytest.param("quick_dinov2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", METHODS)
def test_scaled_bf16_loss_gives_the_unscaled_gradients(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    precision = StressedBf16()
    monkeypatch.setattr(task_module, "build_precision", lambda *args: precision)
    run_config(
        f"test/integration_test/{name}",
        *ONE_STEP,
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), BindParams(precision)],
    )
    assert precision.loss_dtype == torch.float32  # the losses reduce in float32
    assert set(precision.report) == set(SCALES)
    for scale, (finite, gap) in precision.report.items():
        assert finite, f"{name}: inf/NaN gradients at loss scale {scale:g}"
        # bf16 keeps 8 bits: 2**-8 of the largest gradient bounds a rounding difference
        assert gap <= 2.0**-8, f"{name}: scale {scale:g} changes the gradients by {gap:.3g}"


class ScalerLog(VisslHook):
    """Per step: the scale used, whether the weights moved, whether they are finite."""

    priority = 90

    def __init__(self) -> None:
        self.steps: list[tuple[float, bool, bool]] = []
        self.before: list[torch.Tensor] = []

    def on_forward(self, task: Any) -> None:
        self.before = [p.detach().clone() for p in task.base_model.parameters()]
        self.scale = float(task.precision.grad_scaler.get_scale())

    def on_update(self, task: Any) -> None:
        params = list(task.base_model.parameters())
        moved = any(not torch.equal(a, p) for a, p in zip(self.before, params))
        finite = all(torch.isfinite(p).all() for p in params)
        self.steps.append((self.scale, moved, finite))


def test_fp16_grad_scaler_at_2_to_the_32_skips_backs_off_and_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quick_msn, 12 steps of 2 images; the scaler divides its scale by 16 per overflow
    (torch's default halves it: too many skipped steps for a short test). MSN's gradients
    overflow fp16 down to a scale of 2**12 (at init the head's L2 normalisation of a small
    projection magnifies them), so the first step is taken at 2**8."""
    monkeypatch.setattr(
        task_module,
        "build_precision",
        lambda *args: GradScalerPrecision("cpu", {"init_scale": 2.0**32, "backoff_factor": 1 / 16}),
    )
    log = ScalerLog()
    run_config(
        "test/integration_test/quick_msn",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
        "config.DATA.TRAIN.DATA_LIMIT=24",
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), log],
    )
    scales = [scale for scale, _, _ in log.steps]
    moved = [m for _, m, _ in log.steps]
    assert len(log.steps) == 12 and all(finite for _, _, finite in log.steps)
    assert not moved[0] and scales[0] == 2.0**32  # overflow: the step is skipped
    first = moved.index(True)  # the scale backs off until a step is taken ...
    assert scales[: first + 1] == [2.0**32 / 16**k for k in range(first + 1)]
    assert 1 <= first <= 8
    assert all(moved[first:]) and set(scales[first:]) == {scales[first]}  # ... and stays
    records = read_jsonl(str(tmp_path / "stdout.json"))
    assert [r["iteration"] for r in records] == list(range(1, 13))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
