"""Config: defaults.yaml in VISSL's key names, composition, validation, AttrDict."""

from vissl.config.attr_dict import AttrDict
from vissl.config.validation import register_config_defaults

LATEST_CFG_VERSION = 1

__all__ = ["LATEST_CFG_VERSION", "AttrDict", "register_config_defaults"]
