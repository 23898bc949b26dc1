"""python -m gpt.train: the same as gpt-train."""

import sys

from .cli import main

sys.exit(main())
