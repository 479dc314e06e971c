"""`python -m ipcount` runs the command-line interface; also the spark-submit entry file."""

import os
import sys

# spark-submit runs this file as a script, which puts the package directory first on sys.path,
# where ipcount/logging.py would shadow the standard library's logging: drop that entry.
if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

from ipcount.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
