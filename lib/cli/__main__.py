"""``python -m taskfit.cli ...`` is the ``taskfit`` command."""

import sys

from taskfit.cli.app import main

sys.exit(main())
