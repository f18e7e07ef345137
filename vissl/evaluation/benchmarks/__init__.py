"""The evaluation benchmarks of ``tools/``, one module a tool. Each has the tool's
``main(argv) -> int`` (config overrides in, exit code out;
:func:`vissl.evaluation.cli.run_tool` turns its errors into the tool's error lines) and its
steps; the tool's docstring lists the keys, outputs and exit codes."""
