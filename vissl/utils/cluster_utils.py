"""Moved to :mod:`vissl.evaluation.clustering`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.clustering import *  # noqa: F403
