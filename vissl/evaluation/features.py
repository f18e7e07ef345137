"""Extracted features of a model, as the evaluation benchmarks find, extract and read them.

The ``extract_features`` engine writes ``rank{r}_chunk{c}_{split}_{layer}_{features,targets,
inds}.npy`` files into a folder (``EXTRACT_FEATURES.OUTPUT_DIR``, else ``CHECKPOINT.DIR``);
these functions pick the layers of a config (:func:`feature_layers`), run the extraction or
reuse a folder given by the user (:func:`extract_or_locate_features`), and read a layer's
TRAIN and TEST features back (:func:`load_split_features`)::

    from vissl.evaluation.features import load_split_features

    data = load_split_features("checkpoints/nn_digits_quick_start", "trunk", "FEATURES.PATH")
    data["train"]["features"], data["test"]["targets"], data["test"]["inds"]
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from typing import Any

from vissl.errors import ConfigError

logger = logging.getLogger("vissl.tools")

_FEATURE_FILE = re.compile(r"^rank\d+_chunk\d+_(train|test)_(.+)_features\.npy$")
_FE_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS"


def layers_in_folder(folder: str) -> list[str]:
    """Layers with extracted TRAIN and TEST features in ``folder``."""
    found: dict[str, set[str]] = {}
    for name in os.listdir(folder):
        m = _FEATURE_FILE.match(name)
        if m:
            found.setdefault(m.group(2), set()).add(m.group(1))
    return sorted(layer for layer, splits in found.items() if splits == {"train", "test"})


def pool_layer_names(cfg: Any) -> list[str]:
    """Layer names of ``LINEAR_EVAL_FEAT_POOL_OPS_MAP`` (in feature-evaluation mode)."""
    from vissl.models.model_helpers import get_trunk_output_feature_names

    return list(get_trunk_output_feature_names(cfg.MODEL))


def extracted_layer_names(cfg: Any) -> list[str]:
    """The layers the ``extract_features`` engine writes for this config."""
    names = pool_layer_names(cfg)
    if names:
        return names
    fe = cfg.MODEL.FEATURE_EVAL_SETTINGS
    return ["trunk"] if fe.EVAL_MODE_ON and fe.EXTRACT_TRUNK_FEATURES_ONLY else ["heads"]


def select_feature_type(cfg: Any, feature_type: str, key: str) -> str:
    """Set ``MODEL.FEATURE_EVAL_SETTINGS`` so that extraction writes ``feature_type``.

    Raises:
        ConfigError: ``feature_type`` is neither trunk, heads nor a pooled layer.
    """
    fe = cfg.MODEL.FEATURE_EVAL_SETTINGS
    if feature_type == "trunk":
        fe.EVAL_MODE_ON, fe.EXTRACT_TRUNK_FEATURES_ONLY = True, True
        fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = []
    elif feature_type == "heads":
        fe.EVAL_MODE_ON, fe.EXTRACT_TRUNK_FEATURES_ONLY = True, False
        fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = []
    else:
        pooled = [item[0] for item in fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP]
        if feature_type not in pooled:
            raise ConfigError(
                f"{key}={feature_type!r} is not a feature type: use trunk, heads, or a layer "
                f"of {_FE_KEY}.LINEAR_EVAL_FEAT_POOL_OPS_MAP ({pooled or 'empty'}).",
                key,
            )
        fe.EVAL_MODE_ON = True
    return feature_type


def feature_layers(cfg: Any, feature_type: str, key: str) -> list[str]:
    """The layers to evaluate: ``[feature_type]`` (see :func:`select_feature_type`), or for
    ``""`` VISSL's choice, :func:`extracted_layer_names` (the config is left as it is)."""
    if feature_type == "":
        return extracted_layer_names(cfg)
    return [select_feature_type(cfg, feature_type, key)]


def check_weights_file(cfg: Any) -> None:
    """A given ``MODEL.WEIGHTS_INIT.PARAMS_FILE`` must exist; none at all is a warning."""
    path = str(cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE)
    if path and not os.path.isfile(path):
        raise ConfigError(
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={path!r}: no such file; give the "
            "checkpoint to evaluate (e.g. <run>/model_final_checkpoint_phase<N>.torch).",
            "config.MODEL.WEIGHTS_INIT.PARAMS_FILE",
        )
    if not path:
        print(
            "warning: config.MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: evaluating a randomly "
            "initialised model.",
            file=sys.stderr,
        )


def _remove_stale_features(folder: str) -> None:
    stale = [
        p
        for p in glob.glob(os.path.join(folder, "rank*_chunk*_*.npy"))
        if re.match(
            r"^rank\d+_chunk\d+_(train|test)_.+_(features|targets|inds)\.npy$", os.path.basename(p)
        )
    ]
    if stale:
        logger.info("removing %d feature files of an earlier extraction in %s", len(stale), folder)
    for path in stale:
        os.remove(path)


def extract_or_locate_features(
    cfg: Any, node_id: int, features_path: str, features_key: str
) -> str | None:
    """The folder holding TRAIN/TEST features: ``features_path`` or a fresh extraction.

    Returns None on nodes other than 0 of a multi-node run (node 0 evaluates).

    Raises:
        ConfigError: ``features_path`` is not a folder, or SLURM is asked for.
    """
    if features_path:
        if not os.path.isdir(features_path):
            raise ConfigError(
                f"{features_key}={features_path!r}: no such folder of extracted features.",
                features_key,
            )
        return os.path.abspath(features_path)
    if cfg.SLURM.USE_SLURM:
        raise ConfigError(
            "config.SLURM.USE_SLURM: the benchmark tools run where they are started; "
            "extract features on SLURM with tools/run_distributed_engines.py "
            f"engine_name=extract_features, then pass {features_key}=<folder>.",
            "config.SLURM.USE_SLURM",
        )
    check_weights_file(cfg)
    from vissl.hooks import default_hook_generator
    from vissl.utils.distributed_launcher import launch_distributed

    out_dir = os.path.abspath(str(cfg.EXTRACT_FEATURES.OUTPUT_DIR or cfg.CHECKPOINT.DIR))
    cfg.EXTRACT_FEATURES.OUTPUT_DIR = out_dir
    os.makedirs(out_dir, exist_ok=True)
    if node_id == 0:
        _remove_stale_features(out_dir)
    launch_distributed(
        cfg,
        node_id=node_id,
        engine_name="extract_features",
        hook_generator=default_hook_generator,
    )
    return out_dir if node_id == 0 else None


def load_split_features(folder: str, layer: str, features_key: str) -> dict[str, Any]:
    """``{"train": {...}, "test": {...}}`` of ``layer`` (features, targets, inds).

    Raises:
        ConfigError: no features of ``layer`` in ``folder`` (the layers found are listed).
    """
    from vissl.engines.extract_features import ExtractedFeaturesLoader

    if layer not in layers_in_folder(folder):
        raise ConfigError(
            f"no TRAIN and TEST features of layer {layer!r} in {folder} "
            f"(layers found: {layers_in_folder(folder) or 'none'}); extract them first or "
            f"point {features_key} at the right folder.",
            features_key,
        )
    return {
        split: ExtractedFeaturesLoader.load_features(folder, layer, split)
        for split in ("train", "test")
    }


def layers_of_split(folder: str, split: str) -> list[str]:
    """The layers with ``split`` (TRAIN | TEST) features in ``folder``, sorted."""
    stem = f"_{split.lower()}_"
    found = set()
    for path in glob.glob(os.path.join(folder, f"rank*_chunk*{stem}*_features.npy")):
        name = os.path.basename(path)
        found.add(name.split(stem, 1)[1][: -len("_features.npy")])
    return sorted(found)


def pick_layer(
    folder: str, split: str, layer: str, key: str, purpose: str, found: str = "layers found"
) -> str:
    """``layer``, checked against the ``split`` features in ``folder``; for ``""`` the only
    layer there.

    Args:
        key: the config key that names the layer (in the messages).
        purpose: what the layer is for ("cluster", "rank"), in the message that asks for one.
        found: the words before the list of the layers found.

    Raises:
        ConfigError: no ``split`` features of ``layer``, or ``""`` and not exactly one layer.
    """
    layers = layers_of_split(folder, split)
    if layer:
        if layer not in layers:
            raise ConfigError(
                f"{key}={layer!r}: no {split} features of that layer in {folder} "
                f"({found}: {layers or 'none'}).",
                key,
            )
        return layer
    if len(layers) != 1:
        raise ConfigError(
            f"{key} is empty and {folder} holds {split} features of {len(layers)} layers "
            f"({layers or 'none'}): name the layer to {purpose}.",
            key,
        )
    return layers[0]
