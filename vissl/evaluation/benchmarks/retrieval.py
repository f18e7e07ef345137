"""The command of ``tools/instance_retrieval_test.py``: instance retrieval on Revisited Oxford /
Paris (VISSL's ``IMG_RETRIEVAL`` benchmark)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vissl.errors import ConfigError
from vissl.evaluation.cli import setup_tool_logging, write_results_json
from vissl.evaluation.features import check_weights_file
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_IR = "config.IMG_RETRIEVAL"
_TYPES = ("", "rmac", "gem")
_MEASURES = ("cosine_similarity", "l2")
#: frequency (in images) of the progress lines
LOG_FREQUENCY = 100


@dataclass
class RetrievalSettings:
    """The checked ``IMG_RETRIEVAL`` keys."""

    train_dataset: str
    eval_dataset: str
    dataset_path: str
    whiten_img_list: str
    num_training: int | None
    num_queries: int | None
    num_database: int | None
    img_scalings: list[float]
    similarity: str
    resize_img: int
    spatial_levels: int
    n_pca: int
    pca_whitening: bool
    processing: str
    gem_power: float
    crop_query_roi: bool
    normalize: bool
    center_crop: bool
    save_rankings: bool
    save_features: bool


def _limit(value: Any, debug_default: int, debug: bool, key: str) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1 or value == 0:
        raise ConfigError(f"{_IR}.{key} must be -1 (all) or > 0, got {value!r}.", f"{_IR}.{key}")
    if value == -1:
        return debug_default if debug else None
    return value


def retrieval_settings(ir: Any) -> RetrievalSettings:
    """Check ``config.IMG_RETRIEVAL`` (VISSL's rules, plus types) and apply ``DEBUG_MODE``.

    Raises:
        ConfigError: a value VISSL's tool would refuse, or one this tool does not support.
    """
    debug = bool(ir.DEBUG_MODE)
    processing = str(ir.FEATS_PROCESSING_TYPE)
    if processing not in _TYPES:
        raise ConfigError(
            f"{_IR}.FEATS_PROCESSING_TYPE={processing!r} is unknown; use one of {list(_TYPES)}.",
            f"{_IR}.FEATS_PROCESSING_TYPE",
        )
    similarity = str(ir.SIMILARITY_MEASURE)
    if similarity not in _MEASURES:
        raise ConfigError(
            f"{_IR}.SIMILARITY_MEASURE={similarity!r} is unknown; use one of {list(_MEASURES)}.",
            f"{_IR}.SIMILARITY_MEASURE",
        )
    levels = ir.SPATIAL_LEVELS
    if isinstance(levels, bool) or not isinstance(levels, int) or levels <= 0:
        raise ConfigError(
            f"{_IR}.SPATIAL_LEVELS must be an integer > 0, got {levels!r}.", f"{_IR}.SPATIAL_LEVELS"
        )
    scalings = list(ir.IMG_SCALINGS or [1])
    if not all(isinstance(s, int | float) and not isinstance(s, bool) and s > 0 for s in scalings):
        raise ConfigError(
            f"{_IR}.IMG_SCALINGS must be a list of positive scales, got {ir.IMG_SCALINGS!r}.",
            f"{_IR}.IMG_SCALINGS",
        )
    if processing == "rmac":
        if not ir.TRAIN_PCA_WHITENING:
            raise ConfigError(
                f"{_IR}.FEATS_PROCESSING_TYPE=rmac needs {_IR}.TRAIN_PCA_WHITENING=True: the "
                "PCA whitening of the regions is part of R-MAC.",
                f"{_IR}.TRAIN_PCA_WHITENING",
            )
        if len(scalings) != 1:
            raise ConfigError(
                f"{_IR}.IMG_SCALINGS: R-MAC uses one image scale, got {scalings}.",
                f"{_IR}.IMG_SCALINGS",
            )
    resize = ir.RESIZE_IMG
    if isinstance(resize, bool) or not isinstance(resize, int) or (resize <= 0 and resize != -1):
        raise ConfigError(
            f"{_IR}.RESIZE_IMG must be a size in pixels or -1 (original size), got {resize!r}.",
            f"{_IR}.RESIZE_IMG",
        )
    if bool(ir.CENTER_CROP) and resize == -1:
        raise ConfigError(
            f"{_IR}.CENTER_CROP needs a {_IR}.RESIZE_IMG > 0 (the crop size).", f"{_IR}.RESIZE_IMG"
        )
    n_pca = ir.N_PCA
    if isinstance(n_pca, bool) or not isinstance(n_pca, int) or n_pca == 0 or n_pca < -1:
        raise ConfigError(
            f"{_IR}.N_PCA must be -1 (all dimensions) or > 0, got {n_pca!r}.", f"{_IR}.N_PCA"
        )
    power = ir.GEM_POOL_POWER
    if isinstance(power, bool) or not isinstance(power, int | float) or not power > 0:
        raise ConfigError(
            f"{_IR}.GEM_POOL_POWER must be > 0, got {power!r}.", f"{_IR}.GEM_POOL_POWER"
        )
    if ir.USE_DISTRACTORS:
        logger.info(
            "%s.USE_DISTRACTORS has no effect on the revisited sets (VISSL used it for "
            "Copydays and its feature-extraction path).",
            _IR,
        )
    if not str(ir.DATASET_PATH):
        raise ConfigError(
            f"{_IR}.DATASET_PATH is empty: give the folder holding the data set folders "
            "(e.g. <path>/roxford5k/gnd_roxford5k.pkl).",
            f"{_IR}.DATASET_PATH",
        )
    return RetrievalSettings(
        train_dataset=str(ir.TRAIN_DATASET_NAME),
        eval_dataset=str(ir.EVAL_DATASET_NAME),
        dataset_path=str(ir.DATASET_PATH),
        whiten_img_list=str(ir.WHITEN_IMG_LIST),
        num_training=_limit(ir.NUM_TRAINING_SAMPLES, 10, debug, "NUM_TRAINING_SAMPLES"),
        num_queries=_limit(ir.NUM_QUERY_SAMPLES, 10, debug, "NUM_QUERY_SAMPLES"),
        num_database=_limit(ir.NUM_DATABASE_SAMPLES, 50, debug, "NUM_DATABASE_SAMPLES"),
        img_scalings=[float(s) for s in scalings],
        similarity=similarity,
        resize_img=int(resize),
        spatial_levels=int(levels),
        n_pca=int(n_pca),
        pca_whitening=bool(ir.TRAIN_PCA_WHITENING),
        processing=processing,
        gem_power=float(power),
        crop_query_roi=bool(ir.CROP_QUERY_ROI),
        normalize=bool(ir.NORMALIZE_FEATURES),
        center_crop=bool(ir.CENTER_CROP),
        save_rankings=bool(ir.SAVE_RETRIEVAL_RANKINGS_SCORES),
        save_features=bool(ir.SAVE_FEATURES),
    )


# ------------------------------------------------------------------------------ data sets
def _has_ground_truth(root: str, name: str) -> bool:
    return os.path.isfile(os.path.join(root, name, f"gnd_{name}.pkl"))


def eval_dataset(s: RetrievalSettings) -> Any:
    """The evaluated revisited data set.

    Raises:
        ConfigError: no ``gnd_<name>.pkl`` under ``DATASET_PATH/<name>``.
    """
    from vissl.evaluation.retrieval.data import RevisitedInstanceRetrievalDataset

    if not _has_ground_truth(s.dataset_path, s.eval_dataset):
        raise ConfigError(
            f"{_IR}.EVAL_DATASET_NAME={s.eval_dataset!r}: no "
            f"{os.path.join(s.dataset_path, s.eval_dataset, f'gnd_{s.eval_dataset}.pkl')}. "
            "The revisited sets (roxford5k, rparis6k: gnd_<name>.pkl and jpg/) are "
            "supported; VISSL's Oxford/Paris (compute_ap binary), INSTRE and Copydays are not.",
            f"{_IR}.EVAL_DATASET_NAME",
        )
    try:
        return RevisitedInstanceRetrievalDataset(
            s.eval_dataset, s.dataset_path, num_samples=s.num_database
        )
    except (OSError, ValueError) as err:
        raise ConfigError(f"{_IR}.EVAL_DATASET_NAME: {err}", f"{_IR}.EVAL_DATASET_NAME") from err


def train_dataset(s: RetrievalSettings) -> Any:
    """The images the PCA whitening is fitted on.

    Raises:
        ConfigError: the set's folder (or image list) is missing or holds no image.
    """
    from vissl.evaluation.retrieval.data import (
        ImageListDataset,
        RevisitedInstanceRetrievalDataset,
        is_whiten_dataset,
    )

    key = f"{_IR}.TRAIN_DATASET_NAME"
    folder = os.path.join(s.dataset_path, s.train_dataset)
    if _has_ground_truth(s.dataset_path, s.train_dataset):
        return RevisitedInstanceRetrievalDataset(
            s.train_dataset, s.dataset_path, num_samples=s.num_training
        )
    if not os.path.isdir(folder):
        raise ConfigError(f"{key}={s.train_dataset!r}: no folder {folder}.", key)
    if is_whiten_dataset(s.train_dataset):
        if not os.path.isfile(s.whiten_img_list):
            raise ConfigError(
                f"{_IR}.WHITEN_IMG_LIST={s.whiten_img_list!r}: the whitening set needs its "
                "image list (names relative to DATASET_PATH/whitening, one a line).",
                f"{_IR}.WHITEN_IMG_LIST",
            )
        dataset = ImageListDataset(folder, s.whiten_img_list, num_samples=s.num_training)
    else:
        dataset = ImageListDataset(folder, num_samples=s.num_training)
    if dataset.get_num_images() < 2:
        raise ConfigError(
            f"{key}={s.train_dataset!r}: {dataset.get_num_images()} image(s) in {folder}; "
            "the PCA whitening needs at least 2.",
            key,
        )
    return dataset


# ---------------------------------------------------------------------------- features
def build_retrieval_model(cfg: Any, device: torch.device) -> torch.nn.Module:
    """The model of ``config.MODEL`` with ``WEIGHTS_INIT``, frozen, in eval mode."""
    from vissl.models import build_model
    from vissl.utils.weights_init import init_model_from_weights_params_file

    check_weights_file(cfg)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    if str(cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE):
        init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT, cfg.MODEL)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval()


class DescriptorMaker:
    """Turns images into descriptors as ``IMG_RETRIEVAL`` asks."""

    def __init__(
        self,
        s: RetrievalSettings,
        model: Callable[[torch.Tensor], Any],
        device: torch.device | str = "cpu",
    ) -> None:
        from vissl.evaluation.retrieval.data import InstanceRetrievalImageLoader

        self.s = s
        self.model = model
        self.device = torch.device(device)
        self.loader = InstanceRetrievalImageLoader(s.resize_img, center_crop=s.center_crop)

    def _maps(self, fname: str, roi: Any) -> list[torch.Tensor]:
        from vissl.evaluation.retrieval.data import extract_activation_maps

        img = self.loader.load_and_prepare_image(fname, roi=roi).to(self.device)
        with torch.inference_mode():
            maps = extract_activation_maps(img, self.model, self.s.img_scalings)
        if self.s.processing in ("rmac", "gem") and maps[0].ndim != 4:
            raise ConfigError(
                f"{_IR}.FEATS_PROCESSING_TYPE={self.s.processing} pools a (N, C, H, W) feature "
                f"map, but the model's first output has shape {tuple(maps[0].shape)}; tap a "
                "trunk layer without pooling (e.g. LINEAR_EVAL_FEAT_POOL_OPS_MAP: "
                "[[res5, [Identity, []]]] with SHOULD_FLATTEN_FEATS: False).",
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP",
            )
        return maps

    def _pooled(self, maps: list[torch.Tensor]) -> torch.Tensor:
        from vissl.evaluation.retrieval.data import get_average_gem, l2n

        if self.s.processing == "gem":
            desc = get_average_gem(maps, p=self.s.gem_power, add_bias=True)
        else:
            if len({tuple(m.shape) for m in maps}) > 1:
                raise ConfigError(
                    f"{_IR}.IMG_SCALINGS: the feature maps of the scales differ in size "
                    f"({[tuple(m.shape) for m in maps]}) and cannot be averaged; use "
                    f"{_IR}.FEATS_PROCESSING_TYPE=gem, or one scale.",
                    f"{_IR}.IMG_SCALINGS",
                )
            desc = torch.stack(maps).mean(dim=0).reshape(maps[0].shape[0], -1)
        return l2n(desc, dim=1) if self.s.normalize else desc

    def training_rows(self, fname: str) -> np.ndarray:
        """The rows the PCA whitening is fitted on (R-MAC: one per region)."""
        from vissl.evaluation.retrieval.rmac import get_rmac_descriptors

        maps = self._maps(fname, None)
        if self.s.processing == "rmac":
            regions = get_rmac_descriptors(
                maps[0], self.s.spatial_levels, normalize=self.s.normalize
            )
            return regions.reshape(-1, regions.shape[-1]).double().numpy()
        return self._pooled(maps).double().numpy()

    def descriptor(self, fname: str, roi: Any, pca: Any) -> np.ndarray:
        """The ``(1, D)`` descriptor of one image (PCA-whitened when ``pca`` is given)."""
        from vissl.evaluation.retrieval.rmac import get_rmac_descriptors

        maps = self._maps(fname, roi)
        if self.s.processing == "rmac":
            desc = get_rmac_descriptors(
                maps[0], self.s.spatial_levels, pca=pca, normalize=self.s.normalize
            )
            return desc.double().numpy()
        out = self._pooled(maps).double().numpy()
        return pca.transform(out).astype(np.float64) if pca is not None else out


def _stack(rows: Sequence[np.ndarray], what: str) -> np.ndarray:
    dims = sorted({r.shape[-1] for r in rows})
    if len(dims) > 1:
        raise ConfigError(
            f"the {what} descriptors differ in length ({dims[:4]}): with "
            f"{_IR}.FEATS_PROCESSING_TYPE '' the flattened feature map grows with the image. "
            "Use rmac or gem, a pooled layer (e.g. res5avg) or "
            f"{_IR}.CENTER_CROP=True.",
            f"{_IR}.FEATS_PROCESSING_TYPE",
        )
    return np.concatenate([r.reshape(-1, dims[0]) for r in rows])


def _describe(
    names: Sequence[tuple[str, Any]], what: str, fn: Callable[[str, Any], np.ndarray]
) -> np.ndarray:
    rows = []
    for i, (fname, roi) in enumerate(names):
        if i % LOG_FREQUENCY == 0:
            logger.info("%s image %d / %d", what, i, len(names))
        if not os.path.isfile(fname):
            raise ConfigError(f"{what} image {fname} does not exist.", f"{_IR}.DATASET_PATH")
        rows.append(fn(fname, roi))
    return _stack(rows, what)


def fit_pca(rows: np.ndarray, n_pca: int) -> Any:
    """A PCA whitening of ``rows`` to ``n_pca`` dimensions.

    Raises:
        ConfigError: more dimensions than the descriptors have.
    """
    from vissl.evaluation.pca import PCA

    if n_pca > rows.shape[1]:
        raise ConfigError(
            f"{_IR}.N_PCA={n_pca} is more than the {rows.shape[1]} dimensions of the "
            "descriptors; lower it (-1 keeps them all).",
            f"{_IR}.N_PCA",
        )
    logger.info("fitting a PCA whitening to %d dimensions on %s", n_pca, rows.shape)
    return PCA(n_pca).fit(rows)


def similarity_matrix(queries: np.ndarray, database: np.ndarray, measure: str) -> np.ndarray:
    """``(n_queries, n_db)``: dot products, or negative Euclidean distances for ``l2``."""
    if measure == "cosine_similarity":
        return queries @ database.T
    sq = (queries**2).sum(1, keepdims=True) + (database**2).sum(1)[None, :]
    return -np.sqrt(np.maximum(sq - 2 * queries @ database.T, 0.0))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.2f}%"


def run_retrieval(cfg: Any, s: RetrievalSettings, out_dir: str) -> dict[str, Any]:
    """Descriptors, similarities and the revisited scores; writes the output files."""
    from vissl.evaluation.retrieval.evaluate import score_revisited

    device = torch.device("cpu")
    if str(cfg.MACHINE.DEVICE) == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError(
                "config.MACHINE.DEVICE=gpu but no CUDA device is available; set "
                "config.MACHINE.DEVICE=cpu.",
                "config.MACHINE.DEVICE",
            )
        device = torch.device("cuda")
    evaluated = eval_dataset(s)
    trained = train_dataset(s) if s.pca_whitening else None
    maker = DescriptorMaker(s, build_retrieval_model(cfg, device), device)

    pca = None
    train_rows = None
    if trained is not None:
        names = [(trained.get_filename(i), None) for i in range(trained.get_num_images())]
        train_rows = _describe(names, "training", lambda f, _r: maker.training_rows(f))
        pca = fit_pca(train_rows, s.n_pca)

    n_queries = evaluated.get_num_query_images()
    if s.num_queries is not None:
        n_queries = min(n_queries, s.num_queries)
    queries = [
        (
            evaluated.get_query_filename(i),
            evaluated.get_query_roi(i) if s.crop_query_roi else None,
        )
        for i in range(n_queries)
    ]
    database = [(evaluated.get_filename(i), None) for i in range(evaluated.get_num_images())]
    q_desc = _describe(queries, "query", lambda f, r: maker.descriptor(f, r, pca))
    db_desc = _describe(database, "database", lambda f, r: maker.descriptor(f, r, pca))

    sim = similarity_matrix(q_desc, db_desc, s.similarity)
    logger.info("similarity: %s", sim.shape)
    results = score_revisited(sim, evaluated.gnd)
    os.makedirs(out_dir, exist_ok=True)
    if s.save_features:
        folder = os.path.join(out_dir, "features")
        os.makedirs(folder, exist_ok=True)
        stem = f"{s.eval_dataset}_S{s.resize_img}"
        np.save(os.path.join(folder, f"{stem}_query.npy"), q_desc)
        np.save(os.path.join(folder, f"{stem}_db.npy"), db_desc)
        if train_rows is not None:
            np.save(
                os.path.join(folder, f"{s.train_dataset}_S{s.resize_img}_train.npy"), train_rows
            )
    if s.save_rankings:
        ranks = np.argsort(-sim, axis=1, kind="stable")
        write_results_json(os.path.join(out_dir, "rankings.json"), ranks.tolist())
        write_results_json(os.path.join(out_dir, "similarity_scores.json"), sim.T.tolist())
        write_results_json(os.path.join(out_dir, "metrics.json"), _plain(results))
    maps = results["mAP"]
    logger.info(
        ">> %s: mAP E: %s, M: %s, H: %s; mP@k%s E: %s, M: %s, H: %s",
        s.eval_dataset,
        _pct(maps["e"]),
        _pct(maps["m"]),
        _pct(maps["h"]),
        results["mp@k"]["k"],
        results["mp@k"]["e"],
        results["mp@k"]["m"],
        results["mp@k"]["h"],
    )
    print(
        f"instance_retrieval: {s.eval_dataset} mAP E {_pct(maps['e'])} M {_pct(maps['m'])} "
        f"H {_pct(maps['h'])} queries={len(queries)} database={len(database)}",
        flush=True,
    )
    return results


def main(argv: list[str]) -> int:
    """Compose the config, run the benchmark, print the result last."""
    _, cfg = hydra_compose_and_validate(argv)
    settings = retrieval_settings(cfg.IMG_RETRIEVAL)
    out_dir = setup_tool_logging(cfg)
    try:
        run_retrieval(cfg, settings, out_dir)
    finally:
        shutdown_logging()
    return 0
