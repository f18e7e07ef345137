"""``RunContext``: what one process of a run needs to run an engine.

The launcher builds one per process (after the resume choice and the rendezvous) and
hands it to the engine; it replaces VISSL's seven positional arguments
(``cfg, dist_run_id, checkpoint_path, checkpoint_folder, local_rank, node_id,
hook_generator``), which are still accepted by engines written for VISSL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

#: ``cfg -> hooks``: builds the hook objects of a run from its config.
HookGenerator = Callable[[Any], list[Any]]


@dataclass(frozen=True)
class RunContext:
    """One process's view of a run.

    Attributes:
        cfg: the validated ``config`` section.
        engine_name: the engine to run (``train``, ``extract_features``, ...).
        run_id: the rendezvous address (``host:port``, a file, ``env``) or ``local``.
        checkpoint_folder: the run's output folder (created).
        checkpoint_path: the checkpoint to resume from, or None.
        local_rank: this process's index on its node.
        node_id: this node's index.
        hook_generator: ``cfg -> hooks`` (the launcher fills in
            :func:`vissl.hooks.default_hook_generator` when the caller gives none).
    """

    cfg: Any
    engine_name: str
    run_id: str
    checkpoint_folder: str
    hook_generator: HookGenerator
    checkpoint_path: str | None = None
    local_rank: int = 0
    node_id: int = 0

    def with_rank(self, local_rank: int) -> RunContext:
        """The same run seen from another local process."""
        return replace(self, local_rank=local_rank)

    def hooks(self) -> list[Any]:
        """The hooks of this run: ``hook_generator(cfg)``."""
        return list(self.hook_generator(self.cfg))
