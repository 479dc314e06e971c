"""`python -m loadgen` runs the loadgen command line."""

from loadgen.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
