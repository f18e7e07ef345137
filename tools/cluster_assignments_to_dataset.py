#!/usr/bin/env python3
"""Turn the cluster assignments of the ``extract_cluster`` engine into a ``disk_filelist`` data set.

    python tools/run_distributed_engines.py config=<SwAV config> engine_name=extract_cluster \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        config.EXTRACT_FEATURES.OUTPUT_DIR=/path/to/assignments ...
    python tools/cluster_assignments_to_dataset.py -i /path/to/assignments -o /path/to/dataset

For each split the engine labelled (``{split}_cluster_assignments.npy``), it writes

  OUT/{split}_images.npy   the image paths of the labelled samples (sources with paths)
  OUT/{split}_labels.npy   int64, the prototype each sample is assigned to

in the labelled samples' dataset-index order. The image paths come from the data settings
of the engine's run (``cluster_config.yaml`` in the input folder, or ``--config``). A data
source without paths (digits, synthetic) gets only the labels, which then stand next to the
same data source: ``LABEL_SOURCES=[disk_filelist] LABEL_PATHS=[OUT/train_labels.npy]``.
``--head H`` picks the set of prototypes (SwAV heads with several ``num_clusters``).
Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "extra_scripts"))

from _common import HelpFormatter, ScriptError, run_script  # noqa: E402

from vissl.config.attr_dict import AttrDict  # noqa: E402
from vissl.engines.extract_cluster import CONFIG_FILE, load_cluster_assignments  # noqa: E402
from vissl.evaluation.clustering import save_npy  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="cluster_assignments_to_dataset.py",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "-i", "--input", required=True, help="folder of the extract_cluster engine's output"
    )
    parser.add_argument("-o", "--output", required=True, help="folder of the data set files")
    parser.add_argument("--head", type=int, default=0, help="which set of prototypes")
    parser.add_argument(
        "--config", default="", help=f"the run's config YAML (default: INPUT/{CONFIG_FILE})"
    )
    return parser.parse_args(argv)


def _load_config(path: str) -> AttrDict:
    if not os.path.isfile(path):
        raise ScriptError(
            f"{path}: no config of the extract_cluster run; pass --config <its YAML> "
            "(train_config.yaml of the run)."
        )
    with open(path, encoding="utf-8") as f:
        content = yaml.safe_load(f)
    if not isinstance(content, dict) or not isinstance(content.get("config"), dict):
        raise ScriptError(f"{path}: not a vissl config (expected a top-level 'config:' block).")
    return AttrDict(content["config"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not os.path.isdir(args.input):
        raise ScriptError(f"--input {args.input}: no such folder.")
    splits = [
        s
        for s in ("train", "test")
        if os.path.exists(os.path.join(args.input, f"{s}_cluster_assignments.npy"))
    ]
    if not splits:
        raise ScriptError(
            f"--input {args.input}: no {{train,test}}_cluster_assignments.npy; run "
            "tools/run_distributed_engines.py engine_name=extract_cluster first."
        )
    cfg = _load_config(args.config or os.path.join(args.input, CONFIG_FILE))
    from vissl.data import build_dataset

    os.makedirs(args.output, exist_ok=True)
    for split in splits:
        data = load_cluster_assignments(args.input, split)
        assignments = data["cluster_assignments"].reshape(len(data["cluster_inds"]), -1)
        if not 0 <= args.head < assignments.shape[1]:
            raise ScriptError(
                f"--head {args.head}: the assignments have {assignments.shape[1]} set(s) of "
                "prototypes (0-based)."
            )
        inds = data["cluster_inds"].astype(np.int64)
        labels = assignments[:, args.head].astype(np.int64)
        dataset = build_dataset(cfg, split.upper())
        paths = dataset.get_image_paths()
        images = list(paths[0]) if paths else []
        written = []
        if images:
            if int(inds.max(initial=-1)) >= len(images):
                raise ScriptError(
                    f"{split}: the assignments index sample {int(inds.max())} but the data "
                    f"of the config has {len(images)} images; pass the run's --config."
                )
            image_file = os.path.join(args.output, f"{split}_images.npy")
            save_npy(image_file, np.array([images[i] for i in inds]))
            written.append(image_file)
        elif not np.array_equal(inds, np.arange(len(dataset))):
            raise ScriptError(
                f"{split}: the data source has no image paths and the assignments cover "
                f"{len(inds)} of its {len(dataset)} samples, so the labels cannot stand next "
                "to it; assign every sample (no DATA_LIMIT)."
            )
        label_file = os.path.join(args.output, f"{split}_labels.npy")
        save_npy(label_file, labels)
        written.append(label_file)
        used = len(np.unique(labels))
        print(f"{split}: {len(labels)} samples, {used} clusters used -> {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))
