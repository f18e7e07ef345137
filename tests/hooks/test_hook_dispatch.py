"""Hook dispatch: order by priority then registration; skipped events; duck typing."""

from __future__ import annotations

import pytest

from vissl.errors import ConfigError
from vissl.hooks import (
    HOOK_REGISTRY,
    HookDispatcher,
    Priority,
    VisslHook,
    build_hook,
    register_hook,
)


class Recorder(VisslHook):
    def __init__(self, name, log, priority=Priority.NORMAL):
        self._name, self.log, self.priority = name, log, priority

    @property
    def name(self):
        return self._name

    def on_step(self, task):
        self.log.append(self._name)


def test_order_is_priority_then_registration():
    log: list[str] = []
    hooks = [
        Recorder("a", log, 50),
        Recorder("b", log, 10),
        Recorder("c", log, 50),
        Recorder("d", log, 90),
    ]
    HookDispatcher(hooks).run("on_step", task=None)
    assert log == ["b", "a", "c", "d"]


def test_hooks_that_do_not_override_an_event_are_skipped():
    class OnlyStart(VisslHook):
        def on_start(self, task):
            pass

    d = HookDispatcher([OnlyStart(), Recorder("r", [])])
    assert d.has("on_start") and d.has("on_step")
    assert not d.has("on_forward")
    assert len(d._by_event["on_step"]) == 1


def test_any_object_with_event_methods_is_a_hook():
    calls = []

    class Duck:
        def on_forward(self, task):
            calls.append(task)

    class VisslStyle:
        @staticmethod
        def _noop(task):
            raise AssertionError("noop must be skipped")

        on_start = _noop

        def on_update(self, task):
            calls.append("update")

    d = HookDispatcher([Duck(), VisslStyle(), None])
    d.run("on_forward", "t")
    d.run("on_update", "t")
    d.run("on_start", "t")
    assert calls == ["t", "update"]
    assert "Duck" in d.describe() and "on_forward" in d.describe()


def test_build_custom_hook_from_spec_with_priority():
    @register_hook("test_dispatch_counter")
    class Counter(VisslHook):
        def __init__(self, every: int = 1):
            self.every = every

    try:
        hook = build_hook({"name": "test_dispatch_counter", "every": 3, "priority": 7})
        assert hook.every == 3 and hook.priority == 7
        with pytest.raises(ConfigError, match=r"CUSTOM_HOOKS\[2\].*every"):
            build_hook({"name": "test_dispatch_counter", "evry": 3}, index=2)
    finally:
        HOOK_REGISTRY.unregister("test_dispatch_counter")


def test_vissl_noop_idiom_and_settable_name():
    from vissl.hooks import ClassyHook

    class OldStyle(ClassyHook):
        on_start = ClassyHook._noop
        on_forward = ClassyHook._noop

        def on_step(self, task):
            task.append("step")

    hook = OldStyle()
    hook.name = "renamed"
    d = HookDispatcher([hook])
    assert not d.has("on_start") and not d.has("on_forward") and d.has("on_step")
    log: list[str] = []
    d.run("on_step", log)
    assert log == ["step"] and "renamed" in d.describe()
