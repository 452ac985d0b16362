"""``python -m handlerkit.cli``: the ``handlerkit`` command."""

import sys

from handlerkit.cli import main

sys.exit(main())
