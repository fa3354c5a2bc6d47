"""The build step pyproject.toml cannot express: the man pages and the shell
completion scripts, generated from the command line's own tables
(gpusandbox/cliref) into build/share/ and installed under the prefix's
share/ (man pages in share/man/man1, which man finds for a venv whose bin/
is on PATH; bash-completion and zsh site-functions beside them).  The
metadata and everything else stay in pyproject.toml."""
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join("build", "share")


def share_files():
    sys.path.insert(0, HERE)
    try:
        from gpusandbox.cliref import generate_share
        written = generate_share(os.path.join(HERE, OUT))
    finally:
        sys.path.remove(HERE)
    dirs = {}
    for rel in written:
        dirs.setdefault(os.path.join("share", os.path.dirname(rel)), []).append(
            os.path.join(OUT, rel))
    return sorted(dirs.items())


setup(data_files=share_files())
