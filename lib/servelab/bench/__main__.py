"""``python -m servelab.bench``: the engine's benchmarks (see ``servelab.bench.run``)."""

import sys

from servelab.bench.run import main

sys.exit(main())
