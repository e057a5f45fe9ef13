"""`python -m cudaforge`: the `cudaforge` command (cudaforge.cli.main)."""

import sys

from .cli.main import main

sys.exit(main())
