"""Hooks that guard or modify training state: NaN/Inf loss check, gradient clipping."""

from __future__ import annotations

import logging
from typing import Any

import torch

from vissl.hooks.base import Priority, VisslHook

logger = logging.getLogger(__name__)


class CheckNanLossHook(VisslHook):
    """Raise ``FloatingPointError`` naming the iteration when the loss is NaN or Inf.

    The finiteness of each step's loss is written into a small device buffer (no host
    read); the buffer is read every LOG_FREQUENCY iterations and at phase end, before any
    checkpoint is written (this hook runs early at phase end).
    """

    priority = Priority.HIGHEST

    def __init__(self, window: int = 10) -> None:
        self.window = max(1, int(window))
        self._flags: torch.Tensor | None = None
        self._losses: torch.Tensor | None = None
        self._iters: list[int] = []
        self._phases: list[int] = []

    def _buffers(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._flags is None or self._flags.device != device:
            self._flags = torch.ones(self.window, dtype=torch.bool, device=device)
            self._losses = torch.zeros(self.window, dtype=torch.float32, device=device)
        assert self._losses is not None
        return self._flags, self._losses

    def on_step(self, task: Any) -> None:
        loss = task.last_batch.loss if task.last_batch is not None else None
        if loss is not None:
            flags, losses = self._buffers(loss.device)
            slot = len(self._iters)
            if slot >= self.window:  # should not happen: we check every window steps
                self.check(task)
                slot = 0
            flags[slot].copy_(torch.isfinite(loss.detach()).all())
            losses[slot].copy_(loss.detach().float().reshape(()))
            self._iters.append(task.iteration if task.train else task.local_iteration_num)
            self._phases.append(task.phase_idx)
        if task.is_log_iteration or len(self._iters) >= self.window:
            self.check(task)

    def on_phase_end(self, task: Any) -> None:
        self.check(task)

    def check(self, task: Any) -> None:
        """Read the buffered flags; raise on the first non-finite loss."""
        n = len(self._iters)
        if n == 0 or self._flags is None or self._losses is None:
            return
        flags = self._flags[:n].tolist()
        if not all(flags):
            first = flags.index(False)
            value = float(self._losses[first].item())
            iteration, phase = self._iters[first], self._phases[first]
            kind = "train" if task.train else "test"
            raise FloatingPointError(
                f"non-finite loss {value} at {kind} iteration {iteration} (phase {phase}). "
                "Lower the learning rate (config.OPTIMIZER.param_schedulers.lr), check the "
                "data, or set config.HOOKS.CHECK_NAN=False to train on anyway."
            )
        self._flags.fill_(True)
        self._iters.clear()
        self._phases.clear()


class GradClipHook(VisslHook):
    """Clip the gradient norm after backward (MODEL.GRAD_CLIP), unscaling first under fp16."""

    def __init__(self, norm_type: float | str = 2, max_norm: float = 1.0) -> None:
        self.norm_type = float("inf") if str(norm_type) == "inf" else float(norm_type)
        self.max_norm = float(max_norm)

    def on_backward(self, task: Any) -> None:
        task.precision.unscale_(task.optimizer)
        params = [p for p in task.base_model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type)
