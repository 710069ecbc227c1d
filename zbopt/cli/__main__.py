"""`python -m zbopt.cli` runs the CLI, as `python -m zbopt` does."""

from zbopt.__main__ import run

run()
