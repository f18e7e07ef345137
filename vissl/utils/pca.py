"""Moved to :mod:`vissl.evaluation.pca`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.pca import *  # noqa: F403
