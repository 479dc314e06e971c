"""`python -m ipcount` runs the command-line interface; also the spark-submit entry file."""

import os
import sys

# spark-submit runs this file as a script, which puts the package directory first on sys.path,
# where ipcount's subpackages (kafka/, config/, job/, ...) would shadow top-level modules of the
# same name: drop that entry; ipcount itself is imported from the install or the --py-files zip.
_HERE = os.path.dirname(os.path.realpath(__file__))
if sys.path and os.path.realpath(sys.path[0] or ".") == _HERE:
    del sys.path[0]

from ipcount.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
