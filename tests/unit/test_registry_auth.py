"""WWW-Authenticate parsing and the auth-file lookup of the registry client."""
import base64
import json
import os

import pytest

from gpusandbox.image import auth
from gpusandbox.image.digest import ImageError


def _b64(s):
    return base64.b64encode(s.encode()).decode()


def test_bearer_challenge():
    h = ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
         'scope="repository:library/ubuntu:pull"')
    assert auth.parse_challenges(h) == [("bearer", {
        "realm": "https://auth.docker.io/token", "service": "registry.docker.io",
        "scope": "repository:library/ubuntu:pull"})]


def test_challenge_quoting_and_several():
    h = r'Basic realm="a \"q\", b", Bearer realm=https://x/t, scope="s1 s2"'
    assert auth.parse_challenges(h) == [
        ("basic", {"realm": 'a "q", b'}),
        ("bearer", {"realm": "https://x/t", "scope": "s1 s2"})]


@pytest.mark.parametrize("h", ["", "   ", '"', "Bearer realm=\"unterminated", "=x", "Bearer ,,,"])
def test_challenge_garbage_never_raises(h):
    assert isinstance(auth.parse_challenges(h), list)


def _env(tmp_path, **kw):
    env = {"HOME": str(tmp_path / "home")}
    env.update(kw)
    return env


def _write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_lookup_order(tmp_path):
    home = tmp_path / "home"
    _write(home / ".docker" / "config.json", {"auths": {"r.io": {"auth": _b64("docker:1")}}})
    env = _env(tmp_path)
    assert auth.find_credentials("r.io", "a/b", env=env) == ("docker", "1")
    _write(home / ".config" / "containers" / "auth.json",
           {"auths": {"r.io": {"auth": _b64("cont:2")}}})
    assert auth.find_credentials("r.io", "a/b", env=env) == ("cont", "2")
    run = tmp_path / "run"
    _write(run / "containers" / "auth.json", {"auths": {"r.io": {"auth": _b64("xdg:3")}}})
    env["XDG_RUNTIME_DIR"] = str(run)
    assert auth.find_credentials("r.io", "a/b", env=env) == ("xdg", "3")
    # a runtime directory others can write (another user's, squatted in /tmp)
    # is not the caller's: its auth file is not read
    os.chmod(run, 0o777)
    assert auth.find_credentials("r.io", "a/b", env=env) == ("cont", "2")
    os.chmod(run, 0o700)
    env["REGISTRY_AUTH_FILE"] = _write(tmp_path / "raf.json",
                                       {"auths": {"r.io": {"auth": _b64("raf:4")}}})
    assert auth.find_credentials("r.io", "a/b", env=env) == ("raf", "4")
    explicit = _write(tmp_path / "x.json", {"auths": {"r.io": {"auth": _b64("cli:5:x")}}})
    assert auth.find_credentials("r.io", "a/b", authfile=explicit, env=env) == ("cli", "5:x")
    # a host not in a file falls through to the next file
    assert auth.find_credentials("other.io", "a", env=dict(env, REGISTRY_AUTH_FILE="")) is None


def test_key_forms(tmp_path):
    f = _write(tmp_path / "a.json", {"auths": {
        "https://index.docker.io/v1/": {"auth": _b64("hub:1")},
        "r.io:5000": {"auth": _b64("port:2")},
        "r.io:5000/team": {"auth": _b64("team:3")},
        "r.io:5000/team/deep": {"auth": _b64("deep:4")},
    }})
    assert auth.find_credentials("docker.io", "library/ubuntu", authfile=f) == ("hub", "1")
    assert auth.find_credentials("r.io:5000", "other/x", authfile=f) == ("port", "2")
    assert auth.find_credentials("r.io:5000", "team/x", authfile=f) == ("team", "3")
    assert auth.find_credentials("r.io:5000", "team/deep/x", authfile=f) == ("deep", "4")
    assert auth.find_credentials("r.io:5000", "teamx/y", authfile=f) == ("port", "2")
    assert auth.find_credentials("r.io", "team/x", authfile=f) is None


@pytest.mark.parametrize("doc,words", [
    ("{not json", "not valid JSON"),
    ("[]", "not a JSON object"),
    ({"auths": []}, "auths is not an object"),
    ({"auths": {"r.io": {"auth": "!!!"}}}, "base64"),
    ({"auths": {"r.io": {"auth": _b64("nocolon")}}}, "base64"),
    ({"auths": {"r.io": {"auth": 5}}}, "not a string"),
    ({"auths": {"r.io": "x"}}, "not an object"),
])
def test_bad_files_are_one_error(tmp_path, doc, words):
    f = _write(tmp_path / "a.json", doc)
    with pytest.raises(ImageError) as e:
        auth.find_credentials("r.io", "x", authfile=f)
    assert words in e.value.line() and f in e.value.line()


def test_size_bound_and_missing_explicit(tmp_path):
    big = _write(tmp_path / "big.json", " " * (auth.MAX_AUTHFILE + 1) + "{}")
    with pytest.raises(ImageError) as e:
        auth.find_credentials("r.io", "x", authfile=big)
    assert "larger than" in e.value.line()
    with pytest.raises(ImageError) as e:
        auth.find_credentials("r.io", "x", authfile=str(tmp_path / "absent.json"))
    assert "does not exist" in e.value.line() and "--authfile" in e.value.hint
    with pytest.raises(ImageError):
        auth.find_credentials("r.io", "x", authfile="/dev/zero")


def test_credential_helpers_are_run_and_a_missing_one_is_one_line(tmp_path):
    # (tests/unit/test_registries_conf.py: the protocol with stand-in helpers)
    f = _write(tmp_path / "a.json", {"credsStore": "desktop", "credHelpers": {"r.io": "x"},
                                     "auths": {"r.io": {}}})
    os.chmod(f, 0o600)
    with pytest.raises(ImageError) as e:
        auth.find_credentials("r.io", "x", authfile=f, env={"PATH": str(tmp_path)})
    assert e.value.line() == (f"credential helper docker-credential-x not found "
                              f"(credHelpers['r.io'] in {f}): it is not on PATH")
