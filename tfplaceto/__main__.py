"""`python -m tfplaceto`: the command line."""

import sys

from tfplaceto.cli import main

sys.exit(main())
