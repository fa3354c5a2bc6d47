"""The cross-user harness itself: the two accounts are distinct, the
attacker cannot read a victim's canary, and a change to a canary is seen."""
import os

import pytest

from .crossuser import Canaries, as_user


def test_canaries_catch_a_write_and_a_leak(cli, test_user, attack_user, shared_tmp):
    assert test_user.pw_uid != attack_user.pw_uid and attack_user.pw_uid != 0
    c = Canaries.plant(str(shared_tmp), [test_user, attack_user])
    try:
        res = as_user(attack_user, ["cat", os.path.join(c.dirs[test_user.pw_name], "secret")])
        assert res.returncode != 0
        c.check(res.stdout)
        with pytest.raises(AssertionError):
            c.check(f"root:{c.secret}")
        with open(os.path.join(c.dirs["root"], "planted"), "w"):
            pass
        with pytest.raises(AssertionError):
            c.check()
    finally:
        c.remove()
