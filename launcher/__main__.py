"""``python -m launcher`` is ``sglang-launch``."""

import sys

from launcher.cli import main

sys.exit(main())
