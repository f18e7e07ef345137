"""The ``extract_cluster`` engine: the prototype each sample is assigned to by a SwAV model.

    python tools/run_distributed_engines.py config=<a SwAV config> engine_name=extract_cluster \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \
        config.DATA.TRAIN.TRANSFORMS=<one-crop transforms> \
        config.DATA.TRAIN.COLLATE_FUNCTION=default_collate

The model (trunk and ``swav_head``) runs in eval mode over every split with data sources
(TRAIN, TEST), one view per sample. Each sample's assignment is the argmax of its
prototype scores, one per set of prototypes (VISSL's ``extract_cluster``). The
assignments of every rank are gathered and written once, by the primary rank, in
dataset-index order (each index once; the distributed sampler's padding repeats are
dropped), to ``EXTRACT_FEATURES.OUTPUT_DIR`` (or the checkpoint folder)::

    {split}_cluster_assignments.npy   (N, H) int64: prototype index per set of prototypes
    {split}_cluster_inds.npy          (N,)   dataset indices, increasing
    {split}_cluster_targets.npy       (N, T) targets
    prototypes{h}.npy                 (K_h, D) the prototypes (the cluster centres)
    cluster_config.yaml               the run's config (its data settings)

:func:`load_cluster_assignments` reads them back;
``tools/cluster_assignments_to_dataset.py`` turns them into a ``disk_filelist`` data set.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import numpy as np
import torch

from vissl.config.attr_dict import AttrDict
from vissl.engines import Engine, register_engine
from vissl.engines.eval_data import EvalBatches, split_has_data
from vissl.engines.run_context import RunContext
from vissl.errors import ConfigError
from vissl.utils.distributed import all_gather_object, get_rank, is_primary
from vissl.utils.logger import setup_logging, shutdown_logging

logger = logging.getLogger(__name__)

ASSIGNMENT_FILES = ("cluster_assignments", "cluster_inds", "cluster_targets")
#: The run's resolved config, written next to the assignments.
CONFIG_FILE = "cluster_config.yaml"


def _swav_head(model: torch.nn.Module) -> Any:
    from vissl.models.heads.swav_head import find_swav_heads

    heads = find_swav_heads(model)
    if len(heads) != 1 or heads[0].nmb_heads == 0:
        raise ConfigError(
            "engine_name=extract_cluster needs a model with exactly one swav_head with "
            f"prototypes (found {len(heads)} swav_head); set config.MODEL.HEAD.PARAMS to the "
            "SwAV pretraining head, e.g. [[swav_head, {dims: [2048, 2048, 128], "
            "num_clusters: [3000]}]].",
            "config.MODEL.HEAD.PARAMS",
        )
    return heads[0]


def _scores(output: Any, num_sets: int) -> list[torch.Tensor]:
    """The prototype scores (the last ``num_sets`` tensors) of the model output."""
    if (
        isinstance(output, list | tuple)
        and len(output) == 1
        and not isinstance(output[0], torch.Tensor)
    ):
        output = output[0]
    return list(output)[-num_sets:]


def _merge(parts: list[Any]) -> dict[str, np.ndarray]:
    """Concatenate the ranks' arrays, sorted by dataset index, each index once."""
    nonempty = [p for p in parts if len(p["cluster_inds"])] or parts[:1]
    merged = {k: np.concatenate([p[k] for p in nonempty]) for k in parts[0]}
    _, first = np.unique(merged["cluster_inds"], return_index=True)
    return {k: v[first] for k, v in merged.items()}


def extract_cluster_main(cfg: Any, checkpoint_folder: str, local_rank: int = 0) -> dict[str, Any]:
    """Write the cluster assignments; returns ``{split: (N, H) assignments}`` on every rank."""
    from vissl.engines.extract_label_predictions import _build_eval_model
    from vissl.engines.train import set_seeds
    from vissl.utils.env import get_device

    cfg = AttrDict(copy.deepcopy(cfg.to_dict()))
    setup_logging(checkpoint_folder, get_rank(), verbose=bool(cfg.VERBOSE))
    try:
        device = get_device(cfg, local_rank)
        # The same seed on every rank: a randomly initialised model is the same model.
        set_seeds(cfg, 0)
        model = _build_eval_model(cfg, device)
        head = _swav_head(model)
        num_sets = int(head.nmb_heads)
        out_dir = str(cfg.EXTRACT_FEATURES.OUTPUT_DIR or checkpoint_folder)
        os.makedirs(out_dir, exist_ok=True)
        if is_primary():
            from vissl.utils.hydra_config import config_to_yaml

            # the data settings, for tools/cluster_assignments_to_dataset.py
            with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
                f.write(config_to_yaml(cfg))
            for h, layer in enumerate(head.prototype_layers()):
                np.save(
                    os.path.join(out_dir, f"prototypes{h}.npy"),
                    layer.weight.detach().float().cpu().numpy(),
                )
        result: dict[str, Any] = {}
        for split in ("TRAIN", "TEST"):
            if not split_has_data(cfg, split):
                continue
            assignments, inds_list, targets = [], [], []
            with torch.no_grad():
                for sample, batch in EvalBatches(cfg, split, device):
                    inputs = sample["input"]
                    inds = batch["data_idx"][0]
                    several = isinstance(inputs, list | tuple) and len(inputs) > 1
                    scores = [] if several else _scores(model(inputs), num_sets)
                    if several or scores[0].shape[0] != inds.shape[0]:
                        raise ConfigError(
                            f"extract_cluster: several views of the {split} samples; use one "
                            "view per sample "
                            f"(no ImgPilToMultiCrop/ImgReplicatePil in config.DATA.{split}."
                            "TRANSFORMS, COLLATE_FUNCTION: default_collate).",
                            f"config.DATA.{split}.TRANSFORMS",
                        )
                    valid = sample.get("data_valid")
                    keep = (
                        valid.ne(0).cpu()
                        if isinstance(valid, torch.Tensor)
                        else torch.ones(inds.shape[0], dtype=torch.bool)
                    )
                    best = torch.stack([s.argmax(dim=1) for s in scores], dim=1).cpu()
                    assignments.append(best[keep].numpy().astype(np.int64))
                    inds_list.append(inds[keep].numpy().astype(np.int64))
                    target = sample["target"].detach().cpu()[keep]
                    targets.append(target.reshape(target.shape[0], -1).numpy())
            mine = {
                "cluster_assignments": np.concatenate(assignments)
                if assignments
                else np.zeros((0, num_sets), dtype=np.int64),
                "cluster_inds": np.concatenate(inds_list)
                if inds_list
                else np.zeros((0,), dtype=np.int64),
                "cluster_targets": np.concatenate(targets)
                if targets
                else np.zeros((0, 1), dtype=np.int64),
            }
            merged = _merge(list(all_gather_object(mine)))  # type: ignore[arg-type]
            if is_primary():
                for kind, array in merged.items():
                    np.save(os.path.join(out_dir, f"{split.lower()}_{kind}.npy"), array)
                counts = np.bincount(merged["cluster_assignments"][:, 0], minlength=1)
                logger.info(
                    "%s: cluster assignments of %d samples written to %s (%d of %d prototypes "
                    "used by the first set)",
                    split,
                    len(merged["cluster_inds"]),
                    out_dir,
                    int((counts > 0).sum()),
                    int(head.num_clusters[0]),
                )
            result[split] = merged["cluster_assignments"]
        return result
    finally:
        shutdown_logging()


@register_engine("extract_cluster")
class ExtractClusterEngine(Engine):
    """Save the SwAV prototype assignment of every sample of TRAIN/TEST."""

    def run_engine(self, ctx: RunContext) -> Any:
        return extract_cluster_main(ctx.cfg, ctx.checkpoint_folder, ctx.local_rank)


def load_cluster_assignments(folder: str, split: str) -> dict[str, np.ndarray]:
    """``{"cluster_assignments", "cluster_inds", "cluster_targets"}`` of ``split``.

    Raises:
        FileNotFoundError: the engine wrote no assignments of ``split`` to ``folder``.
    """
    paths = {k: os.path.join(folder, f"{split.lower()}_{k}.npy") for k in ASSIGNMENT_FILES}
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"no cluster assignments of {split.lower()!r}: {missing[0]}")
    return {k: np.load(p) for k, p in paths.items()}
