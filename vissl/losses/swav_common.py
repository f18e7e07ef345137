"""What ``swav_loss`` and ``swav_momentum_loss`` share: distributed Sinkhorn-Knopp, the
swapped-prediction cross entropy, the per-rank embedding queue, parameter checks and
VISSL's config inference.

Layout of the head output (``swav_head``): ``[embedding, scores_0, scores_1, ...]``, rows
crop-major (row ``c * B + i`` is crop ``c`` of sample ``i``), ``B`` samples per rank.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.errors import ConfigError
from vissl.losses.config_inference import find_head_params, transform_num_crops
from vissl.utils.distributed import all_reduce_max, all_reduce_sum, get_world_size

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- Sinkhorn
@torch.no_grad()
def distributed_sinkhorn(
    scores: torch.Tensor,
    epsilon: float,
    num_iters: int,
    use_double_precision: bool = False,
    num_samples: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """SwAV's codes: Sinkhorn-Knopp on ``exp(scores / epsilon)`` over the GLOBAL batch.

    Conceptually ``Q`` is ``K x B_global`` (prototypes x samples of all ranks); each rank
    holds the columns of its own rows of ``scores``. ``Q`` is scaled to sum to 1, then
    ``num_iters`` times its rows are scaled to sum to ``1/K`` (row sums all-reduced over
    ranks) and its columns to ``1/B_global``; finally ``Q`` is multiplied by
    ``B_global`` so each column (sample) sums to 1.

    The global maximum of ``scores / epsilon`` is subtracted before ``exp`` (one
    all-reduce): a constant factor that the first normalisation removes, so the result is
    unchanged while ``exp`` cannot overflow.

    Args:
        scores: ``(B_local, K)`` prototype scores of this rank's samples (and queue).
        epsilon: the entropic regularisation (smaller: sharper codes).
        num_iters: Sinkhorn-Knopp iterations.
        use_double_precision: compute in float64 (else float32).
        num_samples: ``B_global``, the number of rows over every rank; None: ``B_local x
            world size`` (equal rows per rank). Ranks may then hold no row at all.

    Returns:
        ``(B_local, K)`` codes; each row sums to 1.
    """
    dtype = torch.float64 if use_double_precision else torch.float32
    logits = scores.detach().to(dtype) / epsilon
    local_max = logits.max().reshape(1) if logits.numel() else logits.new_full((1,), -math.inf)
    global_max = all_reduce_max(local_max)
    q = torch.exp(logits - global_max).t()  # K x B_local
    num_prototypes = q.shape[0]
    if num_samples is None:
        num_samples = q.shape[1] * get_world_size()
    elif isinstance(num_samples, torch.Tensor):
        num_samples = num_samples.to(q.dtype)
    total = all_reduce_sum(q.sum().reshape(1))
    q /= total
    for _ in range(int(num_iters)):
        row_sums = all_reduce_sum(q.sum(dim=1, keepdim=True))
        q /= row_sums
        q /= num_prototypes
        q /= q.sum(dim=0, keepdim=True)
        q /= num_samples
    q *= num_samples
    return q.t()


def hard_codes(codes: torch.Tensor) -> torch.Tensor:
    """One-hot rows at each row's argmax (SwAV's hard assignment)."""
    return torch.zeros_like(codes).scatter_(1, codes.argmax(dim=1, keepdim=True), 1.0)


def swapped_cross_entropy(
    codes: torch.Tensor, scores: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``-mean_i sum_k codes[i, k] * log softmax(scores[i] / temperature)[k]``."""
    log_p = F.log_softmax(scores.float() / temperature, dim=1)
    return -(codes.to(log_p.dtype) * log_p).sum(dim=1).mean()


# --------------------------------------------------------------------------- queue
class EmbeddingQueue(nn.Module):
    """This rank's queue of past embeddings, one row of queues per crop used for codes.

    The newest embeddings go first. The queue is used only once it is full and from
    ``start_iter`` on (VISSL used it from ``start_iter`` even while it still held its
    random initial values). It is per-rank state: not in ``state_dict()`` (the loss saves
    it for every rank through ``rank_state_dict``).

    Args:
        num_queues: crops whose embeddings are kept (``len(crops_for_assign)``).
        length: embeddings per queue on this rank (``local_queue_length``); 0: no queue.
        dim: embedding width.
        start_iter: first iteration at which the queue may be used.
    """

    embeddings: torch.Tensor

    def __init__(self, num_queues: int, length: int, dim: int, start_iter: int = 0) -> None:
        super().__init__()
        self.length = int(length)
        self.start_iter = int(start_iter)
        self.filled = 0
        self.register_buffer(
            "embeddings", torch.zeros(num_queues, self.length, dim), persistent=False
        )

    @property
    def enabled(self) -> bool:
        return self.length > 0

    def is_ready(self, iteration: int) -> bool:
        """Whether the queue joins the scores at ``iteration``: full, and not too early."""
        return self.enabled and iteration >= self.start_iter and self.filled >= self.length

    @torch.no_grad()
    def push(self, embeddings: Sequence[torch.Tensor]) -> None:
        """Add one batch of embeddings per queue (newest first, the oldest drop out)."""
        if not self.enabled:
            return
        n = min(int(embeddings[0].shape[0]), self.length)
        queue = self.embeddings
        if n < self.length:
            queue[:, n:] = queue[:, : self.length - n].clone()
        for j, emb in enumerate(embeddings):
            queue[j, :n] = emb[:n].detach().to(queue.dtype)
        self.filled = min(self.length, self.filled + n)

    def state(self) -> dict[str, Any]:
        return {"embeddings": self.embeddings.detach().clone(), "filled": self.filled}

    def load(self, state: Mapping[str, Any]) -> None:
        emb = state["embeddings"]
        if tuple(emb.shape) != tuple(self.embeddings.shape):
            logger.warning(
                "SwAV queue not restored: saved shape %s, this run's %s (batch size, world "
                "size or queue_length changed); it refills.",
                tuple(emb.shape),
                tuple(self.embeddings.shape),
            )
            return
        self.embeddings.copy_(emb.to(self.embeddings.device))
        self.filled = int(state["filled"])

    def extra_repr(self) -> str:
        return f"length={self.length}, start_iter={self.start_iter}"


# --------------------------------------------------------------------------- checks
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{key} must be a number > 0, got {value!r}.", key)
    return float(value)


def check_non_negative_int(value: Any, key: str) -> int:
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{key} must be an integer >= 0, got {value!r}.", key)
    return int(value)


def check_int_list(value: Any, key: str, minimum: int = 0) -> list[int]:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) == 0
        or not all(_is_int(v) and v >= minimum for v in value)
    ):
        raise ConfigError(
            f"{key} must be a non-empty list of integers >= {minimum}, got {value!r}.", key
        )
    return [int(v) for v in value]


# --------------------------------------------------------------------------- the loss core
class SwAVLossBase(nn.Module):
    """The swapped prediction of SwAV: codes from some crops' scores, predicted from the
    other crops. Subclasses say where the scores that give the codes come from.

    Args:
        key: the config path of this loss's parameters, for messages.
        temperature: softmax temperature of the predictions.
        crops_for_assign: crops whose codes are computed.
        num_crops: crops per sample.
        num_prototypes: prototypes of each set (one loss term per set, averaged).
        embedding_dim: embedding width (queue rows).
        epsilon: Sinkhorn regularisation.
        num_iters: Sinkhorn iterations.
        use_double_precision: Sinkhorn in float64.
        normalize_last_layer: prototypes are L2-normalised at start and after each step
            (by :class:`~vissl.hooks.swav_hooks.NormalizePrototypesHook`).
        temp_hard_assignment_iters: hard (argmax) codes for the first iterations.
        queue_length: global queue length (informational; ``local_queue_length`` is used).
        local_queue_length: queue length on this rank (0: no queue).
        queue_start_iter: first iteration the queue may be used at.
    """

    def __init__(
        self,
        key: str,
        temperature: float = 0.1,
        crops_for_assign: Sequence[int] = (0, 1),
        num_crops: int = 2,
        num_prototypes: Sequence[int] = (3000,),
        embedding_dim: int = 128,
        epsilon: float = 0.05,
        num_iters: int = 3,
        use_double_precision: bool = False,
        normalize_last_layer: bool = True,
        temp_hard_assignment_iters: int = 0,
        queue_length: int = 0,
        local_queue_length: int = 0,
        queue_start_iter: int = 0,
    ) -> None:
        super().__init__()
        self.key = key
        self.temperature = check_positive_number(temperature, f"{key}.temperature")
        self.epsilon = check_positive_number(epsilon, f"{key}.epsilon")
        self.num_iters = check_non_negative_int(num_iters, f"{key}.num_iters")
        self.num_crops = check_non_negative_int(num_crops, f"{key}.num_crops")
        if self.num_crops < 2:
            raise ConfigError(
                f"{key}.num_crops={num_crops}: SwAV predicts the codes of a crop from the other "
                "crops, so it needs at least 2 crops per sample.",
                f"{key}.num_crops",
            )
        self.crops_for_assign = check_int_list(crops_for_assign, f"{key}.crops_for_assign")
        bad = [c for c in self.crops_for_assign if c >= self.num_crops]
        if bad or len(set(self.crops_for_assign)) != len(self.crops_for_assign):
            raise ConfigError(
                f"{key}.crops_for_assign={list(crops_for_assign)} must be distinct crop "
                f"indices below num_crops={self.num_crops}.",
                f"{key}.crops_for_assign",
            )
        self.num_prototypes = check_int_list(num_prototypes, f"{key}.num_prototypes", 1)
        self.embedding_dim = check_non_negative_int(embedding_dim, f"{key}.embedding_dim")
        self.use_double_precision = bool(use_double_precision)
        self.normalize_last_layer = bool(normalize_last_layer)
        self.temp_hard_assignment_iters = check_non_negative_int(
            temp_hard_assignment_iters, f"{key}.temp_hard_assignment_iters"
        )
        self.queue_length = check_non_negative_int(queue_length, f"{key}.queue.queue_length")
        local = check_non_negative_int(local_queue_length, f"{key}.queue.local_queue_length")
        self.queue = EmbeddingQueue(
            len(self.crops_for_assign),
            local,
            self.embedding_dim,
            check_non_negative_int(queue_start_iter, f"{key}.queue.start_iter"),
        )
        #: Optimizer steps done; kept equal to ``task.iteration`` by SwAVTrackingHook
        #: (counted here, per training forward, when the loss runs without the trainer).
        self.iteration = 0
        self._tracked = False

    # ------------------------------------------------------------------ properties
    @property
    def uniform_loss(self) -> float:
        """The loss of uniform scores, ``mean_h ln K_h``: a loss stuck there means the
        codes have collapsed."""
        return sum(math.log(k) for k in self.num_prototypes) / len(self.num_prototypes)

    # ------------------------------------------------------------------ protocol
    def required_hooks(self) -> list[Any]:
        from vissl.hooks.swav_hooks import NormalizePrototypesHook, SwAVTrackingHook

        hooks: list[Any] = [SwAVTrackingHook()]
        if self.normalize_last_layer:
            hooks.append(NormalizePrototypesHook())
        return hooks

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's queue (it differs between ranks)."""
        return {"queue": self.queue.state()}

    def load_rank_state_dict(self, state: Mapping[str, Any]) -> None:
        if "queue" in state:
            self.queue.load(state["queue"])

    # ------------------------------------------------------------------ helpers
    def split_output(self, output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(embedding, [scores_0, ...])`` of the head output, checked."""
        name = self.key.rsplit(".", 1)[-1]
        if isinstance(output, torch.Tensor) or len(output) < 2:
            raise ValueError(
                f"{name} expects the swav_head output [embedding, scores_0, ...] "
                "(return_embeddings: True and at least one set of prototypes)."
            )
        outputs = list(output)
        emb, scores = outputs[0], outputs[1:]
        if len(scores) != len(self.num_prototypes) or any(
            s.shape[-1] != k for s, k in zip(scores, self.num_prototypes)
        ):
            raise ConfigError(
                f"{self.key}.num_prototypes={self.num_prototypes} but the head outputs scores "
                f"of widths {[int(s.shape[-1]) for s in scores]}; set it to the swav_head's "
                "num_clusters (it is inferred from MODEL.HEAD.PARAMS when built from config).",
                f"{self.key}.num_prototypes",
            )
        rows = emb.shape[0]
        if rows % self.num_crops != 0:
            raise ValueError(
                f"{name}: {rows} rows are not num_crops={self.num_crops} crops of each sample; "
                "check the multi-crop transform and LOSS num_crops."
            )
        return emb, scores

    def hard_assignment(self) -> bool:
        return self.iteration < self.temp_hard_assignment_iters

    def codes(self, scores: torch.Tensor, queue_scores: torch.Tensor | None) -> torch.Tensor:
        """Codes of the ``B`` rows of ``scores`` (queue rows take part in Sinkhorn only)."""
        bs = scores.shape[0]
        with torch.no_grad():
            full = scores.detach().float()
            if queue_scores is not None:
                full = torch.cat([full, queue_scores.float()])
            q = distributed_sinkhorn(full, self.epsilon, self.num_iters, self.use_double_precision)[
                :bs
            ]
            if self.hard_assignment():
                q = hard_codes(q)
        return q

    def swapped_loss(
        self,
        pred_scores: torch.Tensor,
        code_scores: torch.Tensor,
        queue_scores: list[torch.Tensor | None],
        bs: int,
        code_blocks: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """One head's loss: for each assign crop, its codes predicted by every other crop.

        ``code_blocks[j]``: the block of ``bs`` rows of ``code_scores`` that holds the
        ``j``-th assign crop (default: the crop's index, ``code_scores`` holding every crop;
        ``swav_momentum_loss`` passes ``0, 1, ...``, its encoder seeing the assign crops only).
        """
        blocks = self.crops_for_assign if code_blocks is None else list(code_blocks)
        total = pred_scores.new_zeros((), dtype=torch.float32)
        for j, crop in enumerate(self.crops_for_assign):
            block = blocks[j]
            q = self.codes(code_scores[bs * block : bs * (block + 1)], queue_scores[j])
            term = pred_scores.new_zeros((), dtype=torch.float32)
            for other in range(self.num_crops):
                if other == crop:
                    continue
                term = term + swapped_cross_entropy(
                    q, pred_scores[bs * other : bs * (other + 1)], self.temperature
                )
            total = total + term / (self.num_crops - 1)
        return total / len(self.crops_for_assign)

    @staticmethod
    def queue_scores(
        queue: EmbeddingQueue, prototypes: Sequence[nn.Linear], use: bool, num_heads: int
    ) -> list[list[torch.Tensor | None]]:
        """``[head][assign crop]`` scores of the queued embeddings by the current prototypes
        (``None`` entries when the queue is not used)."""
        if not use:
            none: list[torch.Tensor | None] = [None] * int(queue.embeddings.shape[0])
            return [list(none) for _ in range(num_heads)]
        with torch.no_grad():
            return [
                [emb @ layer.weight.detach().float().t() for emb in queue.embeddings]
                for layer in prototypes
            ]

    def set_iteration(self, iteration: int) -> None:
        """Follow the trainer's iteration count (optimizer steps done) from now on."""
        self.iteration = int(iteration)
        self._tracked = True

    def after_forward(self) -> None:
        """Count a training forward as an iteration when no trainer sets the count."""
        if self.training and not self._tracked:
            self.iteration += 1


# --------------------------------------------------------------------------- config inference
def infer_swav_config(
    params: MutableMapping[str, Any], config: Mapping[str, Any], name: str
) -> None:
    """VISSL's inference for the SwAV losses, in place on ``params`` (``LOSS.<name>``).

    ``num_crops`` from the ImgPilToMultiCrop (``total_num_crops``) or ImgReplicatePil
    (``num_times``) transform; ``num_prototypes`` and ``embedding_dim`` from the swav_head
    in MODEL.HEAD.PARAMS; the queue rounded down to a multiple of the global batch and
    split over the ranks; ``output_dir`` defaults to CHECKPOINT.DIR.

    Raises:
        ConfigError: the collator is not ``multicrop_collator``.
    """
    key = f"config.LOSS.{name}"
    data = config["DATA"]["TRAIN"]
    collator = data.get("COLLATE_FUNCTION")
    if collator != "multicrop_collator":
        raise ConfigError(
            f"{key}: SwAV needs config.DATA.TRAIN.COLLATE_FUNCTION: multicrop_collator (the "
            f"crops of each sample, crop-major, possibly of several sizes); got {collator!r}.",
            "config.DATA.TRAIN.COLLATE_FUNCTION",
        )
    crops = transform_num_crops(data.get("TRANSFORMS", []))
    if crops is not None:
        params["num_crops"] = crops
    head = _find_swav_head_params(config["MODEL"]["HEAD"].get("PARAMS", []))
    if head is not None:
        clusters = head.get("num_clusters", [3000])
        params["num_prototypes"] = [int(clusters)] if _is_int(clusters) else list(clusters)
        if head.get("dims"):
            params["embedding_dim"] = int(head["dims"][-1])
    if "output_dir" in params and not params.get("output_dir"):
        params["output_dir"] = str(config["CHECKPOINT"]["DIR"])
    queue = params.get("queue")
    if queue is not None:
        world_size = get_world_size()
        global_batch = int(data["BATCHSIZE_PER_REPLICA"]) * world_size
        length = int(queue.get("queue_length", 0) or 0)
        rounded = length - length % global_batch if global_batch > 0 else length
        if rounded != length:
            logger.info(
                "%s.queue.queue_length %d rounded down to %d, a multiple of the global batch "
                "%d (%d per rank x %d ranks).",
                key,
                length,
                rounded,
                global_batch,
                global_batch // max(world_size, 1),
                world_size,
            )
        if length > 0 and rounded == 0:
            logger.warning(
                "%s.queue.queue_length %d is smaller than the global batch %d: no queue.",
                key,
                length,
                global_batch,
            )
        queue["queue_length"] = rounded
        queue["local_queue_length"] = rounded // world_size


def _find_swav_head_params(head_params: Any) -> Mapping[str, Any] | None:
    """The kwargs of the (first) swav_head in MODEL.HEAD.PARAMS, any of its forms."""
    return find_head_params(head_params, "swav_head")


def loss_kwargs(params: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments of :class:`SwAVLossBase` from a ``LOSS.<name>`` block."""
    queue = params.get("queue") or {}
    return {
        "temperature": params.get("temperature", 0.1),
        "crops_for_assign": list(params.get("crops_for_assign", [0, 1])),
        "num_crops": params.get("num_crops", 2),
        "num_prototypes": list(params.get("num_prototypes", [3000])),
        "embedding_dim": params.get("embedding_dim", 128),
        "epsilon": params.get("epsilon", 0.05),
        "num_iters": params.get("num_iters", 3),
        "use_double_precision": params.get("use_double_precision", False),
        "normalize_last_layer": params.get("normalize_last_layer", True),
        "temp_hard_assignment_iters": params.get("temp_hard_assignment_iters", 0),
        "queue_length": queue.get("queue_length", 0),
        "local_queue_length": queue.get("local_queue_length", 0),
        "queue_start_iter": queue.get("start_iter", 0),
    }
