"""A fork server for the docs examples: run many small Python scripts without paying
for ``import torch, vissl`` in each.

Started once per test session as ``python _zygote.py`` (stdin/stdout: one JSON object
per line). It imports torch and vissl's built-in plugins, then for each request forks a
child that behaves like ``python SCRIPT ARGV...`` started in ``cwd`` with ``env``:
``sys.argv``, ``sys.path[0]`` (the script's folder), ``__name__ == "__main__"``, the exit
status of ``SystemExit`` and a traceback plus status 1 on an exception. The child's
stdout/stderr go to the files named in the request; it runs in its own process group,
which is killed when it outlives ``timeout``. The reply is
``{"returncode": int, "timed_out": bool}`` (a signal gives ``-signum``, as subprocess).

The server never runs torch ops, uses CUDA or starts threads, so forking it is safe.
Scripts that start processes with the ``spawn`` method pickle functions by reference to
``__main__``, which is this server in a child: run those with a fresh interpreter instead
(the tests do so for slow and GPU blocks).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def _preload() -> None:
    import torch  # noqa: F401

    from vissl.utils.imports import import_vissl_plugins

    import_vissl_plugins()
    import hydra  # noqa: F401
    import omegaconf  # noqa: F401

    # children inherit the defaults already parsed (tests/_yaml_cache.py)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    try:
        from tests import _yaml_cache
    finally:
        sys.path.remove(root)
    _yaml_cache.install()
    _yaml_cache.warm()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python script argv...``; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (devnull, out, err):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # re-read TMPDIR
        script = os.path.abspath(request["script"])
        sys.argv = [script, *request["argv"]]
        sys.path[0] = os.path.dirname(script)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import runpy

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit
        import logging

        atexit._run_exitfuncs()
        logging.shutdown()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": False}
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": True}
        time.sleep(0.02)


def main() -> None:
    channel_in = sys.stdin
    channel_out = sys.stdout
    _preload()
    channel_out.write(json.dumps({"ready": True}) + "\n")
    channel_out.flush()
    for line in channel_in:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        reply = _wait(pid, float(request.get("timeout", 600)))
        channel_out.write(json.dumps(reply) + "\n")
        channel_out.flush()


if __name__ == "__main__":
    main()
