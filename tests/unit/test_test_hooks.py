"""GPUSANDBOX_TEST_PAUSE is honoured only by an install carrying a root-owned,
not group/other-writable marker (testhook.pause_hook_enabled)."""
import os

import pytest

import gpusandbox
from gpusandbox.testhook import TEST_MARKER, pause_hook_enabled


def test_this_checkout_has_no_marker():
    assert not pause_hook_enabled()
    assert not os.path.exists(os.path.join(os.path.dirname(gpusandbox.__file__), TEST_MARKER))


def test_missing_marker_or_a_directory(tmp_path):
    assert not pause_hook_enabled(str(tmp_path))
    (tmp_path / TEST_MARKER).mkdir()
    assert not pause_hook_enabled(str(tmp_path))


def test_marker_owned_by_a_user_is_ignored(tmp_path):
    m = tmp_path / TEST_MARKER
    m.write_text("")
    os.chmod(m, 0o644)
    if os.geteuid() == 0:
        os.chown(m, 65534, 65534)
    assert not pause_hook_enabled(str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="making a root-owned marker needs root")
@pytest.mark.parametrize("mode,enabled", [(0o644, True), (0o600, True), (0o664, False),
                                          (0o646, False)])
def test_root_owned_marker(tmp_path, mode, enabled):
    m = tmp_path / TEST_MARKER
    m.write_text("")
    os.chown(m, 0, 0)
    os.chmod(m, mode)
    assert pause_hook_enabled(str(tmp_path)) is enabled


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_symlink_to_a_root_file_is_not_a_marker(tmp_path):
    os.symlink("/etc/passwd", tmp_path / TEST_MARKER)
    assert not pause_hook_enabled(str(tmp_path))
