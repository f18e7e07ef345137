"""Moved to :mod:`vissl.evaluation.svm`;
this path re-exports it, so that VISSL's import path keeps working."""

from vissl.evaluation.svm import *  # noqa: F403
