import sys

from gpusandbox.errors import exit_main

from .cli import main

if __name__ == "__main__":
    exit_main(main, sys.argv[1:])   # errors as `gpusandbox sim` prints them
