"""`python -m ipcount` runs the command-line interface."""

from ipcount.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
