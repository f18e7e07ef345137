"""Weighted losses: ``{"loss": l, "loss_weight": w}`` trains on and logs ``sum(w l) / sum(w)``.

The step is driven directly on a built task whose data iterator yields hand-made batches
of uneven sizes. The model is a GroupNorm ResNet (no batch statistics), so a sample's
gradient does not depend on the batch it is in: with ``w`` = the micro-batch's size and a
per-sample-mean loss, accumulation must give the update of one batch of all the samples.
Tolerances: one SGD step at lr 0.05 moves a parameter by 0.05 * its gradient, and the
gradients of the two constructions differ by float32 summation order only (~1e-7).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests._tiny_run import tiny_config, train_in_process
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.state_update_hooks import GradClipHook
from vissl.losses import LOSS_REGISTRY, register_loss
from vissl.trainer.checkpointing import restore_mid_phase
from vissl.trainer.precision import GradScalerPrecision
from vissl.trainer.task import SelfSupervisionTask
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep, as_loss_weight
from vissl.utils.test_utils import spawn_gloo

LOSS = "test_weighted_cross_entropy"
COMMON = [
    "config.MODEL.TRUNK.RESNETS.NORM=GroupNorm",
    "config.MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS=4",
    "config.TEST_MODEL=False",
    "config.OPTIMIZER.num_epochs=1",
    f"config.LOSS.name={LOSS}",
]
TOL = 1e-6


class WeightedCrossEntropy(nn.Module):
    """Mean cross-entropy; ``mode`` picks what it returns.

    - ``plain``: the tensor; ``dict``: ``{"loss", "acc"}`` without a weight;
    - ``int`` / ``tensor``: ``{"loss", "loss_weight": n}``, n the batch size (a Python int,
      or a CPU tensor);
    - ``even``: the mean over the samples with an even label, weighted by their number
      (what a loss does with VISSL's ``data_valid``);
    - ``zero_first``: like ``int``, but the first batch of a step gets weight 0;
    - anything else: returned as the weight as is (bad weights).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.mode: Any = "int"
        self.calls = 0

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> Any:
        self.calls += 1
        if self.mode == "even":
            valid = (target % 2 == 0).float()
            n = valid.sum()
            per_sample = F.cross_entropy(output, target, reduction="none")
            # finite for a batch without valid samples: 0 * NaN would be NaN
            return {"loss": (per_sample * valid).sum() / n.clamp_min(1), "loss_weight": n}
        loss = F.cross_entropy(output, target)
        n = target.shape[0]
        if self.mode == "plain":
            return loss
        if self.mode == "dict":
            return {"loss": loss, "acc": (output.argmax(1) == target).float().mean()}
        weight: Any = {"int": n, "tensor": torch.tensor(n)}.get(self.mode, self.mode)
        if self.mode == "zero_first":
            weight = 0 if self.calls % 2 == 1 else n
        return {"loss": loss, "loss_weight": weight, "acc": loss.detach() * 0}


@pytest.fixture(scope="module", autouse=True)
def _registered_loss() -> Iterator[None]:
    register_loss(LOSS)(WeightedCrossEntropy)
    yield
    LOSS_REGISTRY.unregister(LOSS)


def _samples(sizes: Sequence[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
        for n in sizes
    ]


def _concat(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[Any, Any]:
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def _task(
    folder: Path,
    accumulation: int,
    init: dict[str, torch.Tensor] | None = None,
    hooks: Sequence[Any] = (),
    overrides: Sequence[str] = (),
) -> SelfSupervisionTask:
    cfg = tiny_config(
        folder,
        *COMMON,
        f"config.OPTIMIZER.GRAD_ACCUMULATION_STEPS={accumulation}",
        *overrides,
    )
    torch.manual_seed(0)
    task = SelfSupervisionTask(cfg, str(folder), torch.device("cpu"), hooks).build()
    if init is not None:
        task.base_model.load_state_dict(init)
    task.base_model.train()
    task.phase_idx = task.train_phase_idx = 0
    task.reset_phase_loss()
    return task


def _step(task: SelfSupervisionTask, batches: Sequence[Any], mode: str) -> SelfSupervisionTask:
    """One call of the standard step on ``batches`` (all consumed: ``k`` micro-batches)."""
    task.loss.mode = mode  # type: ignore[assignment]
    task.data_iterator = iter([{"data": [x], "label": [y]} for x, y in batches])
    StandardTrainStep()(task)
    task.iteration += 1
    return task


def _state(task: SelfSupervisionTask) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in task.base_model.state_dict().items()}


def _weighted_mean(pairs: Sequence[tuple[float, float]]) -> float:
    """``sum(w * loss) / sum(w)`` of ``(loss, w)`` pairs."""
    return sum(loss * w for loss, w in pairs) / sum(w for _, w in pairs)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


class LossScaledFp32(GradScalerPrecision):
    """fp16's GradScaler path (scaled backward, unscale before clipping) in fp32, on CPU."""

    def __init__(self) -> None:
        super().__init__("cpu", {"init_scale": 2.0**16})

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


@pytest.mark.parametrize(
    ("kind", "clip", "scaler"),
    [("int", False, False), ("tensor", True, False), ("int", True, True)],
    ids=["int", "tensor-clip", "int-clip-gradscaler"],
)
def test_uneven_weighted_accumulation_equals_one_batch(tmp_path, kind, clip, scaler):
    """3 micro-batches of 3, 5 and 2 samples weighted by size == one batch of 10."""
    micro = _samples([3, 5, 2])

    def task(name: str, accumulation: int, init: Any = None) -> SelfSupervisionTask:
        # A clip that binds: the weighted gradient must be normalised before it is clipped
        # (and, with the scaler, the factor must commute with its unscale).
        built = _task(tmp_path / name, accumulation, init, [GradClipHook(2, 0.5)] if clip else [])
        if scaler:
            built.precision = LossScaledFp32()
        return built

    big = task("big", 1)
    init = _state(big)
    _step(big, [_concat(micro)], "plain")
    weighted = _step(task("w", 3, init), micro, kind)
    control = _step(task("c", 3, init), micro, "plain")

    moved = _max_diff(_state(big), init)  # 1.3e-3 clipped, 3e-2 not
    assert moved > 1000 * TOL
    assert _max_diff(_state(weighted), _state(big)) < TOL  # measured: 1e-8 to 6e-8
    # Without weights the step averages the three micro-batch means: a sample of the
    # 2-sample batch weighs 2.5 times one of the 5-sample batch. Far from one batch.
    assert _max_diff(_state(control), _state(big)) > max(0.1 * moved, 100 * TOL)
    # Logged loss: the weighted mean, i.e. the big batch's mean (same starting weights).
    assert float(weighted.last_batch.loss) == pytest.approx(float(big.last_batch.loss), abs=1e-6)
    assert float(weighted.last_batch.loss_weight) == 10
    assert weighted.phase_average_loss() == pytest.approx(float(big.last_batch.loss), abs=1e-6)
    # Extra dict entries are still logged.
    assert "loss.acc" in weighted.additional_log_data


def test_zero_weight_micro_batch_contributes_nothing(tmp_path):
    micro = _samples([3, 5])
    big = _task(tmp_path / "big", 1)
    init = _state(big)
    _step(big, micro[1:], "plain")
    weighted = _step(_task(tmp_path / "w", 2, init), micro, "zero_first")
    assert _max_diff(_state(weighted), _state(big)) < TOL
    assert float(weighted.last_batch.loss) == pytest.approx(float(big.last_batch.loss), abs=1e-6)

    # A step whose total weight is 0: zero gradients, a finite logged loss of 0.
    task = _task(tmp_path / "z", 1, init)
    task.loss.calls = 0  # type: ignore[assignment]
    _step(task, micro[:1], "zero_first")
    assert float(task.last_batch.loss) == 0.0 and float(task.last_batch.loss_weight) == 0.0
    grads = [p.grad for p in task.base_model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)


def test_phase_average_is_weighted_over_steps(tmp_path):
    """Phase loss: sum over steps of the weighted sums / sum of the weights."""
    micro: list[tuple[float, float]] = []

    class Record(VisslHook):
        def on_loss_and_meter(self, task: SelfSupervisionTask) -> None:
            # one process: the logged micro-batch loss is this rank's loss
            micro.append((float(task.last_batch.loss), float(task.last_batch.loss_weight)))

    task = _task(tmp_path, 2, hooks=[Record()])
    logged = []
    for seed, sizes in enumerate([[3, 5], [6, 2]]):
        _step(task, _samples(sizes, seed), "even")
        logged.append(float(task.last_batch.loss))
    weights = [w for _, w in micro]
    assert len(micro) == 4 and 0 < sum(weights[:2]) and 0 < sum(weights[2:])
    assert logged[0] == pytest.approx(_weighted_mean(micro[:2]), abs=1e-6)
    assert logged[1] == pytest.approx(_weighted_mean(micro[2:]), abs=1e-6)
    expected = _weighted_mean(micro)
    assert task.phase_average_loss() == pytest.approx(expected, abs=1e-6)
    # An iteration checkpoint keeps (sum, total weight); a resumed phase has the same mean.
    total, count = task.phase_loss_state()
    assert count == pytest.approx(sum(weights))
    task.local_iteration_num = 2
    state = task.state_dict(phase_complete=False)
    resumed = _task(tmp_path / "resumed", 2)
    resumed.load_state_dict(state)
    restore_mid_phase(resumed)
    assert resumed.phase_loss_state() == (total, count)
    assert resumed.phase_average_loss() == task.phase_average_loss()


def test_a_weighted_step_reads_nothing_back_from_tensors(tmp_path, monkeypatch):
    """A Python-number weight: no ``.item()``/``float()``/... of a tensor during the step."""
    task = _task(tmp_path, 2, hooks=[GradClipHook(2, 0.5)])
    batches = [{"data": [x], "label": [y]} for x, y in _samples([3, 5])]
    task.data_iterator = iter(batches)
    task.loss.mode = "int"  # type: ignore[assignment]
    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counting(self: torch.Tensor, *a: Any, _n: str = name, _o: Any = original) -> Any:
            reads.append(_n)
            return _o(self, *a)

        monkeypatch.setattr(torch.Tensor, name, counting)
    StandardTrainStep()(task)
    monkeypatch.undo()
    assert reads == []
    assert float(task.last_batch.loss_weight) == 8


def test_logged_and_phase_losses_of_a_run_are_weighted(tmp_path):
    """End to end: stdout.json and metrics.json hold the weighted means."""
    micro: dict[int, list[tuple[float, float]]] = {}

    class Setup(VisslHook):
        def on_start(self, task: SelfSupervisionTask) -> None:
            task.loss.mode = "even"  # type: ignore[assignment]

        def on_loss_and_meter(self, task: SelfSupervisionTask) -> None:
            loss, weight = task.last_batch.loss, task.last_batch.loss_weight
            micro.setdefault(task.iteration + 1, []).append((float(loss), float(weight)))

    # 32 samples, batches of 8, 2 per step: 2 steps, both logged (LOG_FREQUENCY=2)
    cfg = tiny_config(tmp_path, *COMMON, "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=2")
    train_in_process(cfg, [Setup(), *default_hook_generator(cfg)])
    records = [json.loads(line) for line in (tmp_path / "stdout.json").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2]
    for r in records:
        assert len(micro[r["iteration"]]) == 2
        assert r["loss"] == pytest.approx(_weighted_mean(micro[r["iteration"]]), abs=1e-5)
    (metrics,) = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    expected = _weighted_mean(micro[1] + micro[2])
    assert metrics["train_loss"] == pytest.approx(expected, abs=1e-5)


def test_without_loss_weight_the_step_is_bitwise_the_unweighted_one(tmp_path):
    """No loss_weight: each micro-batch backpropagates loss / k, the logged loss is the
    mean of the micro-batch losses; checked to the bit against those formulas."""
    micro = _samples([3, 5, 2])
    task = _task(tmp_path / "step", 3)
    init = _state(task)
    ref = _task(tmp_path / "ref", 3, init)
    for mode in ("plain", "dict"):
        ref.base_model.load_state_dict(init)
        task.base_model.load_state_dict(init)
        task.optimizer.state.clear()
        ref.optimizer.state.clear()
        task.reset_phase_loss()
        _step(task, micro, mode)
        task.iteration -= 1

        ref.optimizer.zero_grad(set_to_none=True)
        losses = []
        for x, y in micro:
            loss = F.cross_entropy(ref.model(x)[0], y)
            (loss / 3).backward()
            losses.append(loss.detach())
        ref.param_schedulers.apply(ref.optimizer, ref.where, "step")
        ref.optimizer.step()

        for k, v in _state(ref).items():
            assert torch.equal(task.base_model.state_dict()[k], v), (mode, k)
        expected = losses[0].clone().add_(losses[1]).add_(losses[2]).div_(3)
        assert torch.equal(task.last_batch.loss, expected), mode
        assert task.last_batch.loss_weight is None
        assert task.phase_loss_state() == (float(expected), 1)
        assert task.phase_average_loss() == float(expected.item()) / 1


def _rank_step(
    rank: int,
    world_size: int,
    folder: str,
    manual: bool,
    init: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
) -> tuple[float, float, float, float]:
    # rank 0: micro-batches of 3 and 5 samples; rank 1: 4 and 1 (13 in all)
    sizes = [[3, 5], [4, 1]][rank]
    micro = _samples(sizes, seed=10 + rank)
    task = _task(
        Path(folder) / str(rank),
        2,
        init,
        overrides=[
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
            f"config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION={manual}",
        ],
    )
    assert task.grad_reducer.name == ("manual" if manual else "ddp")
    _step(task, micro, "int")
    return (
        _max_diff(_state(task), expected),
        float(task.last_batch.loss),
        float(task.last_batch.loss_weight),
        task.phase_average_loss(),
    )


@pytest.mark.parametrize("manual", [False, True], ids=["ddp", "manual"])
def test_two_ranks_with_different_weights_equal_one_process(tmp_path, manual):
    """Ranks of 8 and 5 samples, weighted by size: the update of one batch of 13."""
    big = _task(tmp_path / "big", 1)
    init = _state(big)
    _step(big, [_concat(_samples([3, 5], 10) + _samples([4, 1], 11))], "plain")
    results = spawn_gloo(_rank_step, 2, str(tmp_path), manual, init, _state(big))
    for diff, loss, weight, phase_loss in results:
        assert diff < TOL
        assert loss == pytest.approx(float(big.last_batch.loss), abs=1e-6)
        assert weight == 13
        assert phase_loss == pytest.approx(float(big.last_batch.loss), abs=1e-6)


def test_bad_weights_name_loss_weight(tmp_path):
    loss = torch.tensor(1.0)
    for bad, error in [
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (torch.tensor(-2.0), ValueError),
        ("3", TypeError),
        (True, TypeError),
        (None, TypeError),
        (torch.ones(2), TypeError),
    ]:
        with pytest.raises(error, match=r"returned loss_weight=.*loss_weight must be"):
            as_loss_weight(bad, loss, "MyLoss")
    assert float(as_loss_weight(torch.tensor(3), loss, "MyLoss")) == 3.0
    assert as_loss_weight(2.5, loss, "MyLoss").dtype == torch.float32

    task = _task(tmp_path, 2)
    with pytest.raises(ValueError, match=r"WeightedCrossEntropy returned loss_weight=-1"):
        _step(task, _samples([2, 2]), -1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"loss_weight='many' \(a str\)"):
        _step(task, _samples([2, 2]), "many")

    class HalfWeighted(nn.Module):
        """A weight for the first micro-batch only."""

        def __init__(self) -> None:
            super().__init__()
            self.first = True

        def forward(self, output: torch.Tensor, target: torch.Tensor) -> Any:
            loss = F.cross_entropy(output, target)
            first, self.first = self.first, False
            return {"loss": loss, "loss_weight": 2} if first else loss

    task.loss = HalfWeighted()
    task.data_iterator = iter([{"data": [x], "label": [y]} for x, y in _samples([2, 2])])
    with pytest.raises(ValueError, match="loss_weight for some micro-batches"):
        StandardTrainStep()(task)
