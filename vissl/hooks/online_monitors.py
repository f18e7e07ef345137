"""Online monitors: an online kNN classifier, an online linear probe and collapse signals.

Three hooks, each turned on in config (``HOOKS.ONLINE_KNN``, ``HOOKS.ONLINE_LINEAR_PROBE``,
``HOOKS.COLLAPSE_MONITOR``; docs/online_monitors.md):

- :class:`OnlineKnnHook`: a memory bank of trunk features of labelled TRAIN samples
  (the trunk output, flattened, of ``task.base_model`` in eval mode under ``no_grad``;
  the model's train/eval modes are put back after), filled at ``on_start`` (also after a
  resume); at the end of every train phase a slice of the bank is recomputed (the whole
  of it over ``BANK_REFRESH_PHASES`` phases, and all of it after the last train phase),
  the TEST queries' features are computed and each query is classified by the weighted
  vote of its ``TOPK`` nearest bank samples, exactly as
  :func:`vissl.evaluation.knn.knn_classify` (the offline ``tools/nearest_neighbor_test.py``)
  does. With several processes the bank is sharded (each rank holds the samples of its
  share of the data) and the queries are gathered: each rank scores every query against
  its shard, the per-rank top-k are gathered and merged, so every rank computes the same
  top-1/top-5; the forwards use rank 0's BatchNorm buffers (the checkpoint's). The
  phase's forwards run after its last step (``on_step``), before the next phase's loader
  workers start, the kNN in ``sync_state`` at phase end.
- :class:`OnlineLinearProbeHook`: a linear layer with its own SGD, trained at every
  train step on the detached features of the SSL batch (captured from the trunk's
  forward, or the model output); its gradients are averaged across ranks (one small
  all-reduce per step), so every rank holds the same probe; its weights and optimizer
  state are in the hook's checkpoint state. Its accuracy on each batch (before the
  update) is counted on the device and read once per phase.
- :class:`CollapseMonitorHook`: the first ``NUM_EMBEDDINGS`` embeddings of each train
  phase (model output or trunk features) kept in a preallocated device buffer; at phase
  end they are gathered from every rank and RankMe (Garrido et al. 2023) and the mean
  per-dimension standard deviation of the L2-normalised embeddings are computed.

Reporting: each hook puts a meter-like object in ``task.meters`` during train phases
(as :class:`~vissl.hooks.ema_hook.EmaHook` does for test phases). The trainer calls its
``sync_state()`` on every rank before ``on_phase_end``; that is where the collective work
of the phase end happens. Its ``value`` (e.g. ``{"top_1": 97.2, "top_5": 99.7}``) then
reaches ``metrics.json`` (``train_online_knn``), TensorBoard
(``Meters/train_online_knn/top_1/0``), the summary and early stopping
(``train_online_knn_top_1``), and a phase-end record of ``stdout.json``.

Nothing here reads the device per step, and nothing consumes the global RNGs: the data
loaders of the bank and queries have their own ``torch.Generator``, eval-mode forwards
draw no random numbers, and the probe is initialised from a generator of its own. A run
with the monitors trains exactly the same weights as one without.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vissl.errors import ConfigError
from vissl.evaluation.knn import knn_class_scores, rank_classes
from vissl.hooks.base import Priority, VisslHook
from vissl.utils.distributed import (
    all_reduce_mean,
    all_reduce_sum,
    broadcast_coalesced,
    get_rank,
    get_world_size,
)

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

KNN_KEY = "config.HOOKS.ONLINE_KNN"
PROBE_KEY = "config.HOOKS.ONLINE_LINEAR_PROBE"
COLLAPSE_KEY = "config.HOOKS.COLLAPSE_MONITOR"
#: The splits a bank or query set may read.
SPLITS = ("train", "test")
#: ``FEATURE`` choices of the probe and the collapse monitor.
FEATURES = ("trunk", "heads")
#: RankMe's epsilon (Garrido et al. 2023).
RANKME_EPS = 1e-7
#: Similarities held at once by the online kNN (floats), per rank.
KNN_BLOCK = 32 * 1024 * 1024

# depth of monitor forwards in progress: the trunk captures ignore them
_MONITOR_FORWARD = [0]


# ---------------------------------------------------------------------- checks
def _pos_int(value: Any, key: str, minimum: int = 1, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}{what}.", key)
    return value


def _number(value: Any, key: str, low: float, high: float | None, what: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and value >= low and (high is None or value < high) and math.isfinite(value)
    if not ok:
        raise ConfigError(f"{key}={value!r} must be {what}.", key)
    return float(value)


def _choice(value: Any, key: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {list(choices)}.", key)
    return str(value)


# ---------------------------------------------------------------------- math
def rankme(embeddings: torch.Tensor, eps: float = RANKME_EPS) -> torch.Tensor:
    """RankMe (Garrido et al. 2023): ``exp(-sum p_k log p_k)``, ``p_k = s_k / sum(s) + eps``.

    ``s`` are the singular values of the ``(N, D)`` embedding matrix; computed in float64.
    Between 1 (collapse to a line) and ``min(N, D)``.
    """
    s = torch.linalg.svdvals(embeddings.detach().double())
    p = s / s.sum().clamp_min(torch.finfo(torch.float64).tiny) + eps
    return torch.exp(-(p * p.log()).sum())


def normalized_std(embeddings: torch.Tensor) -> torch.Tensor:
    """Std (unbiased) of each dimension of the L2-normalised embeddings, averaged over
    dimensions: 0 at collapse, about ``1/sqrt(D)`` for spread-out embeddings."""
    z = F.normalize(embeddings.detach().double(), dim=1)
    return z.std(dim=0).mean()


def _all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` (same shape on every rank) from every rank, in rank order."""
    if get_world_size() == 1:
        return [tensor]
    out = [torch.empty_like(tensor) for _ in range(get_world_size())]
    dist.all_gather(out, tensor.contiguous())
    return out


def knn_topk_shard(
    queries: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    bank_valid: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most similar valid rows of this shard for every query: ``(sims, labels)``.

    Padded to ``k`` columns with ``-inf`` similarities (which get no vote) when the shard
    has fewer rows; queries are processed in chunks bounding the similarity block.
    """
    n_q = queries.shape[0]
    out_s = torch.full((n_q, k), -math.inf, device=queries.device)
    out_l = torch.zeros((n_q, k), dtype=torch.long, device=queries.device)
    n_bank = bank.shape[0]
    if n_bank == 0 or n_q == 0:
        return out_s, out_l
    kk = min(k, n_bank)
    chunk = max(1, KNN_BLOCK // n_bank)
    mask = torch.zeros(n_bank, device=queries.device).masked_fill_(~bank_valid, -math.inf)
    for start in range(0, n_q, chunk):
        sims = queries[start : start + chunk] @ bank.T + mask
        top, idx = sims.topk(kk, dim=1)
        out_s[start : start + chunk, :kk] = top
        out_l[start : start + chunk, :kk] = bank_labels[idx]
    return out_s, out_l


def distributed_knn(
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    query_valid: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    bank_valid: torch.Tensor,
    *,
    k: int,
    sigma: float,
    num_classes: int,
) -> torch.Tensor:
    """Weighted kNN over a bank sharded across ranks: ``[top-1 hits, top-5 hits, count]``.

    ``queries`` (with labels and valid flags) are this rank's; they are gathered, every
    rank scores all of them against its shard, the per-rank top-k are gathered and
    merged, and the votes are those of :func:`vissl.evaluation.knn.knn_class_scores`. Collective
    (every rank calls it); the result (a device tensor) is the same on every rank.
    """
    all_q = torch.cat(_all_gather(queries))
    all_y = torch.cat(_all_gather(query_labels))
    all_v = torch.cat(_all_gather(query_valid.to(torch.uint8))).bool()
    sims, labels = knn_topk_shard(all_q, bank, bank_labels, bank_valid, k)
    if get_world_size() > 1:
        sims = torch.cat(_all_gather(sims), dim=1)
        labels = torch.cat(_all_gather(labels), dim=1)
        sims, pos = sims.topk(k, dim=1)
        labels = labels.gather(1, pos)
    scores = knn_class_scores(sims, labels, num_classes, sigma)
    ranked = rank_classes(scores)[:, : min(5, num_classes)]
    hits = ranked.eq(all_y[:, None]) & all_v[:, None]
    return torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(), all_v.sum()]).double()


# ---------------------------------------------------------------------- model access
@contextlib.contextmanager
def _eval_mode(model: nn.Module, rank0_buffers: bool = False) -> Iterator[None]:
    """Every submodule in eval mode, no gradients; each module's own mode restored after.

    With ``rank0_buffers`` and several processes (collective): the buffers (BatchNorm's
    running statistics) are rank 0's while inside, and this rank's own are put back
    after. Ranks hold the same parameters but, between two DDP forwards (or with a
    reducer that never syncs buffers), their own statistics; checkpoints hold rank 0's,
    so that is the model the offline tools evaluate.
    """
    modes = [(m, m.training) for m in model.modules()]
    buffers: list[torch.Tensor] = []
    saved: list[torch.Tensor] = []
    if rank0_buffers and get_world_size() > 1:
        buffers = [b for b in model.buffers() if b.numel() > 0]
        saved = [b.detach().clone() for b in buffers]
        broadcast_coalesced(buffers, src=0)
    model.eval()
    _MONITOR_FORWARD[0] += 1
    try:
        with torch.no_grad():
            yield
    finally:
        _MONITOR_FORWARD[0] -= 1
        for module, mode in modes:
            module.training = mode
        with torch.no_grad():
            for buf, own in zip(buffers, saved, strict=True):
                buf.copy_(own)


def trunk_features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The trunk output of ``model`` for ``x``, flattened to ``(N, D)`` float32 (as
    ``tools/nearest_neighbor_test.py`` with ``FEATURE_TYPE: trunk``)."""
    get_features = getattr(model, "get_features", None)
    feats: Any = get_features(x) if callable(get_features) else model.trunk(x)  # type: ignore[operator]
    if isinstance(feats, list | tuple):
        feats = feats[0]
    return feats.float().flatten(1)


class TrunkCapture:
    """Keeps the outputs of ``trunk``'s forward calls while armed (not during monitor
    forwards). The forward hook is a plain closure holding a weak reference, so that a
    deep copy of the model (EMA, momentum encoder) neither copies this object nor
    captures its own trunk's outputs here."""

    def __init__(self, trunk: nn.Module) -> None:
        self.outputs: list[torch.Tensor] = []
        self.armed = False
        ref = weakref.ref(self)
        trunk_ref = weakref.ref(trunk)

        def _hook(module: nn.Module, args: Any, output: Any) -> None:
            me = ref()
            if me is None or not me.armed or _MONITOR_FORWARD[0] or module is not trunk_ref():
                return
            outs = output if isinstance(output, list | tuple) else [output]
            if outs and isinstance(outs[0], torch.Tensor):
                me.outputs.append(outs[0])

        self.handle = trunk.register_forward_hook(_hook)

    def take(self) -> torch.Tensor | None:
        """The captured features of this forward (several trunk calls concatenated),
        detached, flattened, float32; None when nothing was captured."""
        outs, self.outputs = self.outputs, []
        if not outs:
            return None
        feats = [o.detach().float().flatten(1) for o in outs]
        return feats[0] if len(feats) == 1 else torch.cat(feats)

    def remove(self) -> None:
        self.handle.remove()
        self.outputs = []


def _trunk_of(task: SelfSupervisionTask) -> nn.Module:
    trunk = getattr(task.base_model, "trunk", None)
    if not isinstance(trunk, nn.Module):
        raise ConfigError(
            "the online monitors' FEATURE: trunk needs a model with a trunk "
            "(task.base_model.trunk); use FEATURE: heads.",
            f"{PROBE_KEY}.FEATURE",
        )
    return trunk


def _model_output_features(output: Any) -> torch.Tensor | None:
    if isinstance(output, list | tuple) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor) or output.ndim < 1:
        return None
    return output.detach().float().flatten(1)


# ---------------------------------------------------------------------- meter views
class MonitorMeter:
    """A monitor's value as it appears in ``task.meters`` during train phases.

    The train step's ``update`` calls are ignored (the hook feeds itself); ``sync_state``
    runs the hook's phase-end work (collective); ``log_to_stdout_json`` asks
    :class:`~vissl.hooks.log_hooks.LogLossLrEtaHook` for a phase-end ``stdout.json`` record.
    """

    supports_valid_mask = True
    log_to_stdout_json = True

    def __init__(self, hook: _MonitorHook, name: str) -> None:
        self.hook = hook
        self.name = name

    @property
    def value(self) -> dict[str, float]:
        return dict(self.hook.values)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Ignored: the hook collects what it needs itself."""

    def reset(self) -> None:
        self.hook.reset_phase()

    def sync_state(self) -> None:
        self.hook.phase_end_sync()

    def state_dict(self) -> dict[str, Any]:
        return self.hook.phase_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hook.load_phase_state(state)


class _MonitorHook(VisslHook):
    """Puts a :class:`MonitorMeter` in ``task.meters`` for train phases (see module doc)."""

    # on_start before EarlyStoppingHook (LOW + 5) checks the names the run logs
    priority = Priority.NORMAL - 5
    meter_name = "monitor"
    value_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.meter = MonitorMeter(self, self.meter_name)
        self.values: dict[str, float] = {k: math.nan for k in self.value_names}
        self.device = torch.device("cpu")

    # overridden by the monitors
    def reset_phase(self) -> None:
        self.values = {k: math.nan for k in self.value_names}

    def phase_end_sync(self) -> None:
        pass

    def phase_state(self) -> dict[str, Any]:
        return {}

    def load_phase_state(self, state: Mapping[str, Any]) -> None:
        pass

    def _has_meter(self, task: SelfSupervisionTask) -> bool:
        return any(m is self.meter for m in task.meters)

    def on_start(self, task: SelfSupervisionTask) -> None:
        self.device = task.device
        # present from the start, so that a resume inside a train phase restores the
        # phase's partial state into it (restore_mid_phase runs before on_phase_start)
        if not self._has_meter(task):
            task.meters.append(self.meter)

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        if task.train:
            if not self._has_meter(task):
                task.meters.append(self.meter)
                self.meter.reset()
        else:
            task.meters[:] = [m for m in task.meters if m is not self.meter]


# ---------------------------------------------------------------------- kNN data
def _default_transforms(train_transforms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Resize (to DATA.TRAIN's crop size), ToTensor, DATA.TRAIN's Normalize."""
    size: int | None = None
    normalize: dict[str, Any] | None = None
    for t in train_transforms:
        name = str(t.get("name", ""))
        if name == "RandomResizedCrop" and size is None:
            s: Any = t.get("size", 0)
            size = int(s[0] if isinstance(s, list | tuple) else s)
        elif name in ("ImgPilToMultiCrop", "ImgPilMultiCropRandomApply") and size is None:
            crops = t.get("size_crops") or []
            if crops:
                size = int(crops[0])
        elif name == "Normalize":
            normalize = {"name": "Normalize", "mean": list(t["mean"]), "std": list(t["std"])}
    out: list[dict[str, Any]] = []
    if size is not None:
        if size > 32:
            out += [{"name": "Resize", "size": round(size * 8 / 7)}]
            out += [{"name": "CenterCrop", "size": size}]
        else:
            out += [{"name": "Resize", "size": size}]
    out.append({"name": "ToTensor"})
    if normalize is not None:
        out.append(normalize)
    return out


def _as_plain(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else copy.deepcopy(value)


def monitor_split_config(cfg: Any, spec: Mapping[str, Any], key: str) -> tuple[Any, str]:
    """A copy of ``cfg`` whose ``DATA.<SPLIT>`` reads the bank or query set ``spec``.

    Returns ``(config, "TRAIN" | "TEST")`` for :class:`~vissl.data.GenericSSLDataset`.

    Raises:
        ConfigError: an unknown SPLIT, or queries that would read the TRAIN data's paths.
    """
    from vissl.config.attr_dict import AttrDict

    split = _choice(spec.get("SPLIT"), f"{key}.SPLIT", SPLITS).upper()
    train = cfg.DATA.TRAIN
    sources = list(spec.get("DATA_SOURCES") or [])
    if sources:
        paths = list(spec.get("DATA_PATHS") or [])
        names = list(spec.get("DATASET_NAMES") or [])
    else:
        sources = list(train.DATA_SOURCES)
        names = list(train.DATASET_NAMES or [])
        paths = list(train.DATA_PATHS or [])
        if split != "TRAIN" and paths:
            if names:
                paths = []  # the catalog gives the paths of this split
            else:
                from vissl.data import get_data_source

                needs = [getattr(get_data_source(s), "requires_path", True) for s in sources]
                if any(needs):
                    raise ConfigError(
                        f"{key}.DATA_SOURCES is empty, so the data sources of "
                        f"config.DATA.TRAIN ({sources}) are used, but with SPLIT "
                        f"{split.lower()!r} their DATA_PATHS would be the TRAIN data's: give "
                        f"{key}.DATA_SOURCES and {key}.DATA_PATHS (or DATASET_NAMES).",
                        f"{key}.DATA_PATHS",
                    )
    if not sources:
        raise ConfigError(
            f"{key}.DATA_SOURCES is empty and so is config.DATA.TRAIN.DATA_SOURCES: name the "
            "labelled data of the monitor.",
            f"{key}.DATA_SOURCES",
        )
    transforms = [_as_plain(t) for t in (spec.get("TRANSFORMS") or [])]
    if not transforms:
        transforms = _default_transforms([_as_plain(t) for t in train.TRANSFORMS])
    batch = _pos_int(spec.get("BATCHSIZE_PER_REPLICA"), f"{key}.BATCHSIZE_PER_REPLICA")
    limit = spec.get("DATA_LIMIT", -1)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1 or limit == 0:
        raise ConfigError(f"{key}.DATA_LIMIT={limit!r} must be -1 (all) or >= 1.", key)
    out = AttrDict(copy.deepcopy(_as_plain(cfg)))
    data = dict(_as_plain(train))
    data.update(
        {
            "DATA_SOURCES": sources,
            "DATA_PATHS": paths,
            "DATASET_NAMES": names,
            "LABEL_SOURCES": list(spec.get("LABEL_SOURCES") or []),
            "LABEL_PATHS": list(spec.get("LABEL_PATHS") or []),
            "LABEL_TYPE": "standard",
            "DATA_LIMIT": int(limit),
            "TRANSFORMS": transforms,
            "BATCHSIZE_PER_REPLICA": batch,
            "COLLATE_FUNCTION": "default_collate",
            "COLLATE_FUNCTION_PARAMS": {},
            "INPUT_KEY_NAMES": ["data"],
            "TARGET_KEY_NAMES": ["label"],
            "TRANSFORMS_ON_DEVICE": False,
            "DECODE_ON_DEVICE": False,
            "DROP_LAST": False,
        }
    )
    out.DATA[split] = AttrDict(data)
    return out, split


class _FeatureSet:
    """This rank's share of a labelled split (bank or queries), its inputs read in order.

    ``rows`` are this rank's sample keys (padding repeats flagged); ``labels`` and
    ``valid`` are device tensors aligned with them. Inputs are cached in host memory after
    the first pass when they are small enough.
    """

    def __init__(self, cfg: Any, spec: Mapping[str, Any], key: str, workers: int, cache_mb: float):
        from vissl.data import build_dataset
        from vissl.data.samplers import StatefulDistributedSampler

        self.key = key
        self.cfg, self.split = monitor_split_config(cfg, spec, key)
        self.dataset = build_dataset(self.cfg, self.split)
        labels = self.dataset.get_labels()
        if labels is None:
            raise ConfigError(
                f"{key}: the data {list(self.dataset.data_sources)} has no labels; give "
                f"{key}.LABEL_SOURCES (e.g. disk_filelist with LABEL_PATHS).",
                f"{key}.LABEL_SOURCES",
            )
        self.all_labels = np.asarray(labels, dtype=np.int64)
        self.batch_size = int(self.cfg.DATA[self.split].BATCHSIZE_PER_REPLICA)
        self.seed = int(cfg.get("SEED_VALUE", 0))
        sampler = StatefulDistributedSampler(
            self.dataset,
            num_replicas=get_world_size(),
            rank=get_rank(),
            shuffle=False,
            seed=self.seed,
            batch_size=self.batch_size,
        )
        self.rows = list(sampler)
        self.workers = int(workers)
        self.method = str(cfg.get("MULTI_PROCESSING_METHOD", "forkserver"))
        self.cache_bytes = float(cache_mb) * 2**20
        self.cache: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def labels_valid(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        idx = [r.idx for r in self.rows]
        labels = torch.as_tensor(self.all_labels[idx], dtype=torch.long, device=device)
        valid = torch.as_tensor([not r.padding for r in self.rows], device=device)
        return labels, valid

    def _loader(self, rows: list[Any]) -> Any:
        from vissl.data import build_collate_fn, seed_worker

        kwargs: dict[str, Any] = {}
        if self.workers > 0:
            kwargs["worker_init_fn"] = functools.partial(
                seed_worker, seed=self.seed, rank=get_rank()
            )
            kwargs["multiprocessing_context"] = self.method
        return torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=rows,  # type: ignore[arg-type]
            collate_fn=build_collate_fn(self.cfg, self.split),
            num_workers=self.workers,
            # its own generator: a pass never draws from the global RNG
            generator=torch.Generator().manual_seed(self.seed),
            **kwargs,
        )

    def batches(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first row, input batch on the host)`` over rows ``start:stop``."""
        stop = len(self.rows) if stop is None else stop
        if self.cache is not None:
            for s in range(start, stop, self.batch_size):
                yield s, self.cache[s : min(stop, s + self.batch_size)]
            return
        full = start == 0 and stop == len(self.rows)
        kept: list[torch.Tensor] = []
        size = 0.0
        pos = start
        for batch in self._loader(self.rows[start:stop]):
            x = batch["data"][0]
            if full and self.cache_bytes > 0 and size <= self.cache_bytes:
                kept.append(x)
                size += x.numel() * x.element_size()
            yield pos, x
            pos += x.shape[0]
        if full and kept and size <= self.cache_bytes:
            self.cache = torch.cat(kept)


# ---------------------------------------------------------------------- online kNN
class OnlineKnnHook(_MonitorHook):
    """The online kNN monitor (``HOOKS.ONLINE_KNN``; see the module docstring).

    Args:
        cfg: the ``config`` section (the data of the bank and queries derive from it).
        topk, sigma, l2_norm: the kNN's ``k``, vote temperature and normalisation.
        bank_refresh_phases: train phases over which the whole bank is recomputed.
        cache_inputs_mb: cache the transformed images up to this size (MB).
        num_workers: data loader workers of the feature passes.
        bank, query: the ``BANK`` and ``QUERY`` settings.
    """

    meter_name = "online_knn"
    value_names = ("top_1", "top_5")

    def __init__(
        self,
        cfg: Any,
        topk: int = 20,
        sigma: float = 0.07,
        l2_norm: bool = True,
        bank_refresh_phases: int = 10,
        cache_inputs_mb: float = 256,
        num_workers: int = 0,
        bank: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.topk = _pos_int(topk, f"{KNN_KEY}.TOPK", what=" (neighbours that vote)")
        self.sigma = _number(sigma, f"{KNN_KEY}.SIGMA", 1e-12, None, "a positive number")
        self.l2_norm = bool(l2_norm)
        self.refresh_phases = _pos_int(bank_refresh_phases, f"{KNN_KEY}.BANK_REFRESH_PHASES")
        self.cache_mb = _number(cache_inputs_mb, f"{KNN_KEY}.CACHE_INPUTS_MB", 0, None, ">= 0")
        self.workers = _pos_int(num_workers, f"{KNN_KEY}.NUM_DATALOADER_WORKERS", minimum=0)
        self.bank_spec = dict(bank or {"SPLIT": "train", "BATCHSIZE_PER_REPLICA": 256})
        self.query_spec = dict(query or {"SPLIT": "test", "BATCHSIZE_PER_REPLICA": 256})
        for spec, key in ((self.bank_spec, "BANK"), (self.query_spec, "QUERY")):
            _choice(spec.get("SPLIT"), f"{KNN_KEY}.{key}.SPLIT", SPLITS)
            _pos_int(spec.get("BATCHSIZE_PER_REPLICA"), f"{KNN_KEY}.{key}.BATCHSIZE_PER_REPLICA")
        self.bank_set: _FeatureSet | None = None
        self.query_set: _FeatureSet | None = None
        self.bank: torch.Tensor | None = None
        self.bank_labels: torch.Tensor | None = None
        self.bank_valid: torch.Tensor | None = None
        self.num_classes = 0
        self.task: SelfSupervisionTask | None = None
        #: seconds spent in the monitor's passes and kNN (this rank), for cost reports
        self.seconds = 0.0
        self.start_seconds = 0.0  # of which filling the bank at the start
        self._queries: torch.Tensor | None = None
        self._last_step = -1
        self.history: list[dict[str, Any]] = []

    @classmethod
    def from_config(cls, cfg: Any) -> OnlineKnnHook:
        knn = cfg.HOOKS.ONLINE_KNN
        return cls(
            cfg,
            topk=knn.TOPK,
            sigma=knn.SIGMA,
            l2_norm=knn.L2_NORM_FEATS,
            bank_refresh_phases=knn.BANK_REFRESH_PHASES,
            cache_inputs_mb=knn.CACHE_INPUTS_MB,
            num_workers=knn.NUM_DATALOADER_WORKERS,
            bank=_as_plain(knn.BANK),
            query=_as_plain(knn.QUERY),
        )

    # ------------------------------------------------------------ features
    def _features(self, task: SelfSupervisionTask, x: torch.Tensor) -> torch.Tensor:
        x = x.to(task.device, non_blocking=True)
        if getattr(task, "channels_last", False) and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        feats = trunk_features(task.base_model, x)
        return F.normalize(feats, dim=1) if self.l2_norm else feats

    def _fill(self, task: SelfSupervisionTask, start: int, stop: int) -> None:
        """Recompute the bank rows ``start:stop`` of this rank (inside :func:`_eval_mode`)."""
        assert self.bank_set is not None
        for pos, x in self.bank_set.batches(start, stop):
            feats = self._features(task, x)
            if self.bank is None:
                self.bank = torch.zeros(len(self.bank_set), feats.shape[1], device=task.device)
            self.bank[pos : pos + feats.shape[0]] = feats

    def _slice(self, train_phase_idx: int) -> tuple[int, int]:
        """The bank rows recomputed at the end of train phase ``train_phase_idx``."""
        assert self.bank_set is not None
        n = len(self.bank_set)
        j = train_phase_idx % self.refresh_phases
        return n * j // self.refresh_phases, n * (j + 1) // self.refresh_phases

    def on_start(self, task: SelfSupervisionTask) -> None:
        super().on_start(task)
        self.task = task
        if not any(p["train"] for p in task.phases):
            return
        import time

        t0 = time.perf_counter()
        if self.bank_set is None:
            self.bank_set = _FeatureSet(
                self.cfg, self.bank_spec, f"{KNN_KEY}.BANK", self.workers, self.cache_mb
            )
            self.query_set = _FeatureSet(
                self.cfg, self.query_spec, f"{KNN_KEY}.QUERY", self.workers, self.cache_mb
            )
            self.bank_labels, self.bank_valid = self.bank_set.labels_valid(task.device)
            self.num_classes = int(
                max(self.bank_set.all_labels.max(), self.query_set.all_labels.max()) + 1
            )
        with _eval_mode(task.base_model, rank0_buffers=True):
            self._fill(task, 0, len(self.bank_set))
        self.start_seconds = time.perf_counter() - t0
        self.seconds += self.start_seconds
        logger.info(
            "online kNN: bank of %d samples filled (%d on this rank), %d queries, k=%d, "
            "sigma=%g, refreshed over %d train phases",
            len(self.bank_set.dataset),
            len(self.bank_set),
            len(self.query_set.dataset) if self.query_set is not None else 0,
            self.topk,
            self.sigma,
            self.refresh_phases,
        )

    def _phase_features(self, task: SelfSupervisionTask) -> None:
        """The phase's forwards: the bank slice (all of it after the last train phase)
        and the queries' features, kept for the kNN in :meth:`phase_end_sync`."""
        import time

        assert self.bank_set is not None and self.query_set is not None
        t0 = time.perf_counter()
        last = task.train_phase_idx + 1 >= task.num_train_phases
        start, stop = (0, len(self.bank_set)) if last else self._slice(task.train_phase_idx)
        feats: list[torch.Tensor] = []
        with _eval_mode(task.base_model, rank0_buffers=True):
            if stop > start:
                self._fill(task, start, stop)
            for _, x in self.query_set.batches():
                feats.append(self._features(task, x))
        self._queries = torch.cat(feats)
        self.seconds += time.perf_counter() - t0

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        super().on_phase_start(task)
        self._queries = None
        self._last_step = task.steps_per_phase("TRAIN") if task.train else -1

    def on_step(self, task: SelfSupervisionTask) -> None:
        # The phase's forwards run after its last step rather than at phase end, where
        # the loader workers already make the next phase's first batches: on a machine
        # with few cores they would compete. The weights are those of the phase end.
        if task.train and self.bank_set is not None and task.local_iteration_num == self._last_step:
            self._phase_features(task)

    def phase_end_sync(self) -> None:
        import time

        task = self.task
        if task is None or self.bank_set is None or self.query_set is None:
            return
        if self._queries is None:  # (a phase that ended early, or resumed at its end)
            self._phase_features(task)
        t0 = time.perf_counter()
        queries, self._queries = self._queries, None
        assert queries is not None
        q_labels, q_valid = self.query_set.labels_valid(task.device)
        assert self.bank is not None and self.bank_labels is not None
        assert self.bank_valid is not None
        counts = distributed_knn(
            queries,
            q_labels,
            q_valid,
            self.bank,
            self.bank_labels,
            self.bank_valid,
            k=self.topk,
            sigma=self.sigma,
            num_classes=self.num_classes,
        ).tolist()  # one host read per phase
        total = max(counts[2], 1.0)
        self.values = {"top_1": 100.0 * counts[0] / total, "top_5": 100.0 * counts[1] / total}
        self.seconds += time.perf_counter() - t0
        self.history.append({"train_phase_idx": task.train_phase_idx, **self.values})

    def state_dict(self) -> dict[str, Any]:
        return {"values": dict(self.values)}


# ---------------------------------------------------------------------- linear probe
def _true_labels(dataset: Any) -> np.ndarray | None:
    """The class labels of a :class:`~vissl.data.GenericSSLDataset`'s samples, in index
    order, whatever its LABEL_TYPE (None when its data has none)."""
    label_objs = getattr(dataset, "label_objs", None)
    if label_objs:
        labels = label_objs[0]
        if isinstance(labels, list):
            return None
    else:
        objs = getattr(dataset, "data_objs", None) or []
        labels = objs[0].get_labels() if objs else None
        if labels is None:
            return None
    labels = np.asarray(labels, dtype=np.int64)
    sub = getattr(dataset, "sub_set", None)
    return labels[sub] if sub is not None else labels


class LinearProbe:
    """A linear classifier with its own SGD, replicated on every rank.

    :meth:`step` counts the batch's top-1/top-5 hits and loss (before the update, on the
    device), then takes one SGD step on the cross-entropy with the gradients averaged
    across ranks (one all-reduce), so every rank keeps the same weights.
    """

    def __init__(
        self,
        dim: int,
        num_classes: int,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        seed: int,
        device: torch.device,
    ) -> None:
        gen = torch.Generator().manual_seed(int(seed))
        self.layer = nn.Linear(dim, num_classes)
        bound = 1.0 / math.sqrt(dim)  # nn.Linear's init, from a generator of its own
        with torch.no_grad():
            self.layer.weight.uniform_(-bound, bound, generator=gen)
            self.layer.bias.uniform_(-bound, bound, generator=gen)
        self.layer.to(device)
        self.num_classes = num_classes
        self.optimizer = torch.optim.SGD(
            self.layer.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )
        #: [top-1 hits, top-5 hits, samples, summed loss] of the phase, on the device
        self.counts = torch.zeros(4, dtype=torch.float64, device=device)

    def step(self, feats: torch.Tensor, labels: torch.Tensor) -> None:
        params = list(self.layer.parameters())
        # fp32 and with gradients, whatever the step's autocast and grad mode
        with torch.enable_grad(), torch.autocast(feats.device.type, enabled=False):
            logits = self.layer(feats.detach().float())
            loss = F.cross_entropy(logits, labels)
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            top = logits.topk(min(5, self.num_classes), dim=1).indices
            hits = top.eq(labels[:, None])
            n = labels.shape[0]
            self.counts += torch.stack(
                [
                    hits[:, 0].sum().double(),
                    hits.any(dim=1).sum().double(),
                    torch.full((), float(n), dtype=torch.float64, device=feats.device),
                    loss.detach().double() * n,
                ]
            )
            flat = torch.cat([g.reshape(-1) for g in grads])
            all_reduce_mean(flat)
            offset = 0
            for p in params:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {
            "layer": {k: v.detach().cpu() for k, v in self.layer.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.layer.load_state_dict(state["layer"])
        self.optimizer.load_state_dict(state["optimizer"])


class OnlineLinearProbeHook(_MonitorHook):
    """The online linear probe (``HOOKS.ONLINE_LINEAR_PROBE``; see the module docstring)."""

    meter_name = "online_linear_probe"
    value_names = ("top_1", "top_5", "loss")

    def __init__(
        self,
        feature: str = "trunk",
        num_classes: int = -1,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.feature = _choice(feature, f"{PROBE_KEY}.FEATURE", FEATURES)
        if num_classes != -1:
            _pos_int(num_classes, f"{PROBE_KEY}.NUM_CLASSES", minimum=2, what=" (or -1: auto)")
        self.num_classes = int(num_classes)
        self.lr = _number(lr, f"{PROBE_KEY}.LR", 1e-12, None, "a positive number")
        self.momentum = _number(momentum, f"{PROBE_KEY}.MOMENTUM", 0, 1, "in [0, 1)")
        self.weight_decay = _number(weight_decay, f"{PROBE_KEY}.WEIGHT_DECAY", 0, None, ">= 0")
        self.seed = int(seed)
        self.probe: LinearProbe | None = None
        self._pending: dict[str, Any] | None = None  # a checkpoint's probe, before it exists
        self._pending_counts: torch.Tensor | None = None
        self.capture: TrunkCapture | None = None
        self.label_table: torch.Tensor | None = None
        self._warned = False
        self._warned_empty = False

    @classmethod
    def from_config(cls, cfg: Any) -> OnlineLinearProbeHook:
        p = cfg.HOOKS.ONLINE_LINEAR_PROBE
        return cls(
            feature=p.FEATURE,
            num_classes=p.NUM_CLASSES,
            lr=p.LR,
            momentum=p.MOMENTUM,
            weight_decay=p.WEIGHT_DECAY,
            seed=int(cfg.get("SEED_VALUE", 0)),
        )

    def on_start(self, task: SelfSupervisionTask) -> None:
        super().on_start(task)
        dataset = getattr(task, "datasets", {}).get("TRAIN")
        if dataset is None:
            return
        label_type = str(getattr(dataset, "label_type", "standard"))
        labels = _true_labels(dataset)
        if not getattr(dataset, "label_objs", None) and label_type == "sample_index":
            if labels is None:
                raise ConfigError(
                    f"{PROBE_KEY}.USE: config.DATA.TRAIN.LABEL_TYPE is sample_index and its "
                    "data has no labels to look up; give config.DATA.TRAIN.LABEL_SOURCES or "
                    "turn the probe off.",
                    f"{PROBE_KEY}.USE",
                )
            self.label_table = torch.as_tensor(labels, dtype=torch.long, device=task.device)
        elif not getattr(dataset, "label_objs", None) and label_type == "zero":
            raise ConfigError(
                f"{PROBE_KEY}.USE: config.DATA.TRAIN.LABEL_TYPE is zero (no class labels); "
                "use standard or sample_index with labelled data, or turn the probe off.",
                f"{PROBE_KEY}.USE",
            )
        if self.num_classes == -1:
            if labels is None or len(labels) == 0:
                raise ConfigError(
                    f"{PROBE_KEY}.NUM_CLASSES=-1 but the TRAIN data's labels are not known "
                    "here: set the number of classes.",
                    f"{PROBE_KEY}.NUM_CLASSES",
                )
            self.num_classes = int(labels.max()) + 1
        if self.feature == "trunk" and self.capture is None:
            self.capture = TrunkCapture(_trunk_of(task))

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        super().on_phase_start(task)
        if self.capture is not None:
            self.capture.armed = bool(task.train)
            self.capture.outputs = []

    def _ensure_probe(self, dim: int, device: torch.device) -> LinearProbe:
        if self.probe is None:
            self.probe = LinearProbe(
                dim,
                self.num_classes,
                lr=self.lr,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
                seed=self.seed,
                device=device,
            )
            if self._pending is not None:
                self.probe.load_state_dict(self._pending)
                self._pending = None
            if self._pending_counts is not None:
                self.probe.counts.copy_(self._pending_counts)
                self._pending_counts = None
        return self.probe

    def on_forward(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        if self.feature == "trunk":
            feats = self.capture.take() if self.capture is not None else None
        else:
            feats = _model_output_features(task.last_batch.model_output)
        target = task.last_batch.sample.get("target")
        if feats is None or not isinstance(target, torch.Tensor):
            return
        target = target.reshape(-1)
        if target.shape[0] != feats.shape[0]:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "online linear probe: %d feature rows but %d targets in the batch; the "
                    "probe skips such batches",
                    feats.shape[0],
                    target.shape[0],
                )
            return
        labels = self.label_table[target.long()] if self.label_table is not None else target
        self._ensure_probe(feats.shape[1], feats.device).step(feats, labels.long())

    def reset_phase(self) -> None:
        super().reset_phase()
        if self.probe is not None:
            self.probe.counts.zero_()
        self._pending_counts = None

    def phase_end_sync(self) -> None:
        if self.probe is None:
            counts = torch.zeros(4, dtype=torch.float64, device=self.device)
        else:
            counts = self.probe.counts.clone()
        c = all_reduce_sum(counts).tolist()  # one host read per phase
        if c[2] == 0 and not self._warned_empty:
            self._warned_empty = True
            logger.warning(
                "online linear probe: no features of this train phase reached the probe%s",
                " (with MODEL.COMPILE the trunk's forward hook may not run: use FEATURE: heads)"
                if self.feature == "trunk"
                else "",
            )
        n = max(c[2], 1.0)
        self.values = {
            "top_1": 100.0 * c[0] / n,
            "top_5": 100.0 * c[1] / n,
            "loss": c[3] / n,
        }

    def phase_state(self) -> dict[str, Any]:
        counts = self.probe.counts if self.probe is not None else self._pending_counts
        return {} if counts is None else {"counts": counts.detach().cpu()}

    def load_phase_state(self, state: Mapping[str, Any]) -> None:
        counts = state.get("counts")
        if counts is None:
            return
        counts = torch.as_tensor(counts, dtype=torch.float64)
        if self.probe is not None:
            self.probe.counts.copy_(counts)
        else:
            self._pending_counts = counts.to(self.device)

    def state_dict(self) -> dict[str, Any]:
        if self.probe is not None:
            return {"probe": self.probe.state_dict()}
        return {"probe": self._pending} if self._pending is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        probe = state.get("probe")
        if probe is None:
            return
        if self.probe is not None:
            self.probe.load_state_dict(probe)
        else:
            self._pending = probe

    def on_end(self, task: SelfSupervisionTask) -> None:
        if self.capture is not None:
            self.capture.remove()
            self.capture = None

    on_exception = on_end


# ---------------------------------------------------------------------- collapse
class CollapseMonitorHook(_MonitorHook):
    """RankMe and the normalised std of each train phase's embeddings
    (``HOOKS.COLLAPSE_MONITOR``; see the module docstring)."""

    meter_name = "collapse_monitor"
    value_names = ("rankme", "std")

    def __init__(self, num_embeddings: int = 2048, feature: str = "heads") -> None:
        super().__init__()
        self.num_embeddings = _pos_int(num_embeddings, f"{COLLAPSE_KEY}.NUM_EMBEDDINGS", minimum=2)
        self.feature = _choice(feature, f"{COLLAPSE_KEY}.FEATURE", FEATURES)
        self.buffer: torch.Tensor | None = None
        self.filled = 0
        self.capture: TrunkCapture | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> CollapseMonitorHook:
        c = cfg.HOOKS.COLLAPSE_MONITOR
        return cls(num_embeddings=c.NUM_EMBEDDINGS, feature=c.FEATURE)

    @property
    def per_rank(self) -> int:
        return -(-self.num_embeddings // get_world_size())

    def on_start(self, task: SelfSupervisionTask) -> None:
        super().on_start(task)
        if self.feature == "trunk" and self.capture is None:
            self.capture = TrunkCapture(_trunk_of(task))

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        super().on_phase_start(task)
        if self.capture is not None:
            self.capture.armed = bool(task.train)
            self.capture.outputs = []

    def on_forward(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        if self.feature == "trunk":
            emb = self.capture.take() if self.capture is not None else None
        else:
            emb = _model_output_features(task.last_batch.model_output)
        if emb is None or self.filled >= self.per_rank:
            return
        if self.buffer is None or self.buffer.shape[1] != emb.shape[1]:
            self.buffer = torch.zeros(self.per_rank, emb.shape[1], device=emb.device)
            self.filled = 0
        n = min(emb.shape[0], self.per_rank - self.filled)
        self.buffer[self.filled : self.filled + n] = emb[:n]
        self.filled += n

    def reset_phase(self) -> None:
        super().reset_phase()
        self.filled = 0

    def phase_end_sync(self) -> None:
        # every rank ran the same steps: all have a buffer of the same width, or none
        if self.buffer is None:
            return
        counts = torch.cat(
            _all_gather(torch.tensor([self.filled], dtype=torch.long, device=self.buffer.device))
        ).tolist()
        rows = [b[:c] for b, c in zip(_all_gather(self.buffer), counts, strict=True)]
        emb = torch.cat(rows)
        if emb.shape[0] < 2:
            return
        self.values = {"rankme": float(rankme(emb)), "std": float(normalized_std(emb))}

    def phase_state(self) -> dict[str, Any]:
        if self.buffer is None:
            return {}
        return {"embeddings": self.buffer[: self.filled].detach().cpu()}

    def load_phase_state(self, state: Mapping[str, Any]) -> None:
        emb = state.get("embeddings")
        if emb is None:
            return
        emb = torch.as_tensor(emb)
        self.buffer = torch.zeros(self.per_rank, emb.shape[1], device=self.device)
        self.filled = min(emb.shape[0], self.per_rank)
        self.buffer[: self.filled] = emb[: self.filled].to(self.device)

    def on_end(self, task: SelfSupervisionTask) -> None:
        if self.capture is not None:
            self.capture.remove()
            self.capture = None

    on_exception = on_end


# ---------------------------------------------------------------------- from config
def build_online_monitor_hooks(cfg: Any) -> list[VisslHook]:
    """The hooks of ``HOOKS.ONLINE_KNN``, ``ONLINE_LINEAR_PROBE`` and ``COLLAPSE_MONITOR``
    that are turned on (``USE``)."""
    hooks_cfg = cfg.HOOKS
    hooks: list[VisslHook] = []
    if hooks_cfg.get("ONLINE_KNN", {}).get("USE", False):
        hooks.append(OnlineKnnHook.from_config(cfg))
    if hooks_cfg.get("ONLINE_LINEAR_PROBE", {}).get("USE", False):
        hooks.append(OnlineLinearProbeHook.from_config(cfg))
    if hooks_cfg.get("COLLAPSE_MONITOR", {}).get("USE", False):
        hooks.append(CollapseMonitorHook.from_config(cfg))
    return hooks


__all__ = [
    "CollapseMonitorHook",
    "LinearProbe",
    "MonitorMeter",
    "OnlineKnnHook",
    "OnlineLinearProbeHook",
    "TrunkCapture",
    "build_online_monitor_hooks",
    "distributed_knn",
    "knn_topk_shard",
    "monitor_split_config",
    "normalized_std",
    "rankme",
    "trunk_features",
]
