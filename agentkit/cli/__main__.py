"""``python -m agentkit.cli``: the ``agentkit`` command."""

import sys

from agentkit.cli import main

sys.exit(main())
