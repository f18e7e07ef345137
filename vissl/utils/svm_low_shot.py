"""Moved to :mod:`vissl.evaluation.svm_low_shot`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.svm_low_shot import *  # noqa: F403
