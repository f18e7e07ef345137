"""A hook priority that is not a number is an error naming the hook and the key."""

from __future__ import annotations

from typing import Any

import pytest

from vissl.errors import ConfigError
from vissl.hooks import (
    HOOK_REGISTRY,
    HookDispatcher,
    HookPriorityError,
    Priority,
    VisslHook,
    build_hook,
    register_hook,
)


class _StepHook(VisslHook):
    def on_step(self, task: Any) -> None:
        pass


if "_priority_test_hook" not in HOOK_REGISTRY:
    register_hook("_priority_test_hook")(_StepHook)


@pytest.mark.parametrize("bad", ["high", None, True, [1]])
def test_config_priority_must_be_a_number(bad: Any) -> None:
    spec = {"name": "_priority_test_hook", "priority": bad}
    with pytest.raises(HookPriorityError) as info:
        build_hook(spec, index=3)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, TypeError)
    assert err.key_path == "config.HOOKS.CUSTOM_HOOKS[3].priority"
    assert "config.HOOKS.CUSTOM_HOOKS[3].priority" in str(err)
    assert repr(bad) in str(err)


@pytest.mark.parametrize("good", [0, 60, 12.5])
def test_config_priority_numbers_are_kept(good: Any) -> None:
    hook = build_hook({"name": "_priority_test_hook", "priority": good})
    assert hook.priority == good


class _StringPriority(_StepHook):
    priority = "LOW"  # type: ignore[assignment]


def test_class_attribute_priority_must_be_a_number() -> None:
    with pytest.raises(HookPriorityError, match=r"_StringPriority\.priority='LOW'"):
        HookDispatcher([_StepHook(), _StringPriority()])


def test_numeric_class_priorities_still_order_hooks() -> None:
    class Late(_StepHook):
        priority = Priority.LOW

    class Early(_StepHook):
        priority = Priority.HIGH

    dispatcher = HookDispatcher([Late(), Early()])
    assert [type(h) for h in dispatcher.hooks] == [Early, Late]
