"""``MoCoHook``: the momentum encoder's keys (with shuffle BN) and its EMA update.

Declared by ``moco_loss`` through ``required_hooks()``; nothing checks the loss's name.

- ``on_forward`` (train phases): encode ``sample["data_momentum"]`` with the momentum
  encoder, without gradients, into ``loss.key`` (L2-normalised). With several processes
  and ``shuffle_batch``, the global key batch is permuted before encoding and restored
  after (:func:`shuffle_across_ranks`), so each rank's BatchNorm sees a random sub-batch.
- ``on_update``: after each optimizer step the encoder follows the model,
  ``theta_k = m * theta_k + (1 - m) * theta_q`` (so the keys of step t are encoded with
  the parameters MoCo's own loop would use: updated from the model after step t - 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import ema_update_
from vissl.utils.distributed import gather_from_all, get_rank, get_world_size

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask


@torch.no_grad()
def shuffle_across_ranks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the global batch after a random permutation.

    The permutation is drawn on rank 0 (from the torch RNG of ``x``'s device) and
    broadcast, so every rank agrees. Every rank must hold the same number of rows.

    Returns:
        ``(shuffled_local, unshuffle)``: pass the encoder's output on ``shuffled_local``
        and ``unshuffle`` to :func:`unshuffle_across_ranks`.
    """
    world = get_world_size()
    rows = x.shape[0]
    gathered = gather_from_all(x)
    if gathered.shape[0] != rows * world:
        raise RuntimeError(
            f"shuffle BN needs the same batch on every rank; got {gathered.shape[0]} rows "
            f"from {world} ranks of {rows} here."
        )
    if get_rank() == 0:
        permutation = torch.randperm(gathered.shape[0], device=x.device)
    else:
        permutation = torch.empty(gathered.shape[0], dtype=torch.long, device=x.device)
    dist.broadcast(permutation, src=0)
    mine = permutation.view(world, rows)[get_rank()]
    return gathered[mine], torch.argsort(permutation)


@torch.no_grad()
def unshuffle_across_ranks(y: torch.Tensor, unshuffle: torch.Tensor) -> torch.Tensor:
    """Undo :func:`shuffle_across_ranks` on the encoder's output ``y``: this rank's rows."""
    gathered = gather_from_all(y)
    rows = y.shape[0]
    mine = unshuffle.view(get_world_size(), rows)[get_rank()]
    return gathered[mine]


class MoCoHook(VisslHook):
    """Keys and EMA updates for ``moco_loss`` (see the module docstring).

    Args:
        loss: the :class:`~vissl.losses.moco_loss.MoCoLoss` whose encoder this drives.
    """

    priority = Priority.HIGH

    def __init__(self, loss: Any) -> None:
        self.loss = loss

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        loss.enqueue = task.train
        encoder = loss.momentum_encoder
        if encoder is None:
            raise RuntimeError("moco_loss.bind_model was not called: no momentum encoder.")
        sample = task.last_batch.sample
        if "data_momentum" not in sample:
            raise KeyError(
                "moco_loss needs the key views in the batch's 'data_momentum' entry: set "
                "config.DATA.TRAIN.COLLATE_FUNCTION: moco_collator."
            )
        x = sample["data_momentum"]
        if isinstance(x, list | tuple):
            x = x[0]
        if task.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        shuffle = loss.shuffle_batch and get_world_size() > 1
        with torch.no_grad():
            if shuffle:
                x, unshuffle = shuffle_across_ranks(x)
            out = encoder(x)
            if isinstance(out, list | tuple):
                out = out[0]
            key = F.normalize(out.float(), dim=1)
            if shuffle:
                key = unshuffle_across_ranks(key, unshuffle)
        loss.key = key

    def on_update(self, task: SelfSupervisionTask) -> None:
        assert self.loss.momentum_encoder is not None
        ema_update_(self.loss.momentum_encoder, task.base_model, self.loss.momentum)
