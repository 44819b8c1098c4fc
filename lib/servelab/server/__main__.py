"""``python -m servelab.server [MODEL] [flags]`` (``--help`` lists them): ``serve.py`` does the work."""

import sys

from servelab.server.serve import main

if __name__ == "__main__":
    sys.exit(main())
