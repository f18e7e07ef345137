"""Moved to :mod:`vissl.evaluation.low_shot`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.low_shot import *  # noqa: F403
