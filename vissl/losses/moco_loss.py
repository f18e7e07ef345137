"""``moco_loss``: MoCo v2's InfoNCE against a queue of momentum-encoded keys.

For each query ``q`` (the model's normalised head output on view 0) the positive is the
key ``k`` of the same image (the momentum encoder's normalised output on view 1,
``sample["data_momentum"]``) and the negatives are the ``queue_size`` keys of earlier
batches::

    loss = mean_i CE([q_i . k_i, q_i . queue_0, ..., q_i . queue_{K-1}] / T, label 0)

After the loss, the keys of the whole global batch (gathered from every rank, in rank
order) replace the oldest entries of the queue, so every rank holds the same queue.

The momentum encoder is a copy of the model made once (``bind_model``), never trained:
after each optimizer step its parameters follow the model's,
``theta_k = m * theta_k + (1 - m) * theta_q`` (:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`).
The loss's ``teacher_loss_inputs`` computes the keys with "shuffle BN": the key batch is permuted across ranks
(a permutation drawn on rank 0 and broadcast) before the momentum encoder, and put back in
order after, so BatchNorm statistics cannot reveal which key matches a query.

The encoder and the queue are in the loss's ``state_dict``, hence in checkpoints, and
resume exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from vissl.config.params import IntAtLeast, Positive, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import head_output_dim
from vissl.losses.teacher_hooks import DrivenByMomentumTeacherHook
from vissl.models.momentum import (
    MomentumTeacher,
    MomentumTeacherOwner,
    TeacherStep,
    build_momentum_schedule,
)
from vissl.utils.distributed import gather_from_all, get_rank, get_world_size

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.moco_loss"


@dataclass(kw_only=True, frozen=True)
class MoCoParams:
    """``config.LOSS.moco_loss`` (MoCo v2's values; ``embedding_dim`` is derived from
    the head)."""

    embedding_dim: Annotated[int, IntAtLeast(1)] = 128
    queue_size: Annotated[int, IntAtLeast(1)] = 65536
    momentum: Annotated[float, Unit] = 0.999
    temperature: Annotated[float, Positive] = 0.2
    shuffle_batch: bool = True


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


@register_loss("moco_loss")
class MoCoLoss(DrivenByMomentumTeacherHook, MomentumTeacherOwner, nn.Module):
    """MoCo v2 loss with its queue and momentum encoder.

    Args:
        embedding_dim: width of the head output (the keys).
        queue_size: number of keys kept as negatives.
        momentum: EMA factor of the momentum encoder, in [0, 1].
        temperature: the logits' temperature ``T`` (> 0).
        shuffle_batch: shuffle the key batch across ranks (shuffle BN).
    """

    Params = MoCoParams

    def __init__(
        self,
        embedding_dim: int = MoCoParams.embedding_dim,
        queue_size: int = MoCoParams.queue_size,
        momentum: float = MoCoParams.momentum,
        temperature: float = MoCoParams.temperature,
        shuffle_batch: bool = MoCoParams.shuffle_batch,
    ) -> None:
        super().__init__()
        p = parse(
            MoCoParams,
            {
                "embedding_dim": embedding_dim,
                "queue_size": queue_size,
                "momentum": momentum,
                "temperature": temperature,
                "shuffle_batch": shuffle_batch,
            },
            _KEY,
        )
        self.embedding_dim = p.embedding_dim
        self.queue_size = p.queue_size
        self.momentum = p.momentum
        self.temperature = p.temperature
        self.shuffle_batch = p.shuffle_batch
        queue = F.normalize(torch.randn(self.queue_size, self.embedding_dim), dim=1)
        self.register_buffer("queue", queue)
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.queue: torch.Tensor
        self.queue_ptr: torch.Tensor

    @classmethod
    def infer_config(cls, params: Any, config: Mapping[str, Any]) -> None:
        """Embedding width from the head; check the queue against the global batch.

        Raises:
            ConfigError: ``queue_size`` is not a multiple of the global batch.
        """
        head_dim = head_output_dim(config)
        if head_dim is not None and params.get("embedding_dim") != head_dim:
            logger.info(
                "%s.embedding_dim set to %d, the head's output width (was %s)",
                _KEY,
                head_dim,
                params.get("embedding_dim"),
            )
            params["embedding_dim"] = head_dim
        batch = int(config["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"]) * get_world_size()
        queue_size = params.get("queue_size", 65536)
        if isinstance(queue_size, int) and not isinstance(queue_size, bool) and queue_size > 0:
            if queue_size % batch != 0:
                lower = max(batch, queue_size // batch * batch)
                raise ConfigError(
                    f"{_KEY}.queue_size={queue_size} is not a multiple of the global batch "
                    f"{batch} (config.DATA.TRAIN.BATCHSIZE_PER_REPLICA x {get_world_size()} "
                    f"processes): each step enqueues one global batch of keys. Use e.g. "
                    f"{lower} or {lower + batch}.",
                    f"{_KEY}.queue_size",
                )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> MoCoLoss:
        return cls(**vars(parse(MoCoParams, params, _KEY)))

    #: the copy's checkpoint key (VISSL's name); ``loss.teacher`` in code
    teacher_state_key = "momentum_encoder"
    #: the encoder follows the loss's train / eval mode (BatchNorm on the key batch)
    teacher_mode = False

    def momentum_schedule(self) -> ParamScheduler:
        """MoCo v2's constant EMA factor."""
        return build_momentum_schedule("constant", self.momentum)

    def bind_model(self, model: nn.Module) -> None:
        """Make the momentum encoder: a frozen copy of ``model``."""
        self.attach_teacher(MomentumTeacher(model, self.momentum_schedule(), teacher_mode=False))

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The keys: the momentum encoder's L2-normalised output on
        ``sample["data_momentum"]`` (shuffled across ranks with ``shuffle_batch``), and
        whether to enqueue them (train phases)."""
        if "data_momentum" not in sample:
            raise KeyError(
                "moco_loss needs the key views in the batch's 'data_momentum' entry: set "
                "config.DATA.TRAIN.COLLATE_FUNCTION: moco_collator."
            )
        teacher = self.momentum_teacher
        assert teacher is not None
        x = sample["data_momentum"]
        if isinstance(x, list | tuple):
            x = x[0]
        if step.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        shuffle = self.shuffle_batch and get_world_size() > 1
        if shuffle:
            x, unshuffle = shuffle_across_ranks(x)
        out = teacher(x)
        if isinstance(out, list | tuple):
            out = out[0]
        key = F.normalize(out.float(), dim=1)
        if shuffle:
            key = unshuffle_across_ranks(key, unshuffle)
        return {"teacher_output": key, "enqueue": step.train}

    @torch.no_grad()
    def dequeue_and_enqueue(self, keys: torch.Tensor) -> None:
        """Replace the oldest queue entries by ``keys`` of every rank (rank order)."""
        keys = gather_from_all(keys.detach())
        n = keys.shape[0]
        index = (self.queue_ptr + torch.arange(n, device=keys.device)) % self.queue_size
        self.queue.index_copy_(0, index, keys.to(self.queue.dtype))
        self.queue_ptr.copy_((self.queue_ptr + n) % self.queue_size)

    def forward(
        self,
        output: torch.Tensor | Sequence[torch.Tensor],
        target: Any = None,
        *,
        teacher_output: torch.Tensor | None = None,
        enqueue: bool = True,
    ) -> torch.Tensor:
        """InfoNCE of this rank's queries; ``target`` is ignored.

        Args:
            output: ``(B, D)`` head output on the query views (or a list holding it).
            target: unused.
            teacher_output: ``(B, D)`` the keys: the momentum encoder's L2-normalised
                output on the key views.
            enqueue: put the keys in the queue after the loss (train phases).
        """
        if not isinstance(output, torch.Tensor):
            outputs = list(output)
            if len(outputs) != 1:
                raise ValueError(f"moco_loss expects one output tensor, got {len(outputs)}.")
            output = outputs[0]
        if output.ndim != 2 or output.shape[1] != self.embedding_dim:
            raise ConfigError(
                f"{_KEY}.embedding_dim is {self.embedding_dim} but the model outputs shape "
                f"{tuple(output.shape)}; set it to the head's last dim.",
                f"{_KEY}.embedding_dim",
            )
        key = self.given_teacher_output(teacher_output, "moco_loss")
        if key.shape != output.shape:
            raise ValueError(
                f"moco_loss: {tuple(key.shape)} keys for {tuple(output.shape)} queries."
            )
        query = F.normalize(output.float(), dim=1)
        key = key.float()
        positive = (query * key).sum(dim=1, keepdim=True)
        negative = query @ self.queue.clone().t()
        logits = torch.cat([positive, negative], dim=1) / self.temperature
        labels = torch.zeros(query.shape[0], dtype=torch.long, device=query.device)
        loss = F.cross_entropy(logits, labels)
        if enqueue:
            self.dequeue_and_enqueue(key)
        return loss

    def extra_repr(self) -> str:
        return (
            f"queue_size={self.queue_size}, embedding_dim={self.embedding_dim}, "
            f"momentum={self.momentum}, temperature={self.temperature}, "
            f"shuffle_batch={self.shuffle_batch}"
        )
