"""``python -m taskfit.cli ...`` is the ``taskfit`` command."""

import sys

from taskfit.cli.main import main

sys.exit(main())
