"""Moved to :mod:`vissl.evaluation.retrieval.rmac`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.retrieval.rmac import *  # noqa: F403
