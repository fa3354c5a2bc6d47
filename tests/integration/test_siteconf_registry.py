"""Site configuration end to end (docs/config.md), root and rootless, with
real files: each command runs in a private mount namespace whose /etc is an
overlay of the host's with this test's site files on top (the host's /etc
is never written).  A mirror in front of the test registry (a second
docker-registry that lacks a tag), unqualified-search-registries, a
blocked registry, [[registry]] location rewriting, stand-in credential
helpers against the htpasswd registry, and `run` honouring the site's
mounts, environment, locks and forbidden binds."""
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from .registry_fixture import Registry, images, registry, registry_auth  # noqa: F401
from .test_images_local import image_files  # noqa: F401
from .test_oci_runtime_podman import podman  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def mirror(tmp_path_factory, registry, image_files):
    """A second registry in front of `registry`: it holds e2e/img:m1 (also
    in the primary) and mirror/only:v1, and lacks e2e/img:v1."""
    reg = Registry(tmp_path_factory.mktemp("mirror"))
    try:
        lay = image_files["layout"]
        registry.push(lay, "v1", "e2e/img")
        registry.push(lay, "v1", "e2e/img", dest_tag="m1")
        registry.push(lay, "v1", "ubuntu", dest_tag="22.04")
        reg.pushed = {"m1": reg.push(lay, "v1", "e2e/img", dest_tag="m1"),
                      "only": reg.push(lay, "v1", "mirror/only")}
        yield reg
    finally:
        reg.stop()


class Etc:
    """Files over the host's /etc for one test (an overlay's upper layer)."""

    def __init__(self, top):
        self.top = Path(top)
        self.upper = self.top / "upper"
        self.work = self.top / "work"
        self.upper.mkdir(parents=True)
        self.work.mkdir()
        os.chmod(self.top, 0o755)

    def write(self, rel, text, mode=0o644):
        p = self.upper / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for d in [p.parent, *p.parent.parents]:
            if d == self.upper:
                break
            os.chmod(d, 0o755)
        p.write_text(text)
        os.chmod(p, mode)
        return Path("/etc") / rel

    def hide(self, rel):
        """A whiteout: the host's /etc/REL is absent in the overlay."""
        p = self.upper / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(0, 0))

    pre = ""            # more sh to run in the namespace first

    def argv(self, runner, args):
        cmd = [runner.cli] + list(args)
        if runner.mode == "rootless":
            cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
                   "--clear-groups", "--"] + cmd
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc '
                f'&& {self.pre or "true"} && shift 2 && exec "$@"', "sh", str(self.upper), str(self.work)] + cmd


@pytest.fixture
def etc(shared_tmp):
    return Etc(shared_tmp / "etc")


@pytest.fixture
def home(runner, shared_tmp):
    h = shared_tmp / "home"
    h.mkdir()
    os.chown(h, runner.uid, runner.gid)
    os.chmod(h, 0o700)
    return h


def gsbx(runner, etc, home, args, env=None, timeout=120):
    e = runner.env({"GPUSANDBOX_STORE": str(home / "store"), "HOME": str(home)})
    e.update(env or {})
    return subprocess.run(etc.argv(runner, args), capture_output=True, text=True,
                          timeout=timeout, cwd="/", env=e)


def _user_file(runner, home, rel, text, mode=0o600):
    p = home / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    for d in [p.parent, *p.parent.parents]:
        if d == home:
            break
        os.chown(d, runner.uid, runner.gid)
    p.write_text(text)
    os.chown(p, runner.uid, runner.gid)
    os.chmod(p, mode)
    return p


def _mirror_conf(etc, registry, mirror, extra=""):
    etc.write("containers/registries.conf", f'''
[[registry]]
prefix = "registry.example.site"
location = "{registry.host}"
insecure = true
[[registry.mirror]]
location = "{mirror.host}"
insecure = true
{extra}''')


def test_mirror_serves_then_falls_back_to_the_primary(runner, etc, home, registry, mirror):
    _mirror_conf(etc, registry, mirror)
    r = gsbx(runner, etc, home, ["pull", "-q", "docker://registry.example.site/e2e/img:m1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == mirror.pushed["m1"]
    assert f"gpusandbox: pulled {mirror.host}/e2e/img:m1 from mirror {mirror.host} " \
           "(/etc/containers/registries.conf)" in r.stderr
    # the mirror lacks v1: the primary (the rewritten location) serves it
    r = gsbx(runner, etc, home, ["pull", "-q", "docker://registry.example.site/e2e/img:v1"])
    assert r.returncode == 0, r.stderr
    assert f"pulled {registry.host}/e2e/img:v1 from primary" in r.stderr
    # only the mirror has this one
    r = gsbx(runner, etc, home, ["pull", "-q", "docker://registry.example.site/mirror/only:v1"])
    assert (r.returncode, r.stdout.strip()) == (0, mirror.pushed["only"]), r.stderr
    r = gsbx(runner, etc, home, ["images", "--json"])
    assert sorted(x["reference"] for x in json.loads(r.stdout)) == [
        "registry.example.site/e2e/img:m1", "registry.example.site/e2e/img:v1",
        "registry.example.site/mirror/only:v1"]
    # neither has it: the primary's answer, naming both tried
    r = gsbx(runner, etc, home, ["pull", "-q", "docker://registry.example.site/e2e/img:nope"])
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert "no such tag or digest" in r.stderr and f"tried {mirror.host}/e2e/img, " \
        f"{registry.host}/e2e/img" in r.stderr


def test_run_short_name_through_search_registries(runner, etc, home, registry, mirror):
    # Debian's shortnames.conf aliases ubuntu to docker.io, and an alias
    # beats the search (as podman): this site has none.
    etc.hide("containers/registries.conf.d/shortnames.conf")
    etc.write("containers/registries.conf",
              f'unqualified-search-registries = ["{registry.host}"]\n'
              f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    r = gsbx(runner, etc, home, ["run", "docker://ubuntu:22.04", "cat hello"])
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    assert f"pulled {registry.host}/ubuntu:22.04 from unqualified-search-registries" in r.stderr
    r = gsbx(runner, etc, home, ["images", "--json"])
    assert sorted(x["reference"] for x in json.loads(r.stdout)) == [
        f"{registry.host}/ubuntu:22.04", "docker.io/library/ubuntu:22.04"]


def test_alias_beats_the_search(runner, etc, home, registry, mirror):
    etc.write("containers/registries.conf.d/zz-site.conf",
              f'unqualified-search-registries = ["{mirror.host}"]\n'
              f'[aliases]\n"myimg" = "{registry.host}/e2e/img"\n')
    r = gsbx(runner, etc, home, ["pull", "-q", "docker://myimg:v1"])
    assert r.returncode == 0, r.stderr


def test_blocked_registry_one_line(runner, etc, home, registry, mirror):
    etc.write("containers/registries.conf",
              f'[[registry]]\nlocation = "{registry.host}"\nblocked = true\n')
    r = gsbx(runner, etc, home, ["pull", "-q", f"docker://{registry.host}/e2e/img:v1"])
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert r.stderr.startswith(f"gpusandbox: error: cannot pull {registry.host}/e2e/img:v1: "
                               "the registry is blocked")
    assert not (home / "store" / "refs").exists() or not os.listdir(home / "store" / "refs")


HELPER = """#!/bin/sh
read -r server
env > {envlog}
case "$0" in
*-gsbxok) [ "$server" = "{host}" ] || {{ echo "unknown server $server"; exit 1; }}
          printf '{{"ServerURL":"%s","Username":"{user}","Secret":"{pw}"}}' "$server" ;;
*-gsbxwrong) printf '{{"ServerURL":"%s","Username":"{user}","Secret":"not-the-pw"}}' "$server" ;;
*-gsbxnone) echo "credentials not found in native keychain"; exit 1 ;;
*-gsbxfail) echo "keyring is locked" >&2; exit 3 ;;
*-gsbxhang) sleep 60 ;;
esac
"""


@pytest.fixture
def helpers(shared_tmp, registry_auth, images):
    d = shared_tmp / "helpers"
    d.mkdir()
    os.chmod(d, 0o755)
    user, pw = registry_auth.creds
    text = HELPER.format(envlog=shared_tmp / "helper.env", host=registry_auth.host, user=user,
                         pw=pw)
    for name in ("gsbxok", "gsbxwrong", "gsbxnone", "gsbxfail", "gsbxhang"):
        p = d / f"docker-credential-{name}"
        p.write_text(text)
        os.chmod(p, 0o755)
    log = shared_tmp / "helper.env"
    log.touch()
    os.chmod(log, 0o666)
    return d


@pytest.fixture(scope="session")
def pushed_auth(registry_auth, image_files):
    return registry_auth.push(image_files["layout"], "v1", "e2e/img", creds=registry_auth.creds)


@pytest.mark.parametrize("helper,key", [("gsbxok", "credHelpers"), ("gsbxok", "credsStore")])
def test_credential_helper_answers(runner, etc, home, helpers, registry_auth, pushed_auth,
                                   shared_tmp, helper, key):
    doc = {"credHelpers": {registry_auth.host: helper}} if key == "credHelpers" \
        else {"credsStore": helper}
    _user_file(runner, home, ".docker/config.json", json.dumps(doc))
    env = {"PATH": f"{helpers}:/usr/local/bin:/usr/bin:/bin", "MY_API_TOKEN": "hush-secret"}
    r = gsbx(runner, etc, home, ["run", f"docker://{registry_auth.host}/e2e/img:v1",
                                 "cat hello"], env=env)
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    seen = (shared_tmp / "helper.env").read_text()
    assert "hush-secret" not in seen and "MY_API_TOKEN" not in seen
    assert registry_auth.creds[1] not in r.stderr


@pytest.mark.parametrize("helper,words", [
    ("gsbxwrong", "the registry refused the credentials"),
    ("gsbxnone", "authentication required"),
    ("gsbxfail", "failed for"),
    ("gsbxhang", "did not answer: no answer within 2 s"),
    ("gsbxmissing", "credential helper docker-credential-gsbxmissing not found"),
])
def test_credential_helper_failures_one_line(runner, etc, home, helpers, registry_auth,
                                             pushed_auth, helper, words):
    _user_file(runner, home, ".docker/config.json",
               json.dumps({"credHelpers": {registry_auth.host: helper}}))
    env = {"PATH": f"{helpers}:/usr/local/bin:/usr/bin:/bin",
           "GPUSANDBOX_CREDENTIAL_HELPER_TIMEOUT": "2"}
    r = gsbx(runner, etc, home, ["pull", "-q", f"docker://{registry_auth.host}/e2e/img:v1"],
             env=env)
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert r.stderr.startswith("gpusandbox: error: ") and words in r.stderr, r.stderr
    assert registry_auth.creds[1] not in r.stderr
    if helper == "gsbxfail":
        assert "exit 3: keyring is locked" in r.stderr


def test_credential_helper_from_a_file_others_can_write_is_refused(
        runner, etc, home, helpers, registry_auth, pushed_auth, shared_tmp):
    (shared_tmp / "helper.env").write_text("")
    _user_file(runner, home, ".docker/config.json",
               json.dumps({"credHelpers": {registry_auth.host: "gsbxok"}}), mode=0o666)
    env = {"PATH": f"{helpers}:/usr/local/bin:/usr/bin:/bin"}
    r = gsbx(runner, etc, home, ["pull", "-q", f"docker://{registry_auth.host}/e2e/img:v1"],
             env=env)
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert "names a program and the file is not safe: mode 0666" in r.stderr
    assert (shared_tmp / "helper.env").read_text() == ""


# -- run with the site's defaults -------------------------------------------------

def test_run_honours_site_mounts_env_lock_and_forbid(runner, etc, home, rootfs, shared_tmp):
    data = shared_tmp / "sitedata"
    data.mkdir()
    (data / "license").write_text("site license\n")
    os.chmod(data, 0o755)
    os.chmod(data / "license", 0o644)
    f = etc.write("gpusandbox/gpusandbox.conf", f'''
network = "none"
lock = ["network"]
forbid-binds = ["/etc/shadow", "{shared_tmp}/secret*"]
[env]
SITE_GREETING = "hello {{user}}"
[[mounts]]
source = "{data}"
destination = "/opt/site"
read-only = true
[[mounts]]
source = "/nonexistent/{{uid}}"
optional = true
''')
    _user_file(runner, home, ".config/gpusandbox/gpusandbox.conf", 'network = "host"\n')
    user = "root" if runner.mode == "root" else runner.user.pw_name
    r = gsbx(runner, etc, home, ["run", str(rootfs), "sh", "-c",
                                 "cat /opt/site/license; echo $SITE_GREETING; "
                                 "touch /opt/site/x 2>/dev/null || echo ro; grep -c : /proc/net/dev"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["site license", f"hello {user}", "ro"]
    assert r.stdout.split("\n")[3:] == ["1", ""]       # only lo: network none, locked
    assert r.stderr == (f"gpusandbox: warning: setting network is locked by the site ({f}): "
                        f"the value from {home}/.config/gpusandbox/gpusandbox.conf:1 is "
                        "ignored\n")
    r = gsbx(runner, etc, home, ["run", "--net", "host", str(rootfs), "true"])
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert f"error: --net host: the site locks network = none ({f})" in r.stderr
    os.unlink(home / ".config/gpusandbox/gpusandbox.conf")
    (shared_tmp / "secret-proj").mkdir()
    r = gsbx(runner, etc, home, ["run", "-v", f"{shared_tmp}/secret-proj:/p", str(rootfs),
                                 "true"])
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert f"error: bind of {shared_tmp}/secret-proj: forbidden by the site: matches " in r.stderr


def test_run_mount_home_default_and_not(runner, etc, home, rootfs):
    import pwd
    pw_home = pwd.getpwuid(runner.uid).pw_dir
    if runner.mode == "rootless":
        # the test user's passwd home, made in a tmpfs over /home of this namespace
        etc.pre = (f"mount -t tmpfs tmpfs {os.path.dirname(pw_home)} && mkdir -m 700 "
                   f"{pw_home} && chown {runner.uid}:{runner.gid} {pw_home}")
    etc.write("gpusandbox/gpusandbox.conf", "mount-home = true\n")
    probe = f"grep -c ' {pw_home} ' /proc/self/mountinfo"
    r = gsbx(runner, etc, home, ["run", str(rootfs), "sh", "-c", probe])
    assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
    r = gsbx(runner, etc, home, ["run", "--no-mount-home", str(rootfs), "sh", "-c", probe])
    assert r.stdout == "0\n", r.stderr
    etc.write("gpusandbox/gpusandbox.conf", "mount-home = false\n")
    r = gsbx(runner, etc, home, ["run", str(rootfs), "sh", "-c", probe])
    assert r.stdout == "0\n", r.stderr
    r = gsbx(runner, etc, home, ["run", "--mount-home", str(rootfs), "sh", "-c", probe])
    assert r.stdout == "1\n", r.stderr


def test_site_file_writable_by_others_is_ignored_with_a_warning(runner, etc, home, rootfs):
    f = etc.write("gpusandbox/gpusandbox.conf", 'forbid-binds = []\nnetwork = "none"\n', 0o666)
    r = gsbx(runner, etc, home, ["run", "--net", "host", str(rootfs), "true"])
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"gpusandbox: warning: configuration file {f} skipped: mode 0666 lets "
                        f"others write to it (chown root:root {f}; chmod go-w {f})\n")


def test_unknown_key_refused_with_file_and_line(runner, etc, home, rootfs):
    f = etc.write("gpusandbox/conf.d/50-x.conf", '\nmount-hmoe = true\n')
    r = gsbx(runner, etc, home, ["run", str(rootfs), "true"])
    assert r.returncode == 125 and r.stderr.count("\n") == 2, r.stderr
    assert r.stderr.startswith(f"gpusandbox: error: {f}:2: unknown key 'mount-hmoe'")
    assert "did you mean mount-home?" in r.stderr
    r = gsbx(runner, etc, home, ["config", "--show-origin"])
    assert r.returncode == 125


def test_config_command_names_origins(runner, etc, home):
    f = etc.write("gpusandbox/gpusandbox.conf", 'shm-size = "4g"\nlock = ["shm-size"]\n')
    r = gsbx(runner, etc, home, ["config", "--show-origin"], env={"GPUSANDBOX_NETWORK": "none"})
    assert r.returncode == 0, r.stderr
    lines = {ln.split(" = ")[0]: ln for ln in r.stdout.splitlines()}
    assert lines["shm-size"].endswith(f"# {f}:1 (locked by {f})")
    assert lines["network"].endswith("# GPUSANDBOX_NETWORK") and "= none" in lines["network"]
    assert lines["driver-root"].endswith("# default")


# -- site hooks ---------------------------------------------------------------------

HOOK = """#!/bin/sh
case "$1" in
rootfs) cat > "$GPUSANDBOX_ROOTFS/tmp/site-plan.json"
        echo "$GPUSANDBOX_HOOK_POINT $GPUSANDBOX_DOOR $(pwd -P | wc -c)" > ./tmp/site-hook
        env | sort > ./tmp/site-env
        [ "$(id -u)" = 0 ] && echo licensed > ./etc/site-license
        exit 0 ;;
exit) cat > {exit_log}; exit 0 ;;
esac
"""


def test_site_hook_adds_a_file_for_run_and_runs_at_exit(runner, etc, home, rootfs, shared_tmp):
    exit_log = shared_tmp / "exit.json"
    exit_log.touch()
    os.chmod(exit_log, 0o666)
    etc.write("gpusandbox/hooks.d/10-license", HOOK.format(exit_log=exit_log), 0o755)
    etc.write("gpusandbox/hooks.d/20-not-mine", "#!/bin/sh\nexit 1\n", 0o757)
    os.chmod(etc.upper / "gpusandbox/hooks.d", 0o755)
    r = gsbx(runner, etc, home, ["run", str(rootfs), "sh", "-c",
                                 "cat /tmp/site-hook /tmp/site-plan.json; echo; "
                                 "cat /etc/site-license 2>/dev/null || echo none; "
                                 "grep -c SECRET /tmp/site-env"],
             env={"SECRET_TOKEN": "x"})
    assert r.returncode == 1, r.stderr      # grep -c found nothing: the hook's env is clean
    out = r.stdout.split("\n")
    assert out[0].startswith("rootfs run ")
    plan = json.loads(out[1])
    assert (plan["point"], plan["door"], plan["image"], plan["argv"][0]) == \
        ("rootfs", "run", str(rootfs), "sh")
    assert out[2] == ("licensed" if runner.mode == "root" else "none")
    assert out[3] == "0"
    assert r.stderr == ("gpusandbox: warning: site hook /etc/gpusandbox/hooks.d/20-not-mine "
                        "skipped: mode 0757 lets others write to it\n")
    assert json.loads(exit_log.read_text())["status"] == 1


def test_failing_site_hook_one_line(runner, etc, home, rootfs):
    etc.write("gpusandbox/hooks.d/50-broken", "#!/bin/sh\n[ \"$1\" = rootfs ] && exit 3\n",
              0o755)
    os.chmod(etc.upper / "gpusandbox/hooks.d", 0o755)
    r = gsbx(runner, etc, home, ["run", str(rootfs), "echo", "never"])
    assert r.returncode == 125 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "site hook /etc/gpusandbox/hooks.d/50-broken failed: exit status 3" in r.stderr


@pytest.mark.skipif(not shutil.which("podman") or not shutil.which("conmon"),
                    reason="podman and conmon are not installed")
def test_site_hook_runs_for_podman_through_gpusandbox_oci(podman, etc, shared_tmp):
    from .test_oci_runtime_podman import IMAGE, RUN
    if podman.mode == "rootless":
        pytest.skip("rootless podman joins the namespaces of its pause process, made "
                    "before this test's /etc overlay existed")
    exit_log = shared_tmp / "exit.json"
    etc.write("gpusandbox/hooks.d/10-license", HOOK.format(exit_log=exit_log), 0o755)
    os.chmod(etc.upper / "gpusandbox/hooks.d", 0o755)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc '
            '&& shift 2 && exec "$@"', "sh", str(etc.upper), str(etc.work)] + \
        podman.argv(["run", "--rm", *RUN, IMAGE, "sh", "-c",
                     "cat /tmp/site-hook /etc/site-license"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0].startswith("rootfs oci ")
    assert r.stdout.split("\n")[1] == "licensed"
    # podman run --rm deleted the container: the runtime's delete ran the
    # exit point (podman's conmon reaped the status: null here).
    ended = json.loads(exit_log.read_text())
    assert (ended["point"], ended["door"], ended["status"]) == ("exit", "oci", None)
