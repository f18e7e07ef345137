"""The evaluation benchmarks of ``tools/``, one module a tool: each has the tool's
``main(argv) -> int`` (config overrides in, exit code out; run it through
:func:`vissl.evaluation.cli.run_tool` for the tool's error lines) and its steps."""
