"""``python -m phasemem``: the same command line as the ``phasemem`` script."""
import sys

from .cli import main

sys.exit(main())
