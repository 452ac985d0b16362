"""``python -m handlerkit._fixtures [--out-root DIR] [--check]``: see ``build.py``."""

import sys

from handlerkit._fixtures.build import main

sys.exit(main())
