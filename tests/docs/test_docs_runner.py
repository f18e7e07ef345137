"""The docs-examples runner fails on broken examples (so test_docs_examples.py can fail).

Each test feeds the runner of ``tests/docs/_doc_blocks.py`` a small Markdown page, as
``test_docs_examples.py`` feeds it the real docs, and checks the verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs._doc_blocks import (
    Block,
    DocsExampleFailed,
    DocsMarkerError,
    Zygote,
    chain,
    check_block,
    collect,
    continued_by,
    parse_blocks,
    run_block,
)


def page(text: str) -> list[Block]:
    return parse_blocks(text, "docs/example.md")


def test_a_python_block_that_raises_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("Text.\n\n```python\nx = 1\nraise ValueError('broken example')\n```\n")
    with pytest.raises(DocsExampleFailed, match=r"(?s)docs/example\.md:3.*broken example"):
        run_block(blocks[0], blocks, tmp_path, zygote)


def test_a_working_python_block_passes(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("```python\nimport vissl, sys\nprint('argv', sys.argv[1:], __name__)\n```\n")
    result = run_block(blocks[0], blocks, tmp_path, zygote)
    assert "argv [] __main__" in result.stdout


def test_a_python_block_that_exits_non_zero_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("```python\nimport sys\nsys.exit(3)\n```\n")
    with pytest.raises(DocsExampleFailed, match="exit status 3"):
        run_block(blocks[0], blocks, tmp_path, zygote)


def test_a_shell_block_with_a_wrong_config_name_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page(
        "```bash\npython tools/run_distributed_engines.py config=quick_startt "
        "config.OPTIMIZER.num_epochs=1\n```\n"
    )
    with pytest.raises(DocsExampleFailed, match=r"(?s)exit status 2.*quick_startt"):
        run_block(blocks[0], blocks, tmp_path, zygote)


def test_a_failing_command_inside_a_shell_block_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("```bash\nfalse\necho never printed\n```\n")
    with pytest.raises(DocsExampleFailed):
        run_block(blocks[0], blocks, tmp_path, zygote)


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("config=quick_startt", r"quick_startt"),
        (
            "config=quick_start config.OPTIMIZER.num_epoch=3",
            r"Did you mean config\.OPTIMIZER\.num_epochs",
        ),
        ("config=quick_start config.LOSS.name=simclr_loss", r"Unknown loss 'simclr_loss'"),
    ],
)
def test_a_slow_command_is_checked_without_running(
    tmp_path: Path, zygote: Zygote, command: str, error: str
) -> None:
    text = (
        "<!-- docs-test: slow -->\n```bash\n"
        f"python tools/run_distributed_engines.py {command} \\\n    config.CHECKPOINT.DIR=/tmp/x\n```\n"
    )
    blocks = page(text)
    assert blocks[0].modes == ("slow",)
    with pytest.raises(DocsExampleFailed, match=error):
        check_block(blocks[0], blocks, tmp_path, zygote)


def test_a_valid_cluster_command_checks(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page(
        "<!-- docs-test: cluster -->\n```bash\nDIR=/checkpoint/$USER/x\n"
        "python tools/run_distributed_engines.py config=pretrain/simclr/simclr_8gpu_resnet \\\n"
        "    config.DATA.TRAIN.DATA_PATHS=[/data/imagenet/train] config.CHECKPOINT.DIR=$DIR\n"
        "python tools/kill_and_resume.py --trials 2\n```\n"
    )
    out = check_block(blocks[0], blocks, tmp_path, zygote)
    assert "config valid" in out and "arguments parse" in out


def test_a_wrong_flag_of_an_argparse_tool_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page(
        "<!-- docs-test: slow -->\n```bash\npython tools/kill_and_resume.py --trails 2\n```\n"
    )
    with pytest.raises(DocsExampleFailed, match="unrecognized arguments: --trails"):
        check_block(blocks[0], blocks, tmp_path, zygote)


def test_a_misspelt_yaml_key_fails(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("```yaml\nconfig:\n  OPTIMIZER:\n    num_epoch: 3\n```\n")
    with pytest.raises(DocsExampleFailed, match=r"config\.OPTIMIZER\.num_epochs"):
        check_block(blocks[0], blocks, tmp_path, zygote)


def test_a_bare_section_fragment_is_validated(tmp_path: Path, zygote: Zygote) -> None:
    good = page("```yaml\nDATA:\n  TRAIN:\n    BATCHSIZE_PER_REPLICA: 32\n```\n")
    assert check_block(good[0], good, tmp_path / "a", zygote) == "valid vissl config"
    bad = page("```yaml\nDATA:\n  TRAIN:\n    BATCHSIZE_PER_REPLICA: thirty\n```\n")
    with pytest.raises(DocsExampleFailed, match="must be int"):
        check_block(bad[0], bad, tmp_path / "b", zygote)


def test_a_python_block_that_does_not_compile_fails_its_check(tmp_path: Path) -> None:
    blocks = page("<!-- docs-test: gpu -->\n```python\ndef f(:\n```\n")
    with pytest.raises(DocsExampleFailed, match="does not compile"):
        check_block(blocks[0], blocks, tmp_path, None)


def test_json_and_toml_are_parsed(tmp_path: Path) -> None:
    blocks = page('```json\n{"a": 1,}\n```\n\n```toml\n[x]\ny = 1\n```\n')
    with pytest.raises(DocsExampleFailed, match="does not parse as json"):
        check_block(blocks[0], blocks, tmp_path, None)
    assert check_block(blocks[1], blocks, tmp_path, None) == "parses as toml"


def test_file_blocks_are_written_for_the_page(tmp_path: Path, zygote: Zygote) -> None:
    text = (
        "```python\nfrom my_mod import VALUE, OTHER\nassert (VALUE, OTHER) == (1, 2)\n```\n\n"
        "<!-- docs-test: file my_mod.py -->\n```python\nVALUE = 1\n```\n\n"
        "<!-- docs-test: file my_mod.py -->\n```python\nOTHER = VALUE + 1\n```\n"
    )
    blocks = page(text)
    assert [b.file for b in blocks] == [None, "my_mod.py", "my_mod.py"]
    run_block(blocks[0], blocks, tmp_path / "a", zygote)  # sees both parts
    run_block(blocks[1], blocks, tmp_path / "b", zygote)  # the file up to its first part
    broken = page(text.replace("OTHER = VALUE + 1", "OTHER = MISSING"))
    with pytest.raises(DocsExampleFailed, match="NameError"):
        run_block(broken[2], broken, tmp_path / "c", zygote)


def test_continues_runs_the_blocks_before(tmp_path: Path, zygote: Zygote) -> None:
    text = (
        "```bash\necho 41 > value.txt\n```\n\n"
        "<!-- docs-test: continues -->\n```python\n"
        "n = int(open('value.txt').read()) + 1\nopen('value.txt', 'w').write(str(n))\n```\n\n"
        '<!-- docs-test: continues -->\n```bash\ntest "$(cat value.txt)" = 42\n```\n'
    )
    blocks = page(text)
    assert [b.line for b in chain(blocks[2], blocks)] == [1, 6, 12]
    assert continued_by(blocks[0], blocks) is blocks[1]
    run_block(blocks[2], blocks, tmp_path, zygote)
    alone = page(text.replace("echo 41 > value.txt", "echo 41 > other.txt"))
    with pytest.raises(DocsExampleFailed, match="value.txt"):
        run_block(alone[1], alone, tmp_path / "alone", zygote)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<!-- docs-test: slwo -->\n```bash\nls\n```\n", "unknown marker"),
        ("<!-- docs-test: skip -->\n```bash\nls\n```\n", "needs a reason"),
        ("<!-- docs-test: slow -->\n\nText.\n\n```bash\nls\n```\n", "directly before"),
        ("<!-- docs-test: slow -->\n```text\nls\n```\n", "never run"),
        ("<!-- docs-test: continues -->\n```bash\nls\n```\n", "no python/shell block"),
        (
            "<!-- docs-test: slow -->\n```bash\nls\n```\n\n"
            "<!-- docs-test: continues -->\n```bash\nls\n```\n",
            "mark this block the same",
        ),
    ],
)
def test_bad_markers_are_errors(text: str, error: str) -> None:
    with pytest.raises(DocsMarkerError, match=error):
        page(text)


def test_the_docs_are_collected() -> None:
    blocks = collect()
    ids = [b.id for b in blocks]
    assert len(ids) == len(set(ids))
    docs = {b.doc for b in blocks}
    assert "README.md" in docs and "docs/getting_started.md" in docs
    assert sum(b.runs_by_default for b in blocks) >= 20


def test_an_unmarked_install_block_is_refused(tmp_path: Path, zygote: Zygote) -> None:
    blocks = page("```bash\ntouch ran.txt\npython3 -m venv .venv && pip install -e .\n```\n")
    with pytest.raises(DocsExampleFailed, match="installs packages"):
        run_block(blocks[0], blocks, tmp_path, zygote)
    assert not list(tmp_path.rglob("ran.txt"))
    marked = page("<!-- docs-test: skip installs -->\n```bash\npip install -e .\n```\n")
    assert marked[0].modes == ("skip",) and marked[0].skip_reason == "installs"
