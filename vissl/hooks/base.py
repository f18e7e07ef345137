"""The hook contract: ten events, no-op by default, dispatched in a fixed, logged order.

When each event fires (``task`` is the :class:`~vissl.trainer.task.SelfSupervisionTask`)::

    on_start(task)
    for phase in phases:
        on_phase_start(task)
        for batch in phase:                       # inside the train step
            forward          -> on_forward(task)
            loss, meters     -> on_loss_and_meter(task)
            backward         -> on_backward(task)       # train phases only
            optimizer step   -> on_update(task)         # train phases only
        (trainer)          -> on_step(task)
        on_phase_end(task)
    on_end(task)
    on_exception(task)  # instead of on_end, when anything raises; then re-raised

Per-batch events must stay cheap: they run every iteration. Read device values only every
``task.config.LOG_FREQUENCY`` iterations (``task.is_log_iteration``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from enum import Enum
from typing import Any

from vissl.errors import ConfigError

#: What hooks receive: a :class:`~vissl.trainer.task.SelfSupervisionTask`. Typed loosely
#: here because the trainer imports this module (hooks sit below the trainer); a hook
#: module annotates its own methods with the task class.
SelfSupervisionTask = Any

logger = logging.getLogger(__name__)


class SSLClassyHookFunctions(Enum):
    """The hook events, in VISSL's names."""

    on_start = "on_start"
    on_phase_start = "on_phase_start"
    on_forward = "on_forward"
    on_loss_and_meter = "on_loss_and_meter"
    on_backward = "on_backward"
    on_update = "on_update"
    on_step = "on_step"
    on_phase_end = "on_phase_end"
    on_end = "on_end"
    on_exception = "on_exception"


HOOK_EVENTS: tuple[str, ...] = tuple(e.value for e in SSLClassyHookFunctions)


class Priority:
    """Common priorities (lower runs first), as in mmengine."""

    HIGHEST = 0
    HIGH = 25
    NORMAL = 50
    LOW = 75
    LOWEST = 100


class VisslHook:
    """Base class of hooks: override the events you need; the others are skipped.

    Attributes:
        priority: lower runs first; equal priorities keep registration order.
        name: key of this hook's state in checkpoints; defaults to the class name.
    """

    priority: int = Priority.NORMAL
    _name: str | None = None

    @property
    def name(self) -> str:
        return self._name or type(self).__qualname__

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @staticmethod
    def _noop(task: SelfSupervisionTask) -> None:
        """VISSL's idiom ``on_x = ClassyHook._noop``: an explicit no-op (skipped by dispatch)."""

    def on_start(self, task: SelfSupervisionTask) -> None:
        """Once, before the first phase."""

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        """At the start of every train or test phase."""

    def on_forward(self, task: SelfSupervisionTask) -> None:
        """After the model's forward pass, before the loss."""

    def on_loss_and_meter(self, task: SelfSupervisionTask) -> None:
        """After the loss and the meters are computed."""

    def on_backward(self, task: SelfSupervisionTask) -> None:
        """After backward, before the optimizer step (train phases)."""

    def on_update(self, task: SelfSupervisionTask) -> None:
        """After the optimizer step (train phases)."""

    def on_step(self, task: SelfSupervisionTask) -> None:
        """After each train step returns, in the trainer."""

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        """At the end of every phase, after meters are synced across ranks."""

    def on_end(self, task: SelfSupervisionTask) -> None:
        """Once, after the last phase (not on failure)."""

    def on_exception(self, task: SelfSupervisionTask) -> None:
        """When training raises; the exception is re-raised afterwards."""

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints (plain containers and tensors only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""


# VISSL users subclass ClassyHook; keep that name working.
ClassyHook = VisslHook


def _overrides(hook: Any, event: str) -> bool:
    """Whether ``hook`` implements ``event`` with something other than the base no-op."""
    method = getattr(hook, event, None)
    if method is None or not callable(method):
        return False
    base = getattr(VisslHook, event)
    func = getattr(method, "__func__", method)
    if func is base:
        return False
    # VISSL hooks set unused events to a `_noop` staticmethod/function.
    return getattr(func, "__name__", "") not in ("_noop", "noop")


class HookPriorityError(ConfigError, TypeError):
    """A hook's ``priority`` is not a number (from config or the hook's attribute)."""


def check_priority(value: Any, owner: str, key_path: str | None = None) -> int | float:
    """``value`` if it is a valid hook priority (an int or float, not a bool).

    Args:
        value: the priority given.
        owner: what it belongs to, for the message (hook name or config entry).
        key_path: the config key it came from, if any.

    Raises:
        HookPriorityError: naming ``owner`` and the key (or ``priority`` attribute).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    where = key_path or f"{owner}.priority"
    raise HookPriorityError(
        f"{where}={value!r} ({type(value).__name__}) is not a hook priority: give a number, "
        f"lower runs first (Priority.HIGHEST={Priority.HIGHEST}, NORMAL={Priority.NORMAL}, "
        f"LOWEST={Priority.LOWEST}).",
        key_path,
    )


def _priority(hook: Any) -> int | float:
    return check_priority(getattr(hook, "priority", Priority.NORMAL), hook_name(hook))


class HookDispatcher:
    """Calls hooks per event, skipping hooks that do not implement the event.

    The order is fixed once: by ``priority`` (lower first), then registration order.
    Any object with some of the event methods works as a hook (duck typing).
    """

    def __init__(self, hooks: Iterable[Any]) -> None:
        indexed = list(enumerate(h for h in hooks if h is not None))
        indexed.sort(key=lambda ih: (_priority(ih[1]), ih[0]))
        self.hooks: list[Any] = [h for _, h in indexed]
        self._by_event: dict[str, tuple[Any, ...]] = {
            event: tuple(getattr(h, event) for h in self.hooks if _overrides(h, event))
            for event in HOOK_EVENTS
        }

    def run(self, event: str, task: Any) -> None:
        for fn in self._by_event[event]:
            fn(task)

    def has(self, event: str) -> bool:
        return bool(self._by_event[event])

    def describe(self) -> str:
        """A readable table of the hook order and the events each hook handles."""
        lines = ["hooks, in call order (priority, then registration):"]
        for i, h in enumerate(self.hooks):
            events = [e for e in HOOK_EVENTS if _overrides(h, e)]
            lines.append(
                f"  {i:2d}. {hook_name(h)} (priority {_priority(h)}): {', '.join(events) or '-'}"
            )
        return "\n".join(lines)


def hook_name(hook: Any) -> str:
    name = getattr(hook, "name", None)
    if callable(name):
        name = name()
    return str(name) if isinstance(name, str) and name else type(hook).__qualname__
