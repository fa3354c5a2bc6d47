"""cProfile of one gpusandbox launch, imports included:
`python profile_launch.py OUT.txt run [options] IMAGE CMD...`

Writes the top functions by cumulative and by own time to OUT.txt.  Only the
launcher process writes: the sandbox's init is a fork of it and must not."""
import cProfile
import io
import os
import pstats
import sys

TOP = 35


def _dump(prof, out, pid0):
    if os.getpid() != pid0:
        return
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("cumulative").print_stats(TOP)
    st.sort_stats("tottime").print_stats(TOP)
    with open(out, "w") as f:
        f.write(buf.getvalue())


def main():
    out, args = sys.argv[1], sys.argv[2:]
    pid0 = os.getpid()
    sys.argv = ["gpusandbox", *args]
    real_exit = os._exit
    prof = cProfile.Profile()

    def _exit(code):                  # a launcher may leave through os._exit
        _dump(prof, out, pid0)
        real_exit(code)
    os._exit = _exit
    rc = 1
    prof.enable()
    try:
        from gpusandbox.__main__ import main as gmain
        rc = gmain(args)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        _dump(prof, out, pid0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
