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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "extra_scripts"))

from _common import HelpFormatter, run_script  # noqa: E402

from vissl.engines.extract_cluster import CONFIG_FILE  # noqa: E402
from vissl.evaluation.benchmarks.cluster_assignments import assignments_to_dataset  # noqa: E402


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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    assignments_to_dataset(args.input, args.output, args.head, args.config)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))
