"""``python -m stitch_graph.cli``."""

import sys

from stitch_graph.cli.main import main

sys.exit(main())
