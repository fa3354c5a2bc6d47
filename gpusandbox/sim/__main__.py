import sys

from gpusandbox.errors import SandboxError, message

from .cli import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SandboxError as e:
        sys.stderr.write(message(e))   # as `gpusandbox sim` prints it
        sys.exit(e.code)
