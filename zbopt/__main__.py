"""`python -m zbopt` runs the CLI."""

import sys

from zbopt.cli import main

sys.exit(main())
