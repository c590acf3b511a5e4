"""`python -m eaglespec`: the command line."""

from eaglespec.cli import main

if __name__ == "__main__":
    main(prog_name="eaglespec")
