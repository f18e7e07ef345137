"""``deepclusterv2_loss``: DeepCluster-v2, the SwAV paper's clustering baseline (Caron et
al., *Unsupervised Learning of Visual Features by Contrasting Cluster Assignments*,
NeurIPS 2020, section 4 and appendix).

Each process keeps a **memory** of the L2-normalised embeddings of the crops
``crops_for_mb`` of every sample it trains on, with the sample's index
(``DATA.TRAIN.LABEL_TYPE: sample_index`` makes the index the target). At the start of
every epoch, spherical k-means over the memory of **every** process gives, for each of
the ``H = len(num_clusters)`` clusterings, centroids ``C_h`` (``K_h x D``, unit rows) and
one assignment ``a_h(i)`` per sample index ``i``. Clustering ``h`` uses the memory of
crop ``crops_for_mb[h % len(crops_for_mb)]``. During the epoch every crop ``c`` of sample
``i`` predicts its sample's clusters from its normalised embedding ``z``::

    loss = 1/H sum_h  mean_{i, c}  -log softmax_k( z_{i,c} . C_h[k] / temperature )[a_h(i)]

The centroids are the prototypes: they are not trained, k-means sets them (``centroids0``,
``centroids1``, ... buffers of the loss; with a ``swav_head`` model its prototypes are kept
equal to them and frozen, and its scores are used). A sample with no assignment (it was
not in the memory: dropped by ``DROP_LAST`` in the previous epoch) is left out of the
mean, as VISSL's ``ignore_index=-100``. The memory rows of the epoch overwrite the
previous ones as training goes, so k-means at an epoch start clusters the embeddings the
model gave during the previous epoch.

**k-means** (:func:`spherical_kmeans`): centroids start at the embeddings of ``K``
distinct samples drawn with a generator seeded from ``(SEED_VALUE, epoch, h)`` among the
samples present in any process's memory, so every process starts alike without a
broadcast and the draw does not depend on the number of processes; then ``kmeans_iters``
times: assign each row to its centroid of highest dot product, move each non-empty
centroid to the mean of its rows (sums and counts all-reduced over processes),
normalise; a last assignment step gives ``a_h``. The sums are one-hot products in
float64, so a clustering has the same bits on every run, also on CUDA. The assignments of
all processes are gathered into the table ``assignments`` (``H x num_train_samples``,
-100 where none).

**First epoch**: VISSL's choice. Before the first epoch :class:`InitMemoryHook
<vissl.hooks.deepclusterv2_hooks.InitMemoryHook>` runs one forward pass (no gradients,
the model in training mode) over the training data to fill the memory, so epoch 0 trains
on clusters of the random-init network's embeddings.

**Checkpoints**: the centroids and the assignment table are the same on every process and
are in ``state_dict()``. The memory differs between processes: it is saved for each
process through :meth:`DeepClusterV2Loss.rank_state_dict` and given back to the same
process on resume (:meth:`DeepClusterV2Loss.load_rank_state_dict`); a resume with another
number of processes fills the memory again with a first pass.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import IntAtLeast, Positive, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import find_head_params, head_output_dim, transform_num_crops
from vissl.utils.distributed import (
    all_reduce_sum,
    gather_from_all,
    get_rank,
    get_world_size,
    is_primary,
)

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.deepclusterv2_loss"
#: Target of a sample without a cluster (VISSL's ``ignore_index``).
NO_ASSIGNMENT = -100
#: Memory rows scored against the centroids at once (bounds the ``rows x K`` matrix).
KMEANS_CHUNK_ROWS = 65536
#: Elements of the one-hot ``K x rows`` matrix of one chunk of k-means sums.
ONE_HOT_ELEMENTS = 1 << 23


# --------------------------------------------------------------------------- params
_PosInt = Annotated[int, IntAtLeast(1)]
_Crop = Annotated[int, IntAtLeast(0)]


def _as_list(value: int | list[int]) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


@dataclass(kw_only=True, frozen=True)
class DeepClusterV2MemoryParams:
    """``memory_params``: which crops the memory keeps, and their width."""

    #: one crop index or several (distinct, below num_crops)
    crops_for_mb: _Crop | list[_Crop] = field(default_factory=lambda: [0])
    embedding_dim: _PosInt = 128


@dataclass(kw_only=True, frozen=True)
class DeepClusterV2Params:
    """``config.LOSS.deepclusterv2_loss`` (VISSL's keys; ``BATCHSIZE_PER_REPLICA``,
    ``DROP_LAST``, ``num_crops``, ``num_clusters`` and ``embedding_dim`` are derived from
    the rest of the config)."""

    #: -1: not known yet (the run builds the loss with the data set's size)
    num_train_samples: int = -1
    BATCHSIZE_PER_REPLICA: _PosInt = 256
    DROP_LAST: bool = True
    num_crops: _PosInt = 2
    temperature: Annotated[float, Positive] = 0.1
    #: centroids of each clustering (one int: one clustering)
    num_clusters: _PosInt | list[_PosInt] = field(default_factory=lambda: [3000, 3000, 3000])
    kmeans_iters: Annotated[int, IntAtLeast(0)] = 10
    memory_params: DeepClusterV2MemoryParams = field(default_factory=DeepClusterV2MemoryParams)

    def check(self, key_path: str) -> None:
        if not _as_list(self.num_clusters):
            raise ConfigError(
                f"{key_path}.num_clusters must be a non-empty list of integers >= 1, got [].",
                f"{key_path}.num_clusters",
            )
        crops = _as_list(self.memory_params.crops_for_mb)
        if not crops or any(c >= self.num_crops for c in crops) or len(set(crops)) != len(crops):
            raise ConfigError(
                f"{key_path}.memory_params.crops_for_mb={crops} must be distinct crop "
                f"indices below num_crops={self.num_crops} (at least one).",
                f"{key_path}.memory_params.crops_for_mb",
            )


# --------------------------------------------------------------------------- k-means
def kmeans_seed(base_seed: int, epoch: int, head: int) -> int:
    """The seed of clustering ``head``'s initial draw at train epoch ``epoch``."""
    state = np.random.SeedSequence([int(base_seed) & 0xFFFFFFFF, int(epoch) + 1, int(head)])
    return int(state.generate_state(1)[0])


@torch.no_grad()
def choose_initial_samples(
    index: torch.Tensor, num_samples: int, num_clusters: int, seed: int
) -> torch.Tensor:
    """``num_clusters`` distinct sample indices to start k-means from (collective).

    The first ``num_clusters`` entries of ``randperm(num_samples)`` (a CPU generator seeded
    with ``seed``) that some process holds in its memory. Every process draws the same
    permutation, and which samples are present is all-reduced, so all processes choose
    the same samples, whatever their number.

    Args:
        index: sample indices of this process's memory rows (rows < 0 are empty).
        num_samples: size of the data set (indices are below it).
        num_clusters: samples to choose.
        seed: the draw's seed.

    Raises:
        ValueError: fewer samples in the memories than ``num_clusters``.
    """
    device = index.device
    present = torch.zeros(num_samples, dtype=torch.int64, device=device)
    present[index[index >= 0]] = 1
    all_reduce_sum(present)
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
    order = order.to(device)
    candidates = order[present[order] > 0]
    if candidates.numel() < num_clusters:
        raise ValueError(
            f"k-means with {num_clusters} clusters needs at least as many samples, but the "
            f"memory holds {candidates.numel()}: lower {_KEY}.num_clusters or use more data."
        )
    return candidates[:num_clusters]


def nearest_centroid(
    embeddings: torch.Tensor, centroids: torch.Tensor, chunk: int = KMEANS_CHUNK_ROWS
) -> torch.Tensor:
    """For each row, the index of the centroid of highest dot product (the first on ties)."""
    if embeddings.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=embeddings.device)
    parts = [
        (embeddings[s : s + chunk] @ centroids.t()).argmax(dim=1)
        for s in range(0, embeddings.shape[0], chunk)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def cluster_sums(embeddings: torch.Tensor, labels: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """``(K, D)`` float64 sums of the rows of each cluster, as one-hot products in chunks:
    the same bits on every run, also on CUDA (``index_add_`` adds with atomics there, in
    an order that changes from run to run)."""
    n, dim = int(embeddings.shape[0]), int(embeddings.shape[1])
    sums = torch.zeros(num_clusters, dim, dtype=torch.float64, device=embeddings.device)
    chunk = max(1, ONE_HOT_ELEMENTS // num_clusters)
    for s in range(0, n, chunk):
        rows = labels[s : s + chunk]
        one_hot = torch.zeros(
            num_clusters, int(rows.shape[0]), dtype=torch.float64, device=embeddings.device
        )
        one_hot[rows, torch.arange(int(rows.shape[0]), device=embeddings.device)] = 1.0
        sums += one_hot @ embeddings[s : s + chunk].double()
    return sums


@torch.no_grad()
def spherical_kmeans(
    embeddings: torch.Tensor,
    index: torch.Tensor,
    initial_samples: torch.Tensor,
    num_iters: int,
    num_samples: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means over the rows of every process's memory (collective).

    Args:
        embeddings: ``(n, D)`` L2-normalised rows of this process (only valid rows).
        index: ``(n,)`` their sample indices.
        initial_samples: ``(K,)`` sample indices whose embeddings start the centroids (a
            sample held in several rows starts from the normalised sum of those rows).
        num_iters: assignment + update iterations before the final assignment.
        num_samples: size of the data set.

    Returns:
        ``(centroids (K, D), assignments (n,))``: the same centroids on every process;
        each process's rows' cluster indices.
    """
    k = int(initial_samples.shape[0])
    emb = embeddings.float()
    slot = torch.full((num_samples,), -1, dtype=torch.long, device=emb.device)
    slot[initial_samples] = torch.arange(k, device=emb.device)
    row_slot = slot[index]
    starts = row_slot >= 0
    starting = cluster_sums(emb[starts], row_slot[starts], k)
    all_reduce_sum(starting)
    centroids = F.normalize(starting, dim=1, p=2).float()
    assignments = nearest_centroid(emb, centroids)
    for _ in range(int(num_iters)):
        sums = cluster_sums(emb, assignments, k)
        counts = torch.bincount(assignments, minlength=k)
        all_reduce_sum(sums)
        all_reduce_sum(counts)
        filled = counts > 0
        means = (sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)).float()
        # an empty cluster keeps its centroid
        centroids = F.normalize(torch.where(filled.unsqueeze(1), means, centroids), dim=1, p=2)
        assignments = nearest_centroid(emb, centroids)
    return centroids, assignments


# --------------------------------------------------------------------------- the loss
@register_loss("deepclusterv2_loss")
class DeepClusterV2Loss(nn.Module):
    """DeepCluster-v2 loss, its memory and its k-means (see the module docstring).

    Args:
        num_train_samples: samples in the training set (the run sets it from the data set;
            -1: not known yet, the memory is allocated by :meth:`allocate`).
        BATCHSIZE_PER_REPLICA: samples per process per batch (inferred from DATA.TRAIN).
        DROP_LAST: the loader drops the last partial batch (inferred from DATA.TRAIN).
        num_crops: crops per sample (inferred from the multi-crop transform).
        temperature: the softmax temperature.
        num_clusters: centroids of each clustering, e.g. ``[3000, 3000, 3000]``.
        kmeans_iters: k-means iterations at each epoch start.
        crops_for_mb: crops whose embeddings the memory keeps.
        embedding_dim: embedding width.
        world_size: processes sharing the data (default: the current process group's).
    """

    assignments: torch.Tensor
    local_memory_embeddings: torch.Tensor
    local_memory_index: torch.Tensor

    Params = DeepClusterV2Params

    def __init__(
        self,
        num_train_samples: int = DeepClusterV2Params.num_train_samples,
        BATCHSIZE_PER_REPLICA: int = DeepClusterV2Params.BATCHSIZE_PER_REPLICA,  # VISSL's key
        DROP_LAST: bool = DeepClusterV2Params.DROP_LAST,  # VISSL's key
        num_crops: int = DeepClusterV2Params.num_crops,
        temperature: float = DeepClusterV2Params.temperature,
        num_clusters: Sequence[int] = (3000, 3000, 3000),
        kmeans_iters: int = DeepClusterV2Params.kmeans_iters,
        crops_for_mb: Sequence[int] = (0,),
        embedding_dim: int = DeepClusterV2MemoryParams.embedding_dim,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        p = parse(
            DeepClusterV2Params,
            {
                "num_train_samples": num_train_samples,
                "BATCHSIZE_PER_REPLICA": BATCHSIZE_PER_REPLICA,
                "DROP_LAST": DROP_LAST,
                "num_crops": num_crops,
                "temperature": temperature,
                "num_clusters": num_clusters,
                "kmeans_iters": kmeans_iters,
                "memory_params": {"crops_for_mb": crops_for_mb, "embedding_dim": embedding_dim},
            },
            _KEY,
        )
        self.temperature = p.temperature
        self.batch_size = p.BATCHSIZE_PER_REPLICA
        self.drop_last = p.DROP_LAST
        self.num_crops = p.num_crops
        self.num_clusters = _as_list(p.num_clusters)
        self.nmb_heads = len(self.num_clusters)
        self.kmeans_iters = p.kmeans_iters
        self.crops_for_mb = _as_list(p.memory_params.crops_for_mb)
        self.nmb_mbs = len(self.crops_for_mb)
        self.embedding_dim = p.memory_params.embedding_dim
        self.world_size = int(world_size) if world_size is not None else get_world_size()
        for i, k in enumerate(self.num_clusters):
            self.register_buffer(f"centroids{i}", torch.zeros(k, self.embedding_dim))
        self.num_train_samples = -1
        self.register_buffer("assignments", torch.zeros(self.nmb_heads, 0, dtype=torch.long))
        # Per-process state, saved through rank_state_dict (not state_dict).
        self.register_buffer(
            "local_memory_embeddings",
            torch.zeros(self.nmb_mbs, 0, self.embedding_dim),
            persistent=False,
        )
        self.register_buffer(
            "local_memory_index", torch.zeros(0, dtype=torch.long), persistent=False
        )
        #: the next memory row this process writes
        self.start_idx = 0
        #: whether the memory holds embeddings (filled by a first pass or restored)
        self.memory_ready = False
        # A plain list: the model's layers must not become part of the loss's state.
        self._prototypes: list[nn.Linear] = []
        if num_train_samples > 0:
            self.allocate(int(num_train_samples))

    # ------------------------------------------------------------------ config
    @classmethod
    def derive(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with VISSL's inference, as a new mapping: ``BATCHSIZE_PER_REPLICA``
        and ``DROP_LAST`` from DATA.TRAIN,
        ``num_crops`` from the multi-crop transform; ``num_clusters`` and ``embedding_dim``
        from a ``swav_head`` (its prototypes are the centroids), else ``embedding_dim``
        from the head's output width.

        Raises:
            ConfigError: the collator is not ``multicrop_collator`` or the labels are not
                the sample indices.
        """
        data = config["DATA"]["TRAIN"]
        collator = data.get("COLLATE_FUNCTION")
        if collator != "multicrop_collator":
            raise ConfigError(
                f"{_KEY}: DeepCluster-v2 needs config.DATA.TRAIN.COLLATE_FUNCTION: "
                f"multicrop_collator (the crops of each sample, crop-major); got {collator!r}.",
                "config.DATA.TRAIN.COLLATE_FUNCTION",
            )
        label_type = data.get("LABEL_TYPE", "standard")
        if label_type != "sample_index" or data.get("LABEL_SOURCES"):
            raise ConfigError(
                f"{_KEY}: the targets must be the sample indices (the memory and the cluster "
                "assignments are indexed by them): set config.DATA.TRAIN.LABEL_TYPE: "
                f"sample_index and no LABEL_SOURCES (got LABEL_TYPE {label_type!r}).",
                "config.DATA.TRAIN.LABEL_TYPE",
            )
        params = dict(params)
        params["BATCHSIZE_PER_REPLICA"] = int(data["BATCHSIZE_PER_REPLICA"])
        params["DROP_LAST"] = bool(data.get("DROP_LAST", False))
        crops = transform_num_crops(data.get("TRANSFORMS", []))
        if crops is not None:
            params["num_crops"] = crops
        memory = params["memory_params"] = dict(params.get("memory_params") or {})
        head_params = config["MODEL"]["HEAD"].get("PARAMS", [])
        swav = find_head_params(head_params, "swav_head")
        width = None
        if swav is not None:
            clusters = swav.get("num_clusters", [3000])
            clusters = [clusters] if isinstance(clusters, int) else list(clusters)
            if list(params.get("num_clusters", [])) != clusters:
                logger.info(
                    "%s.num_clusters set to the swav_head's num_clusters %s (its prototypes "
                    "are the centroids).",
                    _KEY,
                    clusters,
                )
            params["num_clusters"] = clusters
            if swav.get("dims"):
                width = int(list(swav["dims"])[-1])
        else:
            width = head_output_dim(config)
        if width is not None and memory.get("embedding_dim") != width:
            logger.info(
                "%s.memory_params.embedding_dim set to %d, the head's output width.", _KEY, width
            )
            memory["embedding_dim"] = width
        return params

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> DeepClusterV2Loss:
        p = parse(DeepClusterV2Params, params, _KEY)
        return cls(
            num_train_samples=p.num_train_samples,
            BATCHSIZE_PER_REPLICA=p.BATCHSIZE_PER_REPLICA,
            DROP_LAST=p.DROP_LAST,
            num_crops=p.num_crops,
            temperature=p.temperature,
            num_clusters=_as_list(p.num_clusters),
            kmeans_iters=p.kmeans_iters,
            crops_for_mb=_as_list(p.memory_params.crops_for_mb),
            embedding_dim=p.memory_params.embedding_dim,
        )

    def required_hooks(self) -> list[Any]:
        """VISSL's hooks: fill the memory before training, cluster it at each epoch start."""
        from vissl.hooks.deepclusterv2_hooks import ClusterMemoryHook, InitMemoryHook

        return [InitMemoryHook(), ClusterMemoryHook()]

    def bind_model(self, model: nn.Module) -> None:
        """With a ``swav_head``, its prototypes become the centroids: checked against
        ``num_clusters`` and ``embedding_dim``, frozen (k-means sets them, not the
        optimizer) and kept equal to the centroids from now on."""
        from vissl.models.heads.swav_head import find_swav_heads

        heads = find_swav_heads(model)
        if not heads:
            self._prototypes = []
            return
        if len(heads) != 1:
            raise ConfigError(
                f"{_KEY}: the model has {len(heads)} swav_heads; DeepCluster-v2 takes one "
                "(its prototypes are the centroids) or plain mlp heads.",
                "config.MODEL.HEAD.PARAMS",
            )
        head = heads[0]
        if list(head.num_clusters) != self.num_clusters or head.embedding_dim != (
            self.embedding_dim
        ):
            raise ConfigError(
                f"{_KEY}: the swav_head has prototypes {list(head.num_clusters)} of width "
                f"{head.embedding_dim}, the loss num_clusters={self.num_clusters} and "
                f"memory_params.embedding_dim={self.embedding_dim}; make them equal (they are "
                "inferred from the head when the loss is built from config).",
                f"{_KEY}.num_clusters",
            )
        if not head.normalize_feats or not head.return_embeddings:
            raise ConfigError(
                f"{_KEY}: the swav_head must return its embeddings, L2-normalised "
                "(return_embeddings: True, normalize_feats: True): the memory keeps them.",
                "config.MODEL.HEAD.PARAMS",
            )
        self._prototypes = head.prototype_layers()
        for layer in self._prototypes:
            layer.weight.requires_grad_(False)
        self._copy_centroids_to_prototypes()

    # ------------------------------------------------------------------ memory
    def memory_size(self, num_train_samples: int) -> int:
        """Rows of this process's memory: its share of the data set per epoch (VISSL's
        rule: ``ceil(N / world_size)``, less the last partial batch with DROP_LAST)."""
        size = math.ceil(num_train_samples / self.world_size)
        if self.drop_last:
            size -= size % self.batch_size
        return size

    def allocate(self, num_train_samples: int) -> None:
        """(Re)allocate the memory and the assignment table for ``num_train_samples``
        samples; the memory is then empty and the assignments unset."""
        if (
            isinstance(num_train_samples, bool)
            or not isinstance(num_train_samples, int)
            or num_train_samples <= 0
        ):
            raise ConfigError(
                f"{_KEY}.num_train_samples must be a positive integer here, got "
                f"{num_train_samples!r}.",
                f"{_KEY}.num_train_samples",
            )
        device = self.assignments.device
        size = self.memory_size(num_train_samples)
        self.num_train_samples = int(num_train_samples)
        self.assignments = torch.full(
            (self.nmb_heads, self.num_train_samples), NO_ASSIGNMENT, dtype=torch.long, device=device
        )
        self.local_memory_embeddings = torch.zeros(
            self.nmb_mbs, size, self.embedding_dim, device=device
        )
        self.local_memory_index = torch.full((size,), -1, dtype=torch.long, device=device)
        self.start_idx = 0
        self.memory_ready = False

    @property
    def local_memory_size(self) -> int:
        return int(self.local_memory_index.shape[0])

    def _check_allocated(self) -> None:
        if self.num_train_samples <= 0:
            raise RuntimeError(
                "deepclusterv2_loss: the memory is not allocated: the run sets "
                f"{_KEY}.num_train_samples from the data set; outside a run call "
                "loss.allocate(num_train_samples) first."
            )

    @torch.no_grad()
    def _write_memory(self, index: torch.Tensor, crops: Sequence[torch.Tensor]) -> None:
        """Write ``n`` samples' indices and their memory crops' normalised embeddings
        (``crops[j]`` for ``crops_for_mb[j]``) at the next rows."""
        self._check_allocated()
        n = int(index.shape[0])
        end = self.start_idx + n
        if end > self.local_memory_size:
            raise RuntimeError(
                f"deepclusterv2_loss: this epoch gave more samples than the memory's "
                f"{self.local_memory_size} rows per process (sized from num_train_samples="
                f"{self.num_train_samples}, {self.world_size} processes, batch "
                f"{self.batch_size}, DROP_LAST={self.drop_last}); the sampler or the data set "
                "differs from what the loss was built for."
            )
        self.local_memory_index[self.start_idx : end] = index
        for j, rows in enumerate(crops):
            self.local_memory_embeddings[j, self.start_idx : end] = rows.to(
                self.local_memory_embeddings.dtype
            )
        self.start_idx = end

    def update_memory_bank(self, embeddings: torch.Tensor, index: torch.Tensor) -> None:
        """Write the memory crops of a training batch (VISSL's name): ``embeddings`` are
        its normalised rows and ``index`` its sample indices, both crop-major."""
        n = int(index.shape[0]) // self.num_crops
        self._write_memory(
            index[:n], [embeddings[c * n : (c + 1) * n].detach() for c in self.crops_for_mb]
        )

    @torch.no_grad()
    def init_memory(
        self, batches: Iterable[tuple[Any, torch.Tensor]], model: Callable[[Any], Any]
    ) -> None:
        """Fill the memory with one pass over the training data (VISSL's first pass).

        Args:
            batches: ``(input, target)`` of each batch: the list of crop tensors and the
                crop-major sample indices.
            model: called on the list of the ``crops_for_mb`` crop tensors; returns their
                embeddings (or a ``swav_head`` output), rows in that order.
        """
        self._check_allocated()
        self.start_idx = 0
        self.local_memory_index.fill_(-1)
        for inputs, target in batches:
            if isinstance(inputs, torch.Tensor):
                inputs = [inputs]
            crops = [inputs[c] for c in self.crops_for_mb]
            n = int(crops[0].shape[0])
            index = self._check_target(target, n * self.num_crops)[:n]
            with torch.autocast(device_type=index.device.type, enabled=False):
                emb = F.normalize(self._embedding(model(crops)).float(), dim=1, p=2)
            self._write_memory(index, [emb[j * n : (j + 1) * n] for j in range(self.nmb_mbs)])
        self.memory_ready = True
        logger.info(
            "rank %d: DeepCluster-v2 memory filled by a first pass (%d of %d rows)",
            get_rank(),
            self.start_idx,
            self.local_memory_size,
        )

    # ------------------------------------------------------------------ k-means
    @torch.no_grad()
    def cluster_memory(self, seed: int = 0, epoch: int = 0) -> None:
        """k-means of every clustering over the memories of all processes (collective):
        sets the centroids (and the swav_head's prototypes), the assignment table, and
        starts writing the memory from its first row again."""
        self._check_allocated()
        valid = self.local_memory_index >= 0
        index = self.local_memory_index[valid]
        all_index = gather_from_all(self.local_memory_index)
        sizes: list[tuple[int, int, int]] = []
        for h, k in enumerate(self.num_clusters):
            embeddings = self.local_memory_embeddings[h % self.nmb_mbs][valid]
            initial = choose_initial_samples(
                self.local_memory_index, self.num_train_samples, k, kmeans_seed(seed, epoch, h)
            )
            centroids, local = spherical_kmeans(
                embeddings, index, initial, self.kmeans_iters, self.num_train_samples
            )
            getattr(self, f"centroids{h}").copy_(centroids)
            rows = torch.full_like(self.local_memory_index, NO_ASSIGNMENT)
            rows[valid] = local
            all_rows = gather_from_all(rows)
            kept = all_index >= 0
            self.assignments[h].fill_(NO_ASSIGNMENT)
            # an image in several rows (the sampler's padding repeats a few): the largest
            # of its clusters, whatever the order of the writes
            self.assignments[h].scatter_reduce_(
                0, all_index[kept], all_rows[kept], reduce="amax", include_self=False
            )
            if is_primary():  # (the same on every process)
                counts = torch.bincount(all_rows[kept], minlength=k)
                sizes.append((int((counts > 0).sum()), k, int(counts.max())))
        self._copy_centroids_to_prototypes()
        self.start_idx = 0
        if is_primary():
            logger.info(
                "DeepCluster-v2 k-means (epoch %d) over %d samples: non-empty clusters %s",
                epoch,
                int((self.assignments[0] != NO_ASSIGNMENT).sum()),
                ", ".join(f"{used}/{k} (largest {top})" for used, k, top in sizes),
            )

    def centroids(self, head: int) -> torch.Tensor:
        return getattr(self, f"centroids{head}")  # type: ignore[no-any-return]

    @torch.no_grad()
    def _copy_centroids_to_prototypes(self) -> None:
        for h, layer in enumerate(self._prototypes):
            layer.weight.copy_(self.centroids(h).to(layer.weight))

    # ------------------------------------------------------------------ per-rank state
    def rank_state_dict(self) -> dict[str, Any]:
        """This process's memory: embeddings, sample indices and whether it is filled."""
        return {
            "local_memory_embeddings": self.local_memory_embeddings.detach().clone(),
            "local_memory_index": self.local_memory_index.detach().clone(),
            "memory_ready": bool(self.memory_ready),
        }

    def load_rank_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`rank_state_dict` gave on this process (nothing, with a
        warning, when the saved memory has another shape: it is filled again)."""
        emb = state.get("local_memory_embeddings")
        index = state.get("local_memory_index")
        if emb is None or index is None:
            return
        if tuple(emb.shape) != tuple(self.local_memory_embeddings.shape):
            logger.warning(
                "deepclusterv2_loss: the memory is not restored: saved shape %s, this run's %s "
                "(data set, batch size, crops_for_mb or embedding_dim changed); a first pass "
                "fills it again.",
                tuple(emb.shape),
                tuple(self.local_memory_embeddings.shape),
            )
            return
        self.local_memory_embeddings.copy_(emb.to(self.local_memory_embeddings.device))
        self.local_memory_index.copy_(index.to(self.local_memory_index.device))
        self.memory_ready = bool(state.get("memory_ready", True))

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # A loss built before the data set's size was known takes the checkpoint's.
        saved = state_dict.get(prefix + "assignments")
        if (
            isinstance(saved, torch.Tensor)
            and saved.dim() == 2
            and saved.shape[0] == self.nmb_heads
            and saved.shape[1] != self.num_train_samples
            and saved.shape[1] > 0
        ):
            self.allocate(int(saved.shape[1]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ loss
    def _embedding(self, output: Any) -> torch.Tensor:
        """The embedding rows of a model output: a tensor, ``[tensor]`` or a swav_head's
        ``[embedding, scores_0, ...]``."""
        if isinstance(output, torch.Tensor):
            emb = output
        elif isinstance(output, list | tuple) and len(output) >= 1:
            emb = output[0]
        else:
            raise ValueError(
                "deepclusterv2_loss expects the model output: the embeddings (mlp heads) or a "
                f"swav_head's [embedding, scores_0, ...]; got {type(output).__name__}."
            )
        if (
            not isinstance(emb, torch.Tensor)
            or emb.dim() != 2
            or emb.shape[1] != self.embedding_dim
        ):
            shape = tuple(emb.shape) if isinstance(emb, torch.Tensor) else type(emb).__name__
            raise ConfigError(
                f"{_KEY}.memory_params.embedding_dim={self.embedding_dim} but the model's "
                f"embeddings have shape {shape}; set it to the head's output width (it is "
                "inferred from MODEL.HEAD.PARAMS when the loss is built from config).",
                f"{_KEY}.memory_params.embedding_dim",
            )
        return emb

    def _head_scores(self, output: Any) -> list[torch.Tensor] | None:
        """A swav_head's prototype scores, checked, or None for a plain embedding."""
        if isinstance(output, torch.Tensor) or len(output) == 1:
            return None
        scores = list(output[1:])
        if len(scores) != self.nmb_heads or any(
            s.shape[-1] != k for s, k in zip(scores, self.num_clusters, strict=False)
        ):
            raise ConfigError(
                f"{_KEY}.num_clusters={self.num_clusters} but the head outputs scores of "
                f"widths {[int(s.shape[-1]) for s in scores]}; set it to the swav_head's "
                "num_clusters.",
                f"{_KEY}.num_clusters",
            )
        if not self._prototypes:
            raise RuntimeError(
                "deepclusterv2_loss: the model outputs prototype scores but the loss is not "
                "bound to its swav_head; call loss.bind_model(model) first (the trainer does)."
            )
        return scores

    def _check_target(self, target: Any, rows: int) -> torch.Tensor:
        if (
            not isinstance(target, torch.Tensor)
            or target.dim() != 1
            or target.shape[0] != rows
            or target.is_floating_point()
        ):
            shape = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target)
            raise ValueError(
                f"deepclusterv2_loss: the target must be the {rows} sample indices of the rows "
                f"(config.DATA.TRAIN.LABEL_TYPE: sample_index); got {shape}."
            )
        return target.long()

    def forward(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The loss of this process's rows; in training mode the memory crops' embeddings
        are written to the memory afterwards.

        In evaluation mode (test phases) the memory is left alone and the targets are the
        nearest centroids of each sample's crop ``crops_for_mb[0]``.

        Args:
            output: ``(num_crops * B, D)`` embeddings (or a swav_head's output), crop-major.
            target: ``(num_crops * B,)`` sample indices, crop-major.
        """
        self._check_allocated()
        emb = self._embedding(output)
        scores = self._head_scores(output)
        rows = int(emb.shape[0])
        if rows % self.num_crops != 0:
            raise ValueError(
                f"deepclusterv2_loss: {rows} rows are not num_crops={self.num_crops} crops of "
                "each sample; check the multi-crop transform and LOSS num_crops."
            )
        index = self._check_target(target, rows)
        n = rows // self.num_crops
        # fp32 scores and softmax, also under a bf16/fp16 autocast
        with torch.autocast(device_type=emb.device.type, enabled=False):
            z = F.normalize(emb.float(), dim=1, p=2)
            loss = z.new_zeros(())
            for h in range(self.nmb_heads):
                centroids = self.centroids(h).float()
                logits = z @ centroids.t() if scores is None else scores[h].float()
                if self.training:
                    labels = self.assignments[h][index]
                else:
                    crop = self.crops_for_mb[0]
                    nearest = nearest_centroid(z[crop * n : (crop + 1) * n].detach(), centroids)
                    labels = nearest.repeat(self.num_crops)
                per_row = F.cross_entropy(
                    logits / self.temperature, labels, ignore_index=NO_ASSIGNMENT, reduction="sum"
                )
                counted = (labels != NO_ASSIGNMENT).sum().clamp(min=1)
                loss = loss + per_row / counted
            loss = loss / self.nmb_heads
        if self.training:
            self.update_memory_bank(z.detach(), index)
        return loss

    def extra_repr(self) -> str:
        return (
            f"num_clusters={self.num_clusters}, temperature={self.temperature}, "
            f"kmeans_iters={self.kmeans_iters}, crops_for_mb={self.crops_for_mb}, "
            f"embedding_dim={self.embedding_dim}, num_train_samples={self.num_train_samples}, "
            f"memory_rows={self.local_memory_size}"
        )
