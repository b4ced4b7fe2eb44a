"""``python -m xrun``: the same as the ``xrun`` console script."""

import sys

from xrun.cli import main

sys.exit(main())
