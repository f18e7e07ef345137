"""vissl.evaluation.retrieval: the revisited protocol's mAP, R-MAC regions and GeM against
hand-worked numbers, and the ground-truth pickle loader. The benchmark end to end is in
tests/tools/test_instance_retrieval_test.py."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vissl.evaluation.retrieval.data import gem, load_ground_truth
from vissl.evaluation.retrieval.evaluate import compute_map
from vissl.evaluation.retrieval.rmac import get_rmac_region_coordinates


def test_compute_map_against_worked_example() -> None:
    """Ranking [p, junk, n, p, n] with 2 positives: the junk is removed, positives at 0 and
    2: AP = ((1 + 1/1)/2 + (1/2 + 2/3)/2) / 2 = 19/24; precision@1 = 1, @5 = 2/3
    (k capped at the last positive's rank 3)."""
    ranks = np.array([[4, 2, 0, 3, 1]]).T
    gnd = [{"ok": [4, 3], "junk": [2]}]
    mean_ap, aps, pr, _ = compute_map(ranks, gnd, [1, 5])
    assert mean_ap == pytest.approx(19 / 24) and aps[0] == pytest.approx(19 / 24)
    assert pr.tolist() == pytest.approx([1.0, 2 / 3])
    # a query without positives is left out of the mean
    mean_ap, aps, _, _ = compute_map(np.array([[0, 1], [1, 0]]), [{"ok": [0]}, {"ok": []}], [1])
    assert mean_ap == 1.0 and np.isnan(aps[1])


def test_rmac_regions_and_gem_by_hand() -> None:
    # 7 x 7, L = 2: the whole map, then 4 regions of side floor(14 / 3) = 4 at 0 and 3
    assert get_rmac_region_coordinates(7, 7, 2).tolist() == [
        [0, 0, 7, 7],
        [0, 0, 4, 4],
        [3, 0, 4, 4],
        [0, 3, 4, 4],
        [3, 3, 4, 4],
    ]
    # 5 x 10, L = 1: side 5; k extra positions along the width overlap by
    # 1 - (10 - 5) / k / 5: 0 for k = 1, 0.5 for k = 2 (closest to 40%), ... so 3 regions,
    # at x = floor(1 + 2.5 j) - 1 for j = 0, 1, 2
    assert get_rmac_region_coordinates(5, 10, 1).tolist() == [
        [0, 0, 5, 5],
        [2, 0, 5, 5],
        [5, 0, 5, 5],
    ]
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    assert gem(x, p=2).item() == pytest.approx(((1 + 4 + 9 + 16) / 4) ** 0.5)
    assert gem(x, p=float("inf")).item() == 4.0
    assert gem(x, p=1, add_bias=True).tolist() == [[2.5, 1.0]]


def test_ground_truth_pickle_cannot_run_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    path = tmp_path / "gnd_x.pkl"
    path.write_bytes(pickle.dumps({"imlist": [], "qimlist": [], "gnd": [Evil()]}))
    with pytest.raises(pickle.UnpicklingError, match="only lists, dicts"):
        load_ground_truth(str(path))
