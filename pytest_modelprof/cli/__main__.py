"""``python -m pytest_modelprof.cli``: the ``modelprof`` command."""

import sys

from . import main

sys.exit(main())
