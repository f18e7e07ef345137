"""Instance retrieval (VISSL's ``IMG_RETRIEVAL`` benchmark): the Revisited Oxford / Paris
protocol (:mod:`.evaluate`), R-MAC and GeM descriptors (:mod:`.rmac`, :mod:`.data_util`),
and the data sets and image loading of ``tools/instance_retrieval_test.py``."""
