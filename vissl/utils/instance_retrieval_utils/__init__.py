"""Moved to :mod:`vissl.evaluation.retrieval`; the submodules ``data_util``, ``evaluate`` and
``rmac`` here re-export ``vissl.evaluation.retrieval.{data,evaluate,rmac}``."""
