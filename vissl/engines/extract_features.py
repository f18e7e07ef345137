"""The ``extract_features`` engine: run a model over the data and save features as ``.npy``.

    python tools/run_distributed_engines.py config=... engine_name=extract_features \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint>

For each split with data sources (TRAIN, TEST) and each feature layer, every rank writes
VISSL's files ``rank{r}_chunk{c}_{split}_{layer}_{features,targets,inds}.npy`` to
``EXTRACT_FEATURES.OUTPUT_DIR`` (or the checkpoint folder). Layers: the trunk layers of
``MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP`` in feature-evaluation mode;
the trunk output (``trunk``) with ``EXTRACT_TRUNK_FEATURES_ONLY``; else the model output
(``heads``). ``EXTRACT_FEATURES.CHUNK_THRESHOLD``: 0 writes every batch, N > 0 every N
samples, -1 once at the end. :class:`ExtractedFeaturesLoader` reads them back in sample order.
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vissl.config.attr_dict import AttrDict
from vissl.engines import Engine, register_engine
from vissl.engines.eval_data import EvalBatches, split_has_data
from vissl.engines.run_context import RunContext
from vissl.engines.train import set_seeds
from vissl.utils.distributed import get_rank
from vissl.utils.env import get_device
from vissl.utils.logger import setup_logging, shutdown_logging

logger = logging.getLogger(__name__)


def _as_list(output: Any) -> list[torch.Tensor]:
    return list(output) if isinstance(output, list | tuple) else [output]


class _ChunkWriter:
    """Accumulates features of one layer and writes them in chunks."""

    def __init__(self, folder: str, split: str, layer: str, threshold: int) -> None:
        self.folder, self.split, self.layer, self.threshold = folder, split, layer, threshold
        self.feats: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []
        self.inds: list[np.ndarray] = []
        self.count = 0
        self.chunk = 0

    def add(self, feats: torch.Tensor, targets: torch.Tensor, inds: torch.Tensor) -> None:
        self.feats.append(feats.detach().float().reshape(feats.shape[0], -1).cpu().numpy())
        self.targets.append(targets.detach().cpu().numpy())
        self.inds.append(inds.detach().cpu().numpy())
        self.count += feats.shape[0]
        if self.threshold == 0 or (self.threshold > 0 and self.count >= self.threshold):
            self.flush()

    def flush(self) -> None:
        if not self.feats:
            return
        prefix = os.path.join(
            self.folder, f"rank{get_rank()}_chunk{self.chunk}_{self.split}_{self.layer}"
        )
        np.save(f"{prefix}_features.npy", np.concatenate(self.feats))
        np.save(f"{prefix}_targets.npy", np.concatenate(self.targets))
        np.save(f"{prefix}_inds.npy", np.concatenate(self.inds))
        self.feats, self.targets, self.inds, self.count = [], [], [], 0
        self.chunk += 1


def extract_main(
    cfg: Any,
    checkpoint_path: str | None,
    checkpoint_folder: str,
    local_rank: int = 0,
) -> dict[str, list[str]]:
    """Extract features in this process; returns ``{split: [layer, ...]}``."""
    from vissl.models import build_model
    from vissl.models.model_helpers import get_trunk_output_feature_names
    from vissl.utils.checkpoint import load_checkpoint
    from vissl.utils.weights_init import init_model_from_weights_params_file

    cfg = AttrDict(copy.deepcopy(cfg.to_dict()))
    setup_logging(checkpoint_folder, get_rank(), verbose=bool(cfg.VERBOSE))
    try:
        device = get_device(cfg, local_rank)
        # The same seed on every rank: a randomly initialised model is the same model.
        set_seeds(cfg, 0)
        model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
        if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
            init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
        elif checkpoint_path:
            state = load_checkpoint(checkpoint_path)
            weights = state["classy_state_dict"]["base_model"]["model"]
            model.load_state_dict(
                {f"trunk.{k}": v for k, v in weights["trunk"].items()}
                | {f"heads.{k}": v for k, v in weights["heads"].items()}
            )
            logger.info("features from the weights of %s", checkpoint_path)
        else:
            logger.warning(
                "no weights given (config.MODEL.WEIGHTS_INIT.PARAMS_FILE): extracting features "
                "of a randomly initialised model."
            )
        model.eval()
        fe = cfg.MODEL.FEATURE_EVAL_SETTINGS
        layer_names = get_trunk_output_feature_names(cfg.MODEL)
        get_features: Callable[[Any], list[torch.Tensor]] = model.get_features  # type: ignore[assignment]
        forward: Callable[[Any], list[torch.Tensor]] = get_features
        if not layer_names:
            if fe.EXTRACT_TRUNK_FEATURES_ONLY:
                layer_names = ["trunk"]
            else:
                forward, layer_names = (lambda x: _as_list(model(x))), ["heads"]
        out_dir = str(cfg.EXTRACT_FEATURES.OUTPUT_DIR or checkpoint_folder)
        os.makedirs(out_dir, exist_ok=True)
        threshold = int(cfg.EXTRACT_FEATURES.CHUNK_THRESHOLD)
        result: dict[str, list[str]] = {}
        for split in ("TRAIN", "TEST"):
            if not split_has_data(cfg, split):
                continue
            writers: dict[str, _ChunkWriter] = {}
            with torch.no_grad():
                for sample, batch in EvalBatches(cfg, split, device):
                    feats = forward(sample["input"])
                    if len(feats) != len(layer_names):
                        layer_names = [f"{layer_names[0]}{i}" for i in range(len(feats))]
                    inds = batch["data_idx"][0]
                    for name, feat in zip(layer_names, feats, strict=True):
                        writer = writers.setdefault(
                            name, _ChunkWriter(out_dir, split.lower(), name, threshold)
                        )
                        writer.add(feat, sample["target"], inds)
            for writer in writers.values():
                writer.flush()
            result[split] = list(writers)
            logger.info("%s: features of %s written to %s", split, list(writers), out_dir)
        return result
    finally:
        shutdown_logging()


@register_engine("extract_features")
class ExtractFeaturesEngine(Engine):
    """Save the features of a model for every sample of TRAIN and TEST."""

    def run_engine(self, ctx: RunContext) -> Any:
        return extract_main(ctx.cfg, ctx.checkpoint_path, ctx.checkpoint_folder, ctx.local_rank)


class ExtractedFeaturesLoader:
    """Read the files of the ``extract_features`` engine back, in sample order."""

    @staticmethod
    def load_features(folder: str, layer: str, split: str) -> dict[str, np.ndarray]:
        """``{"features", "targets", "inds"}`` of ``split`` (``train``/``test``) and ``layer``."""
        pattern = os.path.join(folder, f"rank*_chunk*_{split.lower()}_{layer}_features.npy")
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise FileNotFoundError(f"no features matching {pattern}")
        parts: dict[str, list[np.ndarray]] = {"features": [], "targets": [], "inds": []}
        for path in paths:
            stem = re.sub(r"_features\.npy$", "", path)
            for key in parts:
                parts[key].append(np.load(f"{stem}_{key}.npy"))
        merged = {k: np.concatenate(v) for k, v in parts.items()}
        # DistributedSampler pads with repeats: keep the first copy of each index.
        _, first = np.unique(merged["inds"], return_index=True)
        return {k: v[first] for k, v in merged.items()}
