"""Retrieval scores of the Revisited Oxford / Paris protocol (Radenovic et al., CVPR 2018).

For one query, the database is ranked by decreasing similarity. Its "junk" images (and,
depending on the setup, the easy or hard ones) are removed from the ranking; the
remaining positives sit at 0-based ranks ``r_0 < r_1 < ...``. The average precision is the
trapezoid area under the precision-recall curve, each positive adding a recall step
``1 / n_pos``::

    AP = sum_j  ((j / r_j if r_j > 0 else 1) + (j + 1) / (r_j + 1)) / 2  /  n_pos

(``n_pos`` counts the query's positives, found or not). The setups: Easy (positives:
easy; ignored: junk and hard), Medium (positives: easy and hard; ignored: junk), Hard
(positives: hard; ignored: junk and easy). Queries without a positive are left out of the
mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: the k of the mean precision@k the protocol reports
KAPPAS = (1, 5, 10)


def compute_ap(ranks: Sequence[int] | np.ndarray, nres: int) -> float:
    """The trapezoid AP of positives found at the sorted 0-based ``ranks`` (junk already
    removed), out of ``nres`` positives."""
    ap = 0.0
    for j, rank in enumerate(np.asarray(ranks, dtype=np.int64).tolist()):
        before = 1.0 if rank == 0 else j / rank
        after = (j + 1) / (rank + 1)
        ap += (before + after) / 2.0 / nres
    return ap


def _as_indices(values: Any) -> np.ndarray:
    if values is None:
        return np.zeros(0, dtype=np.int64)
    arr = np.asarray(values, dtype=np.int64).reshape(-1)
    return arr


def compute_map(
    ranks: np.ndarray, gnd: Sequence[Mapping[str, Any]], kappas: Sequence[int] = KAPPAS
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Mean AP and mean precision@k of ranked results.

    Args:
        ranks: ``(n_db, n_queries)``: column ``i`` lists the database indices by decreasing
            similarity to query ``i``.
        gnd: per query ``{"ok": positive indices, "junk": ignored indices}``. Indices not
            below ``n_db`` are dropped (a database cut short by ``NUM_DATABASE_SAMPLES``).
        kappas: the ``k`` of precision@k.

    Returns:
        ``(mAP, per-query AP, mean precision@k, per-query precision@k)``; queries without a
        positive get NaN and are left out of the means (which are NaN when no query has one).
    """
    n_db, n_q = ranks.shape
    aps = np.full(n_q, np.nan)
    prs = np.full((n_q, len(kappas)), np.nan)
    for i in range(n_q):
        ok = _as_indices(gnd[i].get("ok"))
        ok = ok[ok < n_db]
        if ok.size == 0:
            continue
        junk = _as_indices(gnd[i].get("junk"))
        junk = junk[junk < n_db]
        order = ranks[:, i]
        pos = np.flatnonzero(np.isin(order, ok))
        junk_pos = np.flatnonzero(np.isin(order, junk))
        # each positive moves up by the number of junk images ranked above it
        pos = pos - np.searchsorted(junk_pos, pos)
        aps[i] = compute_ap(pos, int(ok.size))
        found = pos + 1  # 1-based
        for j, k in enumerate(kappas):
            kq = min(int(found.max()), int(k))
            prs[i, j] = float((found <= kq).sum()) / kq
    counted = ~np.isnan(aps)
    if not counted.any():
        return float("nan"), aps, np.full(len(kappas), np.nan), prs
    return float(aps[counted].mean()), aps, prs[counted].mean(axis=0), prs


def revisited_setups(gnd: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, np.ndarray]]]:
    """The Easy / Medium / Hard ground truths (``"e"``, ``"m"``, ``"h"``) of a revisited
    ``gnd`` list (``{"easy", "hard", "junk"}`` per query)."""

    def cat(entry: Mapping[str, Any], *keys: str) -> np.ndarray:
        return np.concatenate([_as_indices(entry.get(k)) for k in keys])

    return {
        "e": [{"ok": cat(g, "easy"), "junk": cat(g, "junk", "hard")} for g in gnd],
        "m": [{"ok": cat(g, "easy", "hard"), "junk": cat(g, "junk")} for g in gnd],
        "h": [{"ok": cat(g, "hard"), "junk": cat(g, "junk", "easy")} for g in gnd],
    }


def score_revisited(
    similarity: np.ndarray, gnd: Sequence[Mapping[str, Any]], kappas: Sequence[int] = KAPPAS
) -> dict[str, Any]:
    """VISSL's result dict of a ``(n_queries, n_db)`` similarity matrix::

        {"mAP": {"e": .., "m": .., "h": ..}, "mp@k": {"k": kappas, "e": [..], "m": [..],
         "h": [..]}}

    (fractions; NaN where no query of a setup has a positive).
    """
    ranks = np.argsort(-similarity, axis=1, kind="stable").T
    result: dict[str, Any] = {"mAP": {}, "mp@k": {"k": list(kappas)}}
    for setup, truth in revisited_setups(gnd[: similarity.shape[0]]).items():
        mean_ap, _, mean_pr, _ = compute_map(ranks, truth, kappas)
        result["mAP"][setup] = mean_ap
        result["mp@k"][setup] = mean_pr.tolist()
    return result
