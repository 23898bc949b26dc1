"""python -m gpt.explain: the same as gpt-explain."""

import sys

from .cli import main

sys.exit(main())
