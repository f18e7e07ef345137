"""The fenced code blocks of the docs, their ``docs-test`` markers, and how each is tested.

Which blocks run (see ``tests/docs/test_docs_examples.py`` for the tests):

- ```` ```python ```` blocks run as a script (``python docs_example.py``), and
  ```` ```bash ````/```` ```sh ````/```` ```shell ```` blocks with ``bash -euo pipefail``,
  both in a sandbox: a fresh folder that mirrors the repository root (symlinks to its
  files and folders, not the hidden ones, so ``python tools/...`` and ``configs/...`` work
  as from the root) where what the example writes (``checkpoints/``, files) stays;
  ``TMPDIR`` is a fresh folder too and the venv's ``bin`` is first on ``PATH``. Python
  blocks of the default run are forked from an interpreter that has imported torch and
  vissl already (``_zygote.py``; ``VISSL_DOCS_TEST_FRESH=1`` starts a fresh one per block
  instead, as slow and GPU blocks always do). A shell block that installs packages or makes
  a virtual environment is refused unless it is marked ``skip``.
- ```` ```yaml ```` blocks are parsed; one that looks like a vissl config (a ``config:`` key,
  or only section keys such as ``DATA:``/``MODEL:``) is laid over ``defaults.yaml`` and
  validated, so a misspelt key fails (unless marked ``skip``). ```` ```json ```` and
  ```` ```toml ```` blocks are parsed. Other blocks (```` ```text ````, no language, ...)
  are not tested.

Markers are HTML comments on the line(s) directly before the fence (invisible on GitHub
and in the built site):

- ``<!-- docs-test: slow -->``: runs only under ``pytest -m slow``;
- ``<!-- docs-test: gpu -->``: runs only where CUDA is available (with ``slow`` too: only
  under ``-m slow`` there);
- ``<!-- docs-test: cluster -->``: never run (several GPUs or nodes, SLURM, a full data set);
- ``<!-- docs-test: skip REASON -->``: never run, for blocks that cannot run anywhere;
- ``<!-- docs-test: file PATH -->``: the block is (a part of) the file ``PATH`` of the
  page's example: it is written to the sandbox of every block of the same page (blocks
  with the same ``PATH`` are appended in page order), and tested on its own as that file
  up to this part (a Python file runs, a YAML file is validated);
- ``<!-- docs-test: continues -->``: the block goes on from the page's previous python or
  shell block (for example a kNN probe of the checkpoint the block before trained): its
  test runs that block (and what it continues) first, in the same sandbox. It must carry
  the markers of the block it continues; that block's own run is then left to this test.

A block that does not run in the default test run is still checked there, cheaply: a
Python block is compiled; in a shell block every ``python``/``torchrun`` command is
recorded instead of run, and each command with ``config=`` is composed and validated with
all its overrides (no training), an ``argparse`` script gets its arguments parsed, and any
other script must exist. So a renamed config, key or flag fails in CI even where the
command itself is too slow or needs a cluster. Other commands of the block run for real in
that mode (``cd``, variables), except a few that install, submit or wait (``pip``,
``sbatch``, ``sleep``, ...), which do nothing.

Examples must not write through the sandbox's symlinks (``echo ... > configs/config/x``
would write into the checkout); write such files with a ``file`` block, which copies the
folders on its path first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent

PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"bash", "sh", "shell"}
YAML_LANGS = {"yaml", "yml"}
PARSED_LANGS = {"json", "toml"}
RUN_LANGS = PYTHON_LANGS | SHELL_LANGS
TESTED_LANGS = RUN_LANGS | YAML_LANGS | PARSED_LANGS

_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_ANY_MARKER = re.compile(r"<!--\s*docs-test")
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")

#: Sandbox entries never mirrored from the repository: outputs of earlier runs (hidden
#: entries, such as .git and .venv, are never mirrored either).
NOT_MIRRORED = {"checkpoints", "site", "build", "dist"}

#: Commands that install packages or make environments: a block with one must be marked
#: ``skip`` (CI's own set-up installs), and is refused before anything runs.
INSTALLS = re.compile(r"\b(pip3?|uv pip|conda|mamba) install\b|-m venv\b|\bvirtualenv\b")

#: Prepended to a shell block in check mode: commands are recorded, not run.
CHECK_PRELUDE = r"""
__docs_record() { printf '%s\0' "$PWD" "$@" > "$DOCS_CHECK_DIR/$(date +%s%N)_$BASHPID"; }
python() { __docs_record python "$@"; }
python3() { __docs_record python3 "$@"; }
torchrun() { __docs_record torchrun "$@"; }
timeout() { while [[ "$1" == -* ]]; do shift; done; shift; "$@"; }
for __docs_cmd in pip pip3 uv conda curl wget git sbatch srun squeue scancel nvidia-smi \
    tensorboard mkdocs sleep kill; do eval "$__docs_cmd() { :; }"; done
"""


class DocsMarkerError(ValueError):
    """A ``docs-test`` marker that is unknown, malformed or not directly before a fence."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    doc: str  # the file, relative to the repository root ("docs/hooks.md")
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    modes: tuple[str, ...] = ()  # slow, gpu, cluster, skip
    skip_reason: str = ""
    file: str | None = None  # docs-test: file PATH
    continues: bool = False  # docs-test: continues

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runs_by_default(self) -> bool:
        """Executed in the default (fast) test run, on any machine."""
        return self.lang in RUN_LANGS and not self.modes


def _parse_marker(body: str, where: str) -> tuple[str, str]:
    word, _, rest = body.partition(" ")
    rest = rest.strip()
    if word in ("slow", "gpu", "cluster"):
        if rest:
            raise DocsMarkerError(f"{where}: 'docs-test: {word}' takes no argument: {body!r}")
        return word, ""
    if word == "continues":
        if rest:
            raise DocsMarkerError(f"{where}: 'docs-test: continues' takes no argument: {body!r}")
        return word, ""
    if word == "skip":
        if not rest:
            raise DocsMarkerError(f"{where}: 'docs-test: skip' needs a reason: skip REASON")
        return word, rest
    if word == "file":
        if not rest or os.path.isabs(rest) or ".." in Path(rest).parts:
            raise DocsMarkerError(
                f"{where}: 'docs-test: file PATH' needs a relative path without '..': {body!r}"
            )
        return word, rest
    raise DocsMarkerError(
        f"{where}: unknown marker 'docs-test: {body}'; use one of slow, gpu, cluster, "
        "skip REASON, file PATH, continues"
    )


def _dedent(line: str, indent: int) -> str:
    """Drop up to ``indent`` leading spaces (a fence indented inside a list item)."""
    stripped = line.lstrip(" ")
    return line[min(indent, len(line) - len(stripped)) :]


def parse_blocks(text: str, doc: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with the markers written before them."""
    lines = text.splitlines()
    blocks: list[Block] = []
    used_markers: set[int] = set()
    inside: set[int] = set()  # lines of fenced blocks (a marker shown in a block is text)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
        lang = info.split()[0].lower() if info else ""
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            j += 1
        body = [_dedent(ln, indent) for ln in lines[i + 1 : j]]
        inside.update(range(i, j + 1))
        modes: list[str] = []
        reason, file, continues = "", None, False
        k = i - 1
        while k >= 0 and _COMMENT.match(lines[k]):
            marker = _MARKER.match(lines[k])
            if marker:
                used_markers.add(k)
                kind, arg = _parse_marker(marker["body"], f"{doc}:{k + 1}")
                if kind == "file":
                    file = arg
                elif kind == "continues":
                    continues = True
                else:
                    modes.append(kind)
                    reason = arg or reason
            k -= 1
        if file and modes:
            raise DocsMarkerError(f"{doc}:{i + 1}: a 'file' block cannot also be {modes}")
        if ("cluster" in modes or "skip" in modes) and len(modes) > 1:
            raise DocsMarkerError(f"{doc}:{i + 1}: 'cluster'/'skip' exclude {modes}")
        if modes and lang not in TESTED_LANGS:
            raise DocsMarkerError(f"{doc}:{i + 1}: a ```{lang} block is never run; drop {modes}")
        if continues and (file or lang not in RUN_LANGS):
            raise DocsMarkerError(f"{doc}:{i + 1}: only a python or shell block continues")
        source = "\n".join(body) + "\n"
        blocks.append(
            Block(doc, i + 1, lang, source, tuple(sorted(modes)), reason, file, continues)
        )
        i = j + 1
    for block in blocks:
        if block.continues:
            previous = chain(block, blocks)[-2] if len(chain(block, blocks)) > 1 else None
            if previous is None:
                raise DocsMarkerError(f"{block.id}: 'continues' but no python/shell block before")
            if not set(previous.modes) <= set(block.modes):
                raise DocsMarkerError(
                    f"{block.id} continues {previous.id}, which is {list(previous.modes)}: "
                    "mark this block the same"
                )
    for n, line in enumerate(lines):
        if _ANY_MARKER.search(line) and n not in used_markers and n not in inside:
            raise DocsMarkerError(
                f"{doc}:{n + 1}: a docs-test marker must be an HTML comment on the line(s) "
                f"directly before a code fence: {line.strip()!r}"
            )
    return blocks


def doc_files(root: Path = REPO) -> list[Path]:
    """The Markdown files whose blocks are tested: docs/**/*.md and README.md."""
    files = sorted((root / "docs").rglob("*.md"))
    readme = root / "README.md"
    return [*files, readme] if readme.exists() else files


def collect(root: Path = REPO) -> list[Block]:
    blocks = []
    for path in doc_files(root):
        blocks += parse_blocks(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())
    return blocks


def chain(block: Block, blocks: Iterable[Block]) -> list[Block]:
    """``block`` and the blocks it continues, first one first."""
    runnable = [b for b in blocks if b.doc == block.doc and b.lang in RUN_LANGS and not b.file]
    out = [block]
    while out[0].continues:
        before = [b for b in runnable if b.line < out[0].line]
        if not before:
            break
        out.insert(0, before[-1])
    return out


def continued_by(block: Block, blocks: Iterable[Block]) -> Block | None:
    """The next block of the page if it continues ``block``."""
    runnable = [b for b in blocks if b.doc == block.doc and b.lang in RUN_LANGS and not b.file]
    after = [b for b in runnable if b.line > block.line]
    return after[0] if after and after[0].continues else None


def page_files(blocks: Iterable[Block], block: Block) -> list[Block]:
    """The ``file`` blocks of ``block``'s page; for a ``file`` block, its own file only up
    to itself (so each part is tested with the parts before it)."""
    return [
        b
        for b in blocks
        if b.doc == block.doc and b.file and (b.file != block.file or b.line <= block.line)
    ]


# ------------------------------------------------------------------------------ sandbox
def make_sandbox(base: Path, root: Path = REPO) -> tuple[Path, Path]:
    """A folder mirroring ``root`` (symlinks) to run examples in, and a fresh TMPDIR."""
    cwd, tmp = base / "repo", base / "tmp"
    cwd.mkdir(parents=True)
    tmp.mkdir()
    for entry in root.iterdir():
        if entry.name not in NOT_MIRRORED and not entry.name.startswith("."):
            (cwd / entry.name).symlink_to(entry)
    return cwd, tmp


def _unshare(folder: Path, sandbox: Path) -> None:
    """Turn the symlinked folders on the way to ``folder`` into real folders of symlinks,
    so that writing there never writes into the repository."""
    node = sandbox
    for part in folder.relative_to(sandbox).parts:
        node = node / part
        if node.is_symlink():
            target = node.resolve()
            node.unlink()
            node.mkdir()
            for entry in target.iterdir():
                (node / entry.name).symlink_to(entry)
        elif not node.exists():
            node.mkdir()


def write_files(sandbox: Path, files: Iterable[Block]) -> None:
    """Write the ``file`` blocks into the sandbox, appending parts of the same file."""
    written: set[str] = set()
    for block in files:
        assert block.file is not None
        path = sandbox / block.file
        _unshare(path.parent, sandbox)
        if path.is_symlink():
            path.unlink()
        with open(path, "a" if block.file in written else "w", encoding="utf-8") as f:
            f.write(block.source if block.file not in written else "\n" + block.source)
        written.add(block.file)


def block_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "Agg"
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


# ------------------------------------------------------------------------------ running
@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0

    def tail(self, n: int = 4000) -> str:
        return f"--- stdout ---\n{self.stdout[-n:]}\n--- stderr ---\n{self.stderr[-n:]}"


def run_process(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Result:
    """``argv`` in its own process group, killed with its children after ``timeout``."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Result(proc.returncode, out, err, timed_out, time.monotonic() - start)


@dataclass
class Zygote:
    """Client of ``_zygote.py``: runs scripts as ``python SCRIPT`` would, without paying
    for the imports of torch and vissl each time. One request at a time."""

    proc: subprocess.Popen[str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(HERE / "_zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the docs-test fork server did not start")

    def run(
        self, script: Path, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> Result:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            assert self.proc is not None and self.proc.stdin and self.proc.stdout
            # the outputs go to a folder of their own, never next to the script (which may
            # be a file of the repository)
            folder = Path(tempfile.mkdtemp(prefix="vissl_docs_out_"))
            out, err = folder / "stdout", folder / "stderr"
            request = {
                "script": str(script),
                "argv": argv,
                "cwd": str(cwd),
                "env": env,
                "stdout": str(out),
                "stderr": str(err),
                "timeout": timeout,
            }
            start = time.monotonic()
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the docs-test fork server died")
            reply = json.loads(line)
        result = Result(
            reply["returncode"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
            reply["timed_out"],
            time.monotonic() - start,
        )
        shutil.rmtree(folder, ignore_errors=True)
        return result

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.kill()  # nothing to flush: replies are read as they come
            self.proc.wait(timeout=30)


def run_python(
    script: Path,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    zygote: Zygote | None,
) -> Result:
    """``python script argv...`` in ``cwd``: forked from ``zygote`` or a fresh interpreter."""
    if zygote is None or os.environ.get("VISSL_DOCS_TEST_FRESH") == "1":
        return run_process([sys.executable, str(script), *argv], cwd, env, timeout)
    return zygote.run(script, argv, cwd, env, timeout)


def recorded_commands(folder: Path) -> list[dict[str, Any]]:
    commands = []
    for record in sorted(folder.iterdir()):
        cwd, *argv = record.read_bytes().decode().split("\0")[:-1]
        commands.append({"cwd": cwd, "argv": argv})
    return commands


def config_like(data: Any) -> bool:
    """A YAML document that is a vissl config: ``{config: ...}`` or config sections."""
    if not isinstance(data, dict) or not data:
        return False
    if "config" in data:
        return True
    from_defaults = yaml.safe_load((REPO / "vissl" / "config" / "defaults.yaml").read_text())
    sections = {k for k, v in from_defaults["config"].items() if isinstance(v, dict)}
    return set(data) <= sections


def parse_only(block: Block) -> Any:
    """Parse a YAML/JSON/TOML block; raise on a syntax error."""
    if block.lang in YAML_LANGS:
        return yaml.safe_load(block.source)
    if block.lang == "json":
        return json.loads(block.source)
    if block.lang == "toml":
        return tomllib.loads(block.source)
    raise ValueError(f"{block.id}: not a data block: {block.lang}")


def copy_docs_tree(dest: Path, root: Path = REPO) -> None:
    """Copy what ``mkdocs build`` reads (mkdocs.yml, docs/) to ``dest``."""
    shutil.copy(root / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copytree(root / "docs", dest / "docs")


# ------------------------------------------------------------------------------ the tests
FAST_TIMEOUT = 300.0
SLOW_TIMEOUT = 3600.0


class DocsExampleFailed(AssertionError):
    """A docs block failed to run or to check."""


def _fail(block: Block, what: str, result: Result | None = None) -> DocsExampleFailed:
    shown = "\n".join(f"    {ln}" for ln in block.source.rstrip().splitlines())
    text = f"{block.id}: {what}\n  the ```{block.lang} block:\n{shown}"
    if result is not None:
        status = "timed out" if result.timed_out else f"exit status {result.returncode}"
        text += f"\n  {status} after {result.seconds:.1f}s\n{result.tail()}"
    return DocsExampleFailed(text)


def _prepare(block: Block, blocks: Iterable[Block], base: Path) -> tuple[Path, Path]:
    cwd, tmp = make_sandbox(base)
    write_files(cwd, page_files(blocks, block))
    return cwd, tmp


def run_block(block: Block, blocks: Iterable[Block], base: Path, zygote: Zygote | None) -> Result:
    """Execute a python or shell block (after the blocks it continues) in a fresh sandbox.

    Raises:
        DocsExampleFailed: a block exits with a non-zero status or times out.
    """
    cwd, tmp = _prepare(block, blocks, base)
    env = block_env(tmp)
    fresh = bool(block.modes)  # slow and GPU blocks: a fresh interpreter, as a user runs it
    timeout = SLOW_TIMEOUT if block.modes else FAST_TIMEOUT
    result = Result(0, "", "")
    for n, part in enumerate(chain(block, blocks)):
        if part.lang in SHELL_LANGS and INSTALLS.search(part.source):
            raise _fail(
                part,
                "installs packages or makes an environment; mark it "
                "<!-- docs-test: skip REASON --> (CI's own set-up installs vissl)",
            )
        if part.lang in PYTHON_LANGS:
            script = cwd / part.file if part.file else cwd / f"docs_example_{n}.py"
            if not part.file:
                script.write_text(part.source, encoding="utf-8")
            result = run_python(script, [], cwd, env, timeout, None if fresh else zygote)
        else:
            script = base / f"docs_example_{n}.sh"
            script.write_text(part.source, encoding="utf-8")
            result = run_process(["bash", "-euo", "pipefail", str(script)], cwd, env, timeout)
        if result.returncode != 0 or result.timed_out:
            what = "the example failed"
            if part is not block:
                what = f"{part.id}, which this block continues, failed"
            raise _fail(part, what, result)
    return result


def check_block(block: Block, blocks: Iterable[Block], base: Path, zygote: Zygote | None) -> str:
    """The cheap check of a block (see the module docstring); returns what was checked.

    Raises:
        DocsExampleFailed: a syntax error, an invalid config, a command that does not check.
    """
    if block.lang in PYTHON_LANGS:
        try:
            compile(block.source, block.id, "exec")
        except SyntaxError as err:
            raise _fail(block, f"does not compile: {err}") from err
        return "compiles"
    if block.lang in PARSED_LANGS or block.lang in YAML_LANGS:
        try:
            data = parse_only(block)
        except Exception as err:
            raise _fail(block, f"does not parse as {block.lang}: {err}") from err
        if block.lang not in YAML_LANGS or not config_like(data):
            return f"parses as {block.lang}"
        if "skip" in block.modes:
            return f"parses as {block.lang} (not validated: {block.skip_reason})"
        cwd, tmp = _prepare(block, blocks, base)
        fragment = base / "fragment.yaml"
        fragment.write_text(block.source, encoding="utf-8")
        result = run_python(
            HERE / "_checks.py",
            ["yaml", str(fragment)],
            cwd,
            block_env(tmp),
            FAST_TIMEOUT,
            zygote,
        )
        if result.returncode != 0:
            raise _fail(block, "is not a valid vissl config", result)
        return "valid vissl config"
    if block.lang in SHELL_LANGS:
        cwd, tmp = _prepare(block, blocks, base)
        records = base / "commands"
        records.mkdir()
        script = base / "docs_check.sh"
        script.write_text(CHECK_PRELUDE + block.source, encoding="utf-8")
        env = {**block_env(tmp), "DOCS_CHECK_DIR": str(records)}
        env.setdefault("USER", "docs")
        shell = run_process(["bash", "-o", "pipefail", str(script)], cwd, env, FAST_TIMEOUT)
        commands = recorded_commands(records)
        if not commands:
            return "no python commands"
        listing = base / "commands.json"
        listing.write_text(json.dumps(commands), encoding="utf-8")
        result = run_python(
            HERE / "_checks.py",
            ["commands", str(listing)],
            cwd,
            block_env(tmp),
            FAST_TIMEOUT,
            zygote,
        )
        if result.returncode != 0:
            result.stderr = f"{result.stderr}\n--- the block in check mode ---\n{shell.stderr}"
            raise _fail(block, "a command does not check", result)
        return result.stdout
    raise ValueError(f"{block.id}: a ```{block.lang} block is not checked")


def needs_check(block: Block) -> bool:
    """Blocks with a cheap check in the default run: data blocks, and code that does not
    run there."""
    if block.lang in YAML_LANGS | PARSED_LANGS:
        return True
    return block.lang in RUN_LANGS and bool(block.modes)
