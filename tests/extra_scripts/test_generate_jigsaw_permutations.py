"""``extra_scripts/generate_jigsaw_permutations.py``: Noroozi's greedy selection, checked
step by step against distances computed by hand; the max_min set's minimum Hamming
distance; the seed; VISSL's flags and file name; the shipped files are reproducible."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main
from tests.integration._runs import REPO
from vissl.data.ssl_transforms.shuffle_img_patches import ShuffleImgPatches

gen = import_script("generate_jigsaw_permutations")


def _hamming(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return sum(x != y for x, y in zip(a, b))


@pytest.mark.parametrize("method", ["max_avg", "max_min"])
def test_each_choice_is_the_farthest_remaining_permutation(method: str) -> None:
    """Algorithm 1 of Noroozi & Favaro, by hand: after the first (random) row, row k is
    the first permutation (in lexicographic order) not yet chosen whose mean (max_avg)
    or minimum (max_min) Hamming distance to rows 0..k-1 is largest."""
    perms = gen.generate_permutations(20, num_patches=5, method=method, seed=3)
    assert perms.shape == (20, 5) and perms.dtype == np.int64
    rows = [tuple(r) for r in perms.tolist()]
    assert len(set(rows)) == 20
    assert all(sorted(r) == [0, 1, 2, 3, 4] for r in rows)
    pick = np.mean if method == "max_avg" else min
    everything = list(itertools.permutations(range(5)))
    for k in range(1, 20):
        scores = {
            p: pick([_hamming(p, q) for q in rows[:k]]) for p in everything if p not in rows[:k]
        }
        best = max(scores.values())
        first_best = next(p for p in everything if p in scores and scores[p] == best)
        assert rows[k] == first_best, k


def test_max_min_keeps_the_set_far_apart() -> None:
    """max_min: the distance of each new row to the set never grows, the set's minimum
    pairwise distance is that of the last row, and it beats random sets of the same size."""
    perms = gen.generate_permutations(100, num_patches=9, method="max_min", seed=0)
    rows = perms.tolist()
    steps = [min(_hamming(rows[k], q) for q in rows[:k]) for k in range(1, 100)]
    assert steps == sorted(steps, reverse=True)
    low, mean = gen.pairwise_hamming(perms)
    assert low == steps[-1]
    rng = np.random.default_rng(0)
    for _ in range(3):
        random_set = np.stack([rng.permutation(9) for _ in range(100)])
        assert low > gen.pairwise_hamming(random_set)[0]
    by_hand = [_hamming(a, b) for a, b in itertools.combinations(rows, 2)]
    assert (low, mean) == (min(by_hand), pytest.approx(np.mean(by_hand)))


def test_the_seed_decides_the_set() -> None:
    first = gen.generate_permutations(30, 9, "max_avg", seed=0)
    np.testing.assert_array_equal(first, gen.generate_permutations(30, 9, "max_avg", seed=0))
    assert not np.array_equal(first, gen.generate_permutations(30, 9, "max_avg", seed=1))


def test_cli_writes_vissls_file_name_that_shuffle_img_patches_reads(tmp_path: Path) -> None:
    out = tmp_path / "perms"
    code, stdout, stderr = run_as_main(
        "generate_jigsaw_permutations", "--N", "24", "--M", "4", "--output_dir", str(out)
    )
    assert code == 0, stderr
    path = out / "hamming_perms_24_patches_4_max_avg.npy"
    assert str(path) in stdout and "Hamming distance min" in stdout
    t = ShuffleImgPatches(str(path))
    assert (t.num_perms, t.num_patches) == (24, 4)
    assert len({tuple(r) for r in t.perms.tolist()}) == 24  # all of 4!


@pytest.mark.parametrize("n,m", [(100, 9), (24, 4)])
def test_the_shipped_files_are_what_the_script_makes(n: int, m: int) -> None:
    name = f"hamming_perms_{n}_patches_{m}_max_avg.npy"
    shipped = np.load(Path(REPO) / "configs" / "jigsaw_permutations" / name)
    np.testing.assert_array_equal(shipped, gen.generate_permutations(n, m, "max_avg", seed=0))


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--N", "25", "--M", "4"], "--N must be between 1 and M! = 24"),
        (["--N", "5", "--M", "11"], "--M must be between 2 and 10"),
        (["--N", "0"], "--N must be between 1"),
    ],
)
def test_bad_arguments_end_in_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    code, _, stderr = run_as_main(
        "generate_jigsaw_permutations", *args, "--output_dir", str(tmp_path)
    )
    assert_one_line_error(code, stderr, fragment)
