"""One module per ``jobctl`` subcommand; ``jobctl.cli.COMMANDS`` lists them."""
