"""``python -m logits_processing``: the ``logits-processing`` command (see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
