"""The ``extract_label_predictions`` engine: the classes a model predicts for every sample.

    python tools/run_distributed_engines.py config=<a classifier's config> \
        engine_name=extract_label_predictions \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint>

The model (trunk and heads, e.g. a linear-evaluation model) runs in eval mode over every
split with data sources (TRAIN, TEST). As in VISSL, exactly one meter must be configured
(``METERS.names``): it is updated and its value logged per split (a check of the saved
predictions), and it gives the predictions: its ``get_predictions(outputs)`` when it has
one (VISSL's contract: ``(predictions, scores)``, one tensor per output), otherwise the
``max(topk_values)`` best classes and the softmax of each output.

Each rank writes VISSL's files, one set per split and output, to
``EXTRACT_FEATURES.OUTPUT_DIR`` (or the run's checkpoint folder)::

    rank{r}_{split}_{layer}_predictions.npy   (N, K) class indices, best first
    rank{r}_{split}_{layer}_conf_scores.npy   (N, C) softmax scores
    rank{r}_{split}_{layer}_targets.npy       (N, T) targets (T = 1 for class indices)
    rank{r}_{split}_{layer}_inds.npy          (N,)   dataset indices, increasing
    rank{r}_{split}_{layer}_images.npy        (N,)   image paths ("" for in-memory data)

``layer`` is ``heads`` (one model output; ``heads0``, ``heads1``, ... for several) or the
layer names of ``MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP`` (repeated
names made unique as in VISSL: ``res4``, ``res4_1``). The repeats a distributed sampler
pads a rank's share with are not written. :class:`ExtractedLabelPredictionsLoader` reads
the files of all ranks back in dataset-index order.
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vissl.config.attr_dict import AttrDict
from vissl.engines import Engine, register_engine
from vissl.engines.eval_data import EvalBatches, split_has_data
from vissl.engines.run_context import RunContext
from vissl.errors import ConfigError
from vissl.utils.distributed import get_rank
from vissl.utils.logger import setup_logging, shutdown_logging

logger = logging.getLogger(__name__)

#: The kinds of files written per rank, split and layer (VISSL's names).
PREDICTION_FILES = ("predictions", "conf_scores", "targets", "inds", "images")


def unique_layer_names(names: Sequence[str]) -> list[str]:
    """VISSL's renaming of repeated names: ``[res4, res4, res5] -> [res4, res4_1, res5]``."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        out.append(f"{name}_{count}" if count else name)
        seen[name] = count + 1
    return out


def default_label_predictions(
    outputs: Sequence[torch.Tensor], topk: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """VISSL's ``accuracy_list_meter.get_predictions``: per output, the ``topk`` best class
    indices (best first) and the softmax scores of all classes."""
    preds, scores = [], []
    for out in outputs:
        logits = out.detach().float()
        k = min(int(topk), logits.shape[1])
        preds.append(logits.topk(k, dim=1, largest=True, sorted=True).indices)
        scores.append(logits.softmax(dim=1))
    return preds, scores


def _the_meter(cfg: Any, device: torch.device) -> Any:
    from vissl.meters import build_meters

    meters = build_meters(cfg.METERS, device=device)
    if len(meters) != 1:
        raise ConfigError(
            "engine_name=extract_label_predictions needs exactly one meter in "
            f"config.METERS.names (it gives the predictions); got {len(meters)}: "
            f"{[getattr(m, 'name', type(m).__name__) for m in meters]}. For a classifier use "
            "names: [accuracy_list_meter] with accuracy_list_meter.topk_values, e.g. [1, 5].",
            "config.METERS.names",
        )
    return meters[0]


def _build_eval_model(cfg: Any, device: torch.device) -> torch.nn.Module:
    from vissl.models import build_model
    from vissl.utils.weights_init import init_model_from_weights_params_file

    model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
    if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
        init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
    else:
        logger.warning(
            "no weights given (config.MODEL.WEIGHTS_INIT.PARAMS_FILE): predicting with a "
            "randomly initialised model."
        )
    return model.eval()


class _PredictionStore:
    """Predictions of one layer and split on this rank, keyed by dataset index."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in PREDICTION_FILES[:4]}

    def add(
        self, preds: torch.Tensor, scores: torch.Tensor, targets: torch.Tensor, inds: torch.Tensor
    ) -> None:
        n = inds.shape[0]
        self.parts["predictions"].append(preds.detach().cpu().reshape(n, -1).numpy())
        self.parts["conf_scores"].append(scores.detach().float().cpu().reshape(n, -1).numpy())
        self.parts["targets"].append(targets.detach().cpu().reshape(n, -1).numpy())
        self.parts["inds"].append(inds.detach().cpu().reshape(n).numpy().astype(np.int64))

    def save(self, folder: str, split: str, layer: str, image_paths: Sequence[str]) -> int:
        merged = {k: np.concatenate(v) for k, v in self.parts.items() if v}
        if not merged:
            return 0
        # Sorted by index, each index once (VISSL keeps the first copy).
        _, first = np.unique(merged["inds"], return_index=True)
        merged = {k: v[first] for k, v in merged.items()}
        merged["images"] = np.array(
            [image_paths[i] if i < len(image_paths) else "" for i in merged["inds"]], dtype=str
        )
        prefix = os.path.join(folder, f"rank{get_rank()}_{split}_{layer}")
        for kind in PREDICTION_FILES:
            np.save(f"{prefix}_{kind}.npy", merged[kind])
        return len(first)


def _dataset_image_paths(dataset: Any) -> list[str]:
    """Image path of each dataset index (after DATA_LIMIT), or [] for in-memory data."""
    paths = list(dataset.get_image_paths()[0])
    if not paths:
        return []
    sub_set = getattr(dataset, "sub_set", None)
    if sub_set is None:
        return paths
    return [paths[int(i)] for i in sub_set]


def extract_label_predictions_main(
    cfg: Any, checkpoint_folder: str, local_rank: int = 0
) -> dict[str, Any]:
    """Write the label predictions of this rank; returns ``{split: meter value}``."""
    from vissl.engines.train import set_seeds
    from vissl.models.model_helpers import get_trunk_output_feature_names
    from vissl.utils.env import get_device

    cfg = AttrDict(copy.deepcopy(cfg.to_dict()))
    setup_logging(checkpoint_folder, get_rank(), verbose=bool(cfg.VERBOSE))
    try:
        device = get_device(cfg, local_rank)
        # The same seed on every rank: a randomly initialised model is the same model.
        set_seeds(cfg, 0)
        meter = _the_meter(cfg, device)
        get_predictions = getattr(meter, "get_predictions", None)
        topk = max(getattr(meter, "topk_values", None) or [1])
        model = _build_eval_model(cfg, device)
        layer_names = unique_layer_names(get_trunk_output_feature_names(cfg.MODEL)) or ["heads"]
        out_dir = str(cfg.EXTRACT_FEATURES.OUTPUT_DIR or checkpoint_folder)
        os.makedirs(out_dir, exist_ok=True)
        values: dict[str, Any] = {}
        for split in ("TRAIN", "TEST"):
            if not split_has_data(cfg, split):
                continue
            batches = EvalBatches(cfg, split, device)
            meter.reset()
            stores: dict[str, _PredictionStore] = {}
            names = layer_names
            with torch.no_grad():
                for sample, batch in batches:
                    output = model(sample["input"])
                    outputs = list(output) if isinstance(output, list | tuple) else [output]
                    if len(outputs) != len(names):
                        names = [f"{layer_names[0]}{i}" for i in range(len(outputs))]
                    target, valid = sample["target"], sample.get("data_valid")
                    if getattr(meter, "supports_valid_mask", False):
                        meter.update(outputs, target, valid=valid)
                    else:
                        meter.update(outputs, target)
                    if get_predictions is not None:
                        preds, scores = get_predictions(outputs)
                    else:
                        preds, scores = default_label_predictions(outputs, topk)
                    inds = batch["data_idx"][0]
                    # Drop the sampler's padding (data_valid 0): another rank has the sample.
                    keep = (
                        valid.ne(0).cpu()
                        if isinstance(valid, torch.Tensor)
                        else torch.ones(inds.shape[0], dtype=torch.bool)
                    )
                    for name, pred, score in zip(names, preds, scores, strict=True):
                        stores.setdefault(name, _PredictionStore()).add(
                            pred.cpu()[keep], score.cpu()[keep], target.cpu()[keep], inds[keep]
                        )
            meter.sync_state()
            values[split] = meter.value
            logger.info("%s: %s %s", split, meter.name, values[split])
            image_paths = _dataset_image_paths(batches.dataset)
            for name, store in stores.items():
                n = store.save(out_dir, split.lower(), name, image_paths)
                logger.info(
                    "%s: predictions of %s for %d samples written to %s", split, name, n, out_dir
                )
        return values
    finally:
        shutdown_logging()


@register_engine("extract_label_predictions")
class ExtractLabelPredictionsEngine(Engine):
    """Save the predicted classes (and scores) of a model for every sample of TRAIN/TEST."""

    def run_engine(self, ctx: RunContext) -> Any:
        return extract_label_predictions_main(ctx.cfg, ctx.checkpoint_folder, ctx.local_rank)


class ExtractedLabelPredictionsLoader:
    """Read the files of the ``extract_label_predictions`` engine back, in index order."""

    @staticmethod
    def layers(folder: str, split: str) -> list[str]:
        """Layers with predictions of ``split`` in ``folder``."""
        pattern = re.compile(rf"^rank\d+_{re.escape(split.lower())}_(.+)_predictions\.npy$")
        return sorted({m.group(1) for f in os.listdir(folder) if (m := pattern.match(f))})

    @staticmethod
    def load_predictions(folder: str, split: str, layer: str = "heads") -> dict[str, np.ndarray]:
        """``{"predictions", "conf_scores", "targets", "inds", "images"}`` of all ranks.

        Rows are sorted by dataset index, each index once.

        Raises:
            FileNotFoundError: no predictions of ``split`` and ``layer`` in ``folder``.
        """
        paths = sorted(
            glob.glob(os.path.join(folder, f"rank*_{split.lower()}_{layer}_predictions.npy"))
        )
        stems = [
            p[: -len("_predictions.npy")]
            for p in paths
            if re.fullmatch(
                rf"rank\d+_{re.escape(split.lower())}_{re.escape(layer)}",
                os.path.basename(p)[: -len("_predictions.npy")],
            )
        ]
        if not stems:
            found = (
                ExtractedLabelPredictionsLoader.layers(folder, split)
                if os.path.isdir(folder)
                else []
            )
            raise FileNotFoundError(
                f"no label predictions of split {split.lower()!r} and layer {layer!r} in "
                f"{folder} (layers found: {found or 'none'})"
            )
        parts: dict[str, list[np.ndarray]] = {k: [] for k in PREDICTION_FILES}
        for stem in stems:
            for kind in PREDICTION_FILES:
                parts[kind].append(np.load(f"{stem}_{kind}.npy"))
        merged = {k: np.concatenate(v) for k, v in parts.items()}
        _, first = np.unique(merged["inds"], return_index=True)
        return {k: v[first] for k, v in merged.items()}
