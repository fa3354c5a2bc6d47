"""Runs CLI cases through the real entry point, one forked child per case.

Usage (by test_fuzz_cli.py, with the installed CLI's python):
    python fuzz_harness.py CASES.json RESULTS.json

CASES.json: a list of argv lists (strings; non-UTF-8 bytes as surrogate
escapes, as Python's own argv decoding gives them).  Each case runs
gpusandbox.__main__.main(argv) in a fork of this process, with the same
top-level handling as bin/gpusandbox's `sys.exit(main())`: SystemExit gives
the status, any other exception a traceback and status 1.  The fork saves
an interpreter start per case; the code under test is the real entry point.
RESULTS.json: a list of [status, stderr, launcher pid] per case.
"""
import json
import os
import sys
import time
import traceback

from gpusandbox.__main__ import main

TIMEOUT = 60.0


def _child(argv, err_fd):
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err_fd, 2)
    sys.argv = ["gpusandbox"] + argv
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:   # noqa: BLE001 - what the interpreter does at top level
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:   # noqa: BLE001
        pass
    os._exit(code & 0xFF)


def run_case(argv, err_fd):
    os.lseek(err_fd, 0, 0)
    os.ftruncate(err_fd, 0)
    pid = os.fork()
    if pid == 0:
        try:
            _child(argv, err_fd)
        finally:
            os._exit(1)
    end = time.monotonic() + TIMEOUT
    while True:
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() > end:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -1, "harness: timed out", pid
        time.sleep(0.001)
    code = os.waitstatus_to_exitcode(st)
    os.lseek(err_fd, 0, 0)
    chunks = []
    while True:
        b = os.read(err_fd, 1 << 20)
        if not b:
            break
        chunks.append(b)
    return code, b"".join(chunks).decode("utf-8", "surrogateescape"), pid


def main_harness(cases_path, results_path):
    with open(cases_path) as f:
        cases = json.load(f)
    err_fd = os.memfd_create("fuzz-stderr", os.MFD_CLOEXEC)
    results = [run_case(argv, err_fd) for argv in cases]
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main_harness(sys.argv[1], sys.argv[2])
