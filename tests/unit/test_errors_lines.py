"""errors.os_error / real_path and netutil.net_cause: the one-line forms."""
import errno
import os
import socket

import pytest

from gpusandbox.errors import EXIT_SIGINT, EXIT_SIGTERM, Interrupted, interrupted, os_error, \
    real_path
from gpusandbox.image.netutil import net_cause


def test_proc_fd_path_becomes_the_real_one(tmp_path):
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        e = PermissionError(errno.EACCES, "Permission denied", f"/proc/self/fd/{fd}/index.json")
        assert real_path(e.filename) == f"{tmp_path}/index.json"
        assert os_error("pull", e).line() == f"pull: Permission denied: {tmp_path}/index.json"
    finally:
        os.close(fd)
    # the fd is gone: the path is left out rather than shown as an fd
    assert os_error("pull", e).line() == "pull: Permission denied"


def test_interrupted_codes():
    assert interrupted(KeyboardInterrupt()).code == EXIT_SIGINT == 130
    err = interrupted(Interrupted(15), "pull")
    assert (err.code, err.line()) == (EXIT_SIGTERM, "pull interrupted by SIGTERM")


def _fail(url):
    import requests
    with pytest.raises(requests.RequestException) as e:
        requests.get(url, timeout=5)
    return e.value


def test_net_cause_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert net_cause(_fail(f"http://127.0.0.1:{port}/v2/")) == \
        "connection refused (nothing listens on that port)"


def test_net_cause_resolution():
    import urllib3
    inner = socket.gaierror(-2, "Name or service not known")
    try:
        try:
            raise inner
        except socket.gaierror as g:
            raise urllib3.exceptions.NameResolutionError("x.invalid", None, g) from g
    except Exception as e:
        outer = e
    assert net_cause(outer) == "cannot resolve the host name (Name or service not known)"
