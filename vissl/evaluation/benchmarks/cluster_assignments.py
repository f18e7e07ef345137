"""The command of ``tools/cluster_assignments_to_dataset.py``: the cluster assignments of
the ``extract_cluster`` engine as a ``disk_filelist`` data set (labels, and image paths for
sources with paths)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import yaml

from vissl.config.attr_dict import AttrDict
from vissl.engines.extract_cluster import CONFIG_FILE, load_cluster_assignments
from vissl.errors import VisslError
from vissl.evaluation.clustering import save_npy


def _load_config(path: str) -> AttrDict:
    if not os.path.isfile(path):
        raise VisslError(
            f"{path}: no config of the extract_cluster run; pass --config <its YAML> "
            "(train_config.yaml of the run)."
        )
    with open(path, encoding="utf-8") as f:
        content = yaml.safe_load(f)
    if not isinstance(content, dict) or not isinstance(content.get("config"), dict):
        raise VisslError(f"{path}: not a vissl config (expected a top-level 'config:' block).")
    return AttrDict(content["config"])


def assignments_to_dataset(
    input_dir: str,
    output_dir: str,
    head: int = 0,
    config: str = "",
    report: Callable[[str], None] = print,
) -> list[str]:
    """Write ``{split}_labels.npy`` (and ``{split}_images.npy``) of the ``extract_cluster``
    output in ``input_dir`` to ``output_dir``; returns the files written.

    Args:
        head: which set of prototypes.
        config: the run's config YAML (default: ``input_dir/cluster_config.yaml``).
        report: called with one summary line per split.

    Raises:
        VisslError: a bad input (the message says which and how to fix it).
    """
    if not os.path.isdir(input_dir):
        raise VisslError(f"--input {input_dir}: no such folder.")
    splits = [
        s
        for s in ("train", "test")
        if os.path.exists(os.path.join(input_dir, f"{s}_cluster_assignments.npy"))
    ]
    if not splits:
        raise VisslError(
            f"--input {input_dir}: no {{train,test}}_cluster_assignments.npy; run "
            "tools/run_distributed_engines.py engine_name=extract_cluster first."
        )
    cfg = _load_config(config or os.path.join(input_dir, CONFIG_FILE))
    from vissl.data import build_dataset

    os.makedirs(output_dir, exist_ok=True)
    all_written: list[str] = []
    for split in splits:
        data = load_cluster_assignments(input_dir, split)
        assignments = data["cluster_assignments"].reshape(len(data["cluster_inds"]), -1)
        if not 0 <= head < assignments.shape[1]:
            raise VisslError(
                f"--head {head}: the assignments have {assignments.shape[1]} set(s) of "
                "prototypes (0-based)."
            )
        inds = data["cluster_inds"].astype(np.int64)
        labels = assignments[:, head].astype(np.int64)
        dataset = build_dataset(cfg, split.upper())
        paths = dataset.get_image_paths()
        images = list(paths[0]) if paths else []
        written: list[str] = []
        if images:
            if int(inds.max(initial=-1)) >= len(images):
                raise VisslError(
                    f"{split}: the assignments index sample {int(inds.max())} but the data "
                    f"of the config has {len(images)} images; pass the run's --config."
                )
            image_file = os.path.join(output_dir, f"{split}_images.npy")
            save_npy(image_file, np.array([images[i] for i in inds]))
            written.append(image_file)
        elif not np.array_equal(inds, np.arange(len(dataset))):
            raise VisslError(
                f"{split}: the data source has no image paths and the assignments cover "
                f"{len(inds)} of its {len(dataset)} samples, so the labels cannot stand next "
                "to it; assign every sample (no DATA_LIMIT)."
            )
        label_file = os.path.join(output_dir, f"{split}_labels.npy")
        save_npy(label_file, labels)
        written.append(label_file)
        used = len(np.unique(labels))
        report(f"{split}: {len(labels)} samples, {used} clusters used -> {', '.join(written)}")
        all_written.extend(written)
    return all_written
