"""The pod's runtime directory: one that another user holds is refused, with
a way out the caller can take (it cannot remove another user's entry)."""
import os

import pytest

from gpusandbox.errors import SandboxError
from gpusandbox.hpc import pod


def test_a_directory_of_another_user_is_refused_with_a_usable_hint(tmp_path):
    taken = tmp_path / "gpusandbox-taken"
    taken.mkdir(mode=0o700)
    os.chown(taken, os.geteuid() + 12345, os.getegid())
    with pytest.raises(SandboxError) as e:
        pod._owned_dir(str(taken))
    text = str(e.value) + " " + str(getattr(e.value, "hint", ""))
    assert "XDG_RUNTIME_DIR" in text, text


def test_own_directory_open_to_others_is_refused_with_remove_hint(tmp_path):
    mine = tmp_path / "gpusandbox-mine"
    mine.mkdir(mode=0o777)
    os.chmod(mine, 0o777)
    with pytest.raises(SandboxError) as e:
        pod._owned_dir(str(mine))
    text = str(e.value) + " " + str(getattr(e.value, "hint", ""))
    assert f"remove {mine}" in text, text
    assert pod._owned_dir(str(tmp_path / "fresh")) == str(tmp_path / "fresh")
    # an older mode nobody else could write to is repaired
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    assert pod._owned_dir(str(old)) == str(old) and old.stat().st_mode & 0o777 == 0o700
