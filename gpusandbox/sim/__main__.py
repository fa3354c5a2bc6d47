import sys

from gpusandbox.errors import SandboxError

from .cli import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SandboxError as e:
        print(f"gpusandbox: error: {e.line()}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        sys.exit(e.code)
