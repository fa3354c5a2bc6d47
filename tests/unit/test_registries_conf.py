"""registries.conf resolution (gpusandbox/image/registries.py) and the
credential helper protocol (image/credhelper.py, image/auth.py) on real
files and stand-in helper scripts."""
import json
import os

import pytest

from gpusandbox.image import ImageError, auth, credhelper, parse_ref
from gpusandbox.image import registries as R


def _conf(tmp_path, text, dropins=(), user=None, user_dropins=()):
    sysf = tmp_path / "etc/registries.conf"
    sysd = tmp_path / "etc/registries.conf.d"
    sysd.mkdir(parents=True, exist_ok=True)
    sysf.write_text(text)
    for i, t in enumerate(dropins):
        (sysd / f"{i:02d}.conf").write_text(t)
    home = tmp_path / "home"
    ud = home / ".config/containers/registries.conf.d"
    ud.mkdir(parents=True, exist_ok=True)
    if user is not None:
        (home / ".config/containers/registries.conf").write_text(user)
    for i, t in enumerate(user_dropins):
        (ud / f"{i:02d}.conf").write_text(t)
    return R.load({"HOME": str(home)}, system_file=str(sysf), system_dropins=str(sysd))


def _names(conf, ref):
    return [(c.canonical(), c.role.split(" (")[0]) for c in R.resolve(parse_ref(ref), conf)]


MIRRORED = '''
[[registry]]
prefix = "docker.io/library"
location = "hub.site/library"
mirror-by-digest-only = false
[[registry.mirror]]
location = "cache1.site/hub"
[[registry.mirror]]
location = "cache2.site/hub"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "cache3.site/hub"
pull-from-mirror = "tag-only"
'''
DIG = "sha256:" + "a" * 64


def test_mirrors_in_order_primary_last_and_pull_from_mirror(tmp_path):
    c = _conf(tmp_path, MIRRORED)
    assert _names(c, "docker://ubuntu:22.04") == [
        ("cache1.site/hub/ubuntu:22.04", "mirror cache1.site/hub"),
        ("cache3.site/hub/ubuntu:22.04", "mirror cache3.site/hub"),
        ("hub.site/library/ubuntu:22.04", "primary")]
    assert [n for n, _ in _names(c, f"docker://ubuntu@{DIG}")] == [
        f"cache1.site/hub/ubuntu@{DIG}", f"cache2.site/hub/ubuntu@{DIG}",
        f"hub.site/library/ubuntu@{DIG}"]
    # not under the prefix: as written
    assert _names(c, "docker://docker.io/nvidia/cuda:12") == [
        ("docker.io/nvidia/cuda:12", "primary")]


def test_mirror_by_digest_only_longest_prefix_and_wildcard(tmp_path):
    c = _conf(tmp_path, '''
[[registry]]
location = "quay.io"
mirror-by-digest-only = true
[[registry.mirror]]
location = "m.site/quay"
[[registry]]
prefix = "quay.io/special"
location = "special.site/x"
[[registry]]
prefix = "*.corp.example"
insecure = true
''')
    assert _names(c, "docker://quay.io/a/b:1") == [("quay.io/a/b:1", "primary")]
    assert [n for n, _ in _names(c, f"docker://quay.io/a/b@{DIG}")] == [
        f"m.site/quay/a/b@{DIG}", f"quay.io/a/b@{DIG}"]
    assert _names(c, "docker://quay.io/special/img:1") == [("special.site/x/img:1", "primary")]
    # quay.io/specialist is not under quay.io/special
    assert _names(c, "docker://quay.io/specialist:1")[-1] == ("quay.io/specialist:1", "primary")
    cand = R.resolve(parse_ref("docker://reg.corp.example/a:1"), c)
    assert [(x.canonical(), x.insecure) for x in cand] == [("reg.corp.example/a:1", True)]


def test_search_registries_aliases_and_docker_rule(tmp_path):
    c = _conf(tmp_path, 'unqualified-search-registries = ["registry.site", "docker.io"]\n'
              '[aliases]\n"cuda" = "nvcr.io/nvidia/cuda"\n')
    assert _names(c, "docker://ubuntu:22.04") == [
        ("registry.site/ubuntu:22.04", "unqualified-search-registries"),
        ("docker.io/library/ubuntu:22.04", "unqualified-search-registries")]
    assert _names(c, "docker://cuda:12") == [("nvcr.io/nvidia/cuda:12", "primary")]
    assert _names(c, "docker://docker.io/ubuntu:1") == [("docker.io/library/ubuntu:1", "primary")]
    # no search list: docker's rule, and aliases are not read
    c = _conf(tmp_path, '[aliases]\n"ubuntu" = "elsewhere.site/ubuntu"\n')
    assert _names(c, "docker://ubuntu:22.04") == [("docker.io/library/ubuntu:22.04", "primary")]


def test_blocked_one_line(tmp_path):
    c = _conf(tmp_path, '[[registry]]\nprefix = "docker.io"\nblocked = true\n')
    with pytest.raises(ImageError) as e:
        R.resolve(parse_ref("docker://ubuntu"), c)
    assert e.value.line().startswith("cannot pull docker.io/library/ubuntu:latest: the "
                                     "registry is blocked: [[registry]] prefix 'docker.io' in ")


def test_files_merge_and_user_file_replaces_system(tmp_path):
    c = _conf(tmp_path, 'unqualified-search-registries = ["a.site"]\n'
              '[[registry]]\nlocation = "a.site"\ninsecure = true\n',
              dropins=['unqualified-search-registries = ["b.site"]\n',
                       '[[registry]]\nlocation = "a.site"\nblocked = true\n'])
    assert c.search == ["b.site"]
    assert c.registries["a.site"].blocked and not c.registries["a.site"].insecure
    c = _conf(tmp_path, 'unqualified-search-registries = ["a.site"]\n',
              user='unqualified-search-registries = ["u.site"]\n',
              user_dropins=['[[registry]]\nlocation = "x.site"\n'])
    assert c.search == ["u.site"] and list(c.registries) == ["x.site"]


def test_bad_values_refused(tmp_path):
    for text, words in (('unqualified-search-registries = "a"\n', "expected a list"),
                        ('[[registry]]\nlocation = "a"\nmirror-by-digest-only = true\n'
                         '[[registry.mirror]]\nlocation = "m"\npull-from-mirror = "tag-only"\n',
                         "not combinable"),
                        ('[[registry]]\ninsecure = true\n', "needs a prefix or a location"),
                        ('[[registry]]\nlocation = "a"\nblocked = "yes"\n', "expected a bool")):
        with pytest.raises(ImageError) as e:
            _conf(tmp_path, text)
        assert words in e.value.line(), e.value.line()


def test_system_file_others_may_write_is_skipped(tmp_path):
    sysf = tmp_path / "registries.conf"
    sysf.write_text('unqualified-search-registries = ["evil.site"]\n')
    os.chmod(sysf, 0o666)
    c = R.load({}, system_file=str(sysf), system_dropins=str(tmp_path / "none"))
    assert c.search == [] and "mode 0666 lets others write" in c.warnings[0]


# -- credential helpers ---------------------------------------------------------

HELPER = """#!/bin/sh
read -r server
case "$0" in
*-ok) printf '{"ServerURL":"%s","Username":"u","Secret":"s3"}' "$server" ;;
*-env) env | sort > "$(dirname "$0")/env.out"
       printf '{"ServerURL":"%s","Username":"u","Secret":"s3"}' "$server" ;;
*-echo) printf '{"ServerURL":"%s","Username":"%s","Secret":"x"}' "$server" "$server" ;;
*-junk) echo "not json" ;;
*-token) printf '{"ServerURL":"%s","Username":"<token>","Secret":"x"}' "$server" ;;
*-none) echo "credentials not found in native keychain"; exit 1 ;;
*-hang) exec sleep 30 ;;
esac
"""


@pytest.fixture
def helpers(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    for n in ("ok", "env", "echo", "junk", "token", "none", "hang"):
        p = d / f"docker-credential-{n}"
        p.write_text(HELPER)
        p.chmod(0o755)
    return d


def _find(tmp_path, helpers, doc, host="reg.site:5000", extra=None, mode=0o600):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(doc))
    os.chmod(f, mode)
    env = {"PATH": f"{helpers}:/usr/bin:/bin", "HOME": str(tmp_path)}
    env.update(extra or {})
    return auth.find_credentials(host, "a/b", str(f), env)


def test_helper_protocol_and_precedence(tmp_path, helpers):
    assert _find(tmp_path, helpers, {"credsStore": "ok"}) == ("u", "s3")
    # credHelpers[host] before credsStore before auths; the server on stdin
    doc = {"credHelpers": {"reg.site:5000": "echo"}, "credsStore": "junk",
           "auths": {"reg.site:5000": {"auth": "eDp5"}}}
    assert _find(tmp_path, helpers, doc) == ("reg.site:5000", "x")
    assert _find(tmp_path, helpers, {"credHelpers": {"docker.io": "echo"}}, "docker.io") == \
        ("https://index.docker.io/v1/", "x")
    # "not found" is no credentials: the inline entry is used
    assert _find(tmp_path, helpers, {"credsStore": "none",
                                     "auths": {"reg.site:5000": {"auth": "eDp5"}}}) == ("x", "y")
    assert _find(tmp_path, helpers, {"credsStore": "none"}) is None


def test_helper_environment_is_small(tmp_path, helpers):
    _find(tmp_path, helpers, {"credsStore": "env"},
          extra={"MY_API_TOKEN": "hush", "AWS_SECRET_ACCESS_KEY": "aws", "LANG": "C"})
    env = (helpers / "env.out").read_text()
    assert "hush" not in env and "aws" not in env and "LANG=C" in env
    (helpers / "docker-credential-ecr-login").write_text(HELPER.replace("*-env)", "*-login)"))
    (helpers / "docker-credential-ecr-login").chmod(0o755)
    _find(tmp_path, helpers, {"credsStore": "ecr-login"},
          extra={"MY_API_TOKEN": "hush", "AWS_SECRET_ACCESS_KEY": "aws"})
    env = (helpers / "env.out").read_text()
    assert "AWS_SECRET_ACCESS_KEY=aws" in env and "hush" not in env


@pytest.mark.parametrize("name,words", [
    ("junk", "gave no valid credentials"), ("token", "identity token"),
    ("hang", "did not answer: no answer within 1 s"), ("gone", "not found"),
    ("../ok", "not a helper name")])
def test_helper_failures(tmp_path, helpers, name, words):
    with pytest.raises(ImageError) as e:
        _find(tmp_path, helpers, {"credsStore": name},
              extra={credhelper.TIMEOUT_VAR: "1"})
    assert words in e.value.line()
    assert "s3" not in e.value.line()


def test_helper_named_by_a_file_others_may_write_is_not_run(tmp_path, helpers):
    with pytest.raises(ImageError) as e:
        _find(tmp_path, helpers, {"credsStore": "env"}, mode=0o666)
    assert "names a program and the file is not safe" in e.value.line()
    assert not (helpers / "env.out").exists()
