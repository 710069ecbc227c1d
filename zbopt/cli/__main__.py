"""`python -m zbopt.cli` runs the CLI, as `python -m zbopt` does."""

import sys

from zbopt.cli import main

sys.exit(main())
