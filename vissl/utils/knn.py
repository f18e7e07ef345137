"""Moved to :mod:`vissl.evaluation.knn`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.knn import *  # noqa: F403
