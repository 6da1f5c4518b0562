"""`python -m frank` runs the CLI."""

from frank.cli import main

main()
