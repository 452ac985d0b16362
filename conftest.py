"""Settings for every test run from the repository root: the unit tests and the notebooks."""

import os

# No progress bars in the test log or in the notebooks' outputs: nbval's kernels inherit this.
os.environ.setdefault("HANDLERKIT_PROGRESS", "0")
