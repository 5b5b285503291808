"""``python -m phasemem``: the same command line as the ``phasemem`` script."""
import sys

from .commands.cli import main

sys.exit(main())
