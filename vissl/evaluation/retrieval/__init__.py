"""Instance retrieval (VISSL's ``IMG_RETRIEVAL`` benchmark): the Revisited Oxford / Paris
protocol (:mod:`.evaluate`), R-MAC and GeM descriptors (:mod:`.rmac`, :mod:`.data`), and
the data sets and image loading; the benchmark of ``tools/instance_retrieval_test.py`` is
:mod:`vissl.evaluation.benchmarks.retrieval`. VISSL's path
``vissl.utils.instance_retrieval_utils.{data_util,evaluate,rmac}`` re-exports these."""
