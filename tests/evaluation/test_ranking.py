"""vissl.evaluation.ranking: each sample's distance to its nearest other sample. The
benchmark end to end is in tests/tools/test_extract_feature_and_rank.py."""

from __future__ import annotations

import numpy as np

from vissl.evaluation.ranking import nearest_neighbour_distances


def test_nearest_neighbour_distances_by_hand() -> None:
    # points 0, 1, 3, 7 on a line: squared distances to the nearest other point 1, 1, 4, 16
    x = np.array([[0.0], [1.0], [3.0], [7.0]])
    assert nearest_neighbour_distances(x, use_faiss=False, chunk=3).tolist() == [1, 1, 4, 16]
