"""Config files, resolvable by Hydra as pkg://configs."""
