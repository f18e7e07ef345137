#!/usr/bin/env python3
"""Generate N permutations of M Jigsaw patches, far apart in Hamming distance.

Noroozi & Favaro (ECCV 2016, Algorithm 1): start from a permutation drawn uniformly from
all M! of them, then repeatedly add the permutation whose Hamming distance to the ones
chosen so far is largest, on average (``--method max_avg``, the paper's and VISSL's
default) or in the minimum (``max_min``); ties go to the first in lexicographic order.
The distances are kept as running integer sums/minima, so 2000 permutations of 9
patches take about 15 s. The first draw comes from ``--seed``: the same seed gives the same
file.

The file is ``OUTPUT_DIR/hamming_perms_{N}_patches_{M}_{method}.npy`` (VISSL's name),
an int64 array of shape (N, M), rows numbered from 0: ``ShuffleImgPatches``'s
``perm_file``.

examples:
  python extra_scripts/generate_jigsaw_permutations.py --N 100 --output_dir /tmp/perms
  python extra_scripts/generate_jigsaw_permutations.py --N 2000 --M 9 --method max_avg \\
      --seed 0 --output_dir /tmp/perms

Exit codes: 0 written, 2 a bad argument (one line on stderr).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence

import numpy as np
from _common import HelpFormatter, ScriptError, run_script

logger = logging.getLogger("generate_jigsaw_permutations")

METHODS = ("max_avg", "max_min")
#: 10! = 3628800 candidate rows is the most this enumerates (36 MB of int8).
MAX_PATCHES = 10


def all_permutations(num_patches: int) -> np.ndarray:
    """Every permutation of ``0 .. num_patches - 1``, in lexicographic order (that of
    ``itertools.permutations``), as int8 rows.

    Built a block per first element: ``f`` followed by the permutations of the other
    elements, which are the permutations of ``0 .. M - 2`` used as indices into them.
    """
    perms = np.zeros((1, 0), dtype=np.int8)
    for m in range(1, num_patches + 1):
        blocks = []
        for first in range(m):
            rest = np.delete(np.arange(m, dtype=np.int8), first)
            head = np.full((perms.shape[0], 1), first, dtype=np.int8)
            blocks.append(np.concatenate([head, rest[perms]], axis=1))
        perms = np.concatenate(blocks)
    return perms


def generate_permutations(
    num_perms: int, num_patches: int = 9, method: str = "max_avg", seed: int = 0
) -> np.ndarray:
    """Noroozi's greedy selection (see the module docstring): an ``(N, M)`` int64 array.

    Raises:
        ScriptError: ``method`` unknown, ``num_patches`` outside 2..10, or ``num_perms``
            outside 1..M!.
    """
    if method not in METHODS:
        raise ScriptError(f"--method must be one of {list(METHODS)}; got {method!r}.")
    if not 2 <= num_patches <= MAX_PATCHES:
        raise ScriptError(
            f"--M must be between 2 and {MAX_PATCHES} (all M! permutations are enumerated); "
            f"got {num_patches}."
        )
    total = math.factorial(num_patches)
    if not 1 <= num_perms <= total:
        raise ScriptError(
            f"--N must be between 1 and M! = {total} for M = {num_patches}; got {num_perms}."
        )
    candidates = all_permutations(num_patches)
    columns = np.ascontiguousarray(candidates.T)  # per position: fast distance sums
    available = np.ones(total, dtype=bool)
    # distance of every candidate to the chosen set: the sum (max_avg; the mean's argmax
    # is the sum's) or the minimum (max_min) of the Hamming distances to each chosen row
    score = np.zeros(total, dtype=np.int64)
    if method == "max_min":
        score[:] = num_patches + 1
    chosen = [int(np.random.default_rng(seed).integers(total))]
    for _ in range(num_perms - 1):
        last = chosen[-1]
        available[last] = False
        distance = np.zeros(total, dtype=np.int8)
        for position, value in enumerate(candidates[last]):
            distance += columns[position] != value
        if method == "max_avg":
            score += distance
        else:
            np.minimum(score, distance, out=score)
        chosen.append(int(np.argmax(np.where(available, score, -1))))
        if len(chosen) % 500 == 0:
            logger.info("selected %d of %d permutations", len(chosen), num_perms)
    return candidates[chosen].astype(np.int64)


def pairwise_hamming(perms: np.ndarray, chunk: int = 512) -> tuple[int, float]:
    """``(minimum, mean)`` Hamming distance over the distinct pairs of rows of ``perms``."""
    n = perms.shape[0]
    if n < 2:
        return 0, 0.0
    low, total = perms.shape[1], 0
    for start in range(0, n, chunk):
        block = perms[start : start + chunk]
        d = (block[:, None, :] != perms[None, :, :]).sum(axis=2)
        rows = np.arange(block.shape[0])
        d[rows, start + rows] = perms.shape[1] + 1  # exclude each row's distance to itself
        low = min(low, int(d.min()))
        total += int(d.sum()) - (perms.shape[1] + 1) * block.shape[0]
    return low, total / (n * (n - 1))


def output_path(output_dir: str, num_perms: int, num_patches: int, method: str) -> str:
    """VISSL's file name: ``hamming_perms_{N}_patches_{M}_{method}.npy``."""
    return os.path.join(output_dir, f"hamming_perms_{num_perms}_patches_{num_patches}_{method}.npy")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/generate_jigsaw_permutations.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--N", type=int, default=1000, help="number of permutations")
    parser.add_argument("--M", type=int, default=9, help="number of patches to permute")
    parser.add_argument(
        "--method",
        default="max_avg",
        choices=METHODS,
        help="which Hamming distance to the chosen set to maximise",
    )
    parser.add_argument(
        "--min_distance",
        type=float,
        default=2.0 / 9.0,
        help="warn when the final set's minimum Hamming distance, as a fraction of M, is "
        "below this (VISSL's flag)",
    )
    parser.add_argument(
        "--output_dir", required=True, help="folder to write the .npy file to (created)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the first permutation")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ScriptError(f"--output_dir {args.output_dir} exists and is not a folder.")
    perms = generate_permutations(args.N, args.M, args.method, args.seed)
    low, mean = pairwise_hamming(perms)
    if args.N > 1 and low / args.M < args.min_distance:
        logger.warning(
            "minimum Hamming distance %d/%d is below --min_distance %.3f",
            low,
            args.M,
            args.min_distance,
        )
    os.makedirs(args.output_dir, exist_ok=True)
    path = output_path(args.output_dir, args.N, args.M, args.method)
    np.save(path, perms)
    print(
        f"wrote {args.N} permutations of {args.M} patches ({args.method}, seed {args.seed}; "
        f"Hamming distance min {low}, mean {mean:.3f}) to {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))
