"""Every tool test detaches the log handlers its tool attached (:mod:`tests.tools._fixtures`)."""

from tests.tools._fixtures import drop_vissl_log_handlers  # noqa: F401 (an autouse fixture)
