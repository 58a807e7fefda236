"""The `dverl` command line: `main` (parsing, exit codes, the console scripts), `commands/` (one module per
group of subcommands) and `plotting` (`dverl plot`). Importing it imports nothing heavy: each command
imports what it needs only when it runs."""
