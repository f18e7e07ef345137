"""Moved to :mod:`vissl.evaluation.retrieval.data`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.retrieval.data import *  # noqa: F403
