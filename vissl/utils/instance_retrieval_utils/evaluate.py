"""Moved to :mod:`vissl.evaluation.retrieval.evaluate`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.retrieval.evaluate import *  # noqa: F403
