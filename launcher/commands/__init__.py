"""One module per ``sglang-launch`` subcommand, each with ``main(argv) -> int``."""
