"""A site store (a store its owner opened to other users) as another user
on the node meets it: the published trees give nobody but their publisher
write access, whatever owners and modes the image has, and a tree an older
gpusandbox published there is refused until its owner publishes it again.

The image has a file owned by the attacker's uid, a 0777 file, a 1777
directory of its own and a 1777 /var/tmp (every Debian image has one).  The
store is a nosuid tmpfs in a private mount namespace that a sleeping
process holds; every step (root's pull, the attacker, the victims' runs)
enters it with nsenter, so nothing is mounted in the host's namespace."""
import io
import json
import os
import subprocess
import tarfile

import pytest

from tests.unit import image_fixtures as fx

from . import nsrun
from .crossuser import as_user

NAME = "gsbx/site:1"
WANT = "original\nopen-original\n/app/drop:\n\n/var/tmp:\n1777\n1777\n"
SHOW = "/app/run.sh; /app/open.sh; ls -A /app/drop /var/tmp; stat -c %a /app/drop /var/tmp"

# As the attacker: every directory of the store it can create a file in,
# every file it can open for writing (and appends a line to), everything
# it owns (it could chmod those).  os.walk skips what it cannot read.
ATTACK = r"""
import json, os, stat, sys
me, found = os.getuid(), []
for d, _dirs, files in os.walk(sys.argv[1]):
    for p in [d] + [os.path.join(d, n) for n in files]:
        st = os.lstat(p)
        if st.st_uid == me:
            found.append("owns " + p)
        try:
            if stat.S_ISDIR(st.st_mode):
                os.close(os.open(p + "/.planted", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                found.append("creates in " + p)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(p, os.O_WRONLY | os.O_APPEND)
                os.write(fd, b"echo pwned\n")
                os.close(fd)
                found.append("writes " + p)
        except OSError:
            pass
print(json.dumps(found))
"""


def _tar(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, uid, mode, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.uid, ti.gid, ti.mode = 1700000000, uid, uid, mode
            if data is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def archive(workdir_base, attack_user):
    """A docker-archive of a small rootfs and an app layer whose owners and
    modes would let another user in."""
    d = workdir_base / "site-image"
    root = d / "rootfs"
    subprocess.run([str(fx_repo() / "scripts" / "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(os.listdir(root)):
            tf.add(os.path.join(root, name), arcname=name)
    atk = attack_user.pw_uid
    app = _tar([("app", atk, 0o755, None),
                ("app/run.sh", atk, 0o755, b"#!/bin/sh\necho original\n"),
                ("app/open.sh", 0, 0o777, b"#!/bin/sh\necho open-original\n"),
                ("app/drop", 0, 0o1777, None),
                ("var", 0, 0o755, None),
                ("var/tmp", 0, 0o1777, None)])
    path = str(d / "site.tar")
    fx.write_docker_archive(path, [([NAME], [buf.getvalue(), app], {"Cmd": ["/app/run.sh"]})])
    os.chmod(d, 0o755)
    os.chmod(path, 0o644)
    return path


def fx_repo():
    from pathlib import Path
    return Path(__file__).resolve().parents[2]


class Site:
    """The store directory, seen only inside the holder's mount namespace,
    and its publisher (None: root)."""

    def __init__(self, pid, path, cli, archive, publisher):
        self.pid, self.path, self.cli = pid, path, cli
        self.archive, self.publisher = archive, publisher
        self.owner = 0 if publisher is None else publisher.pw_uid

    def run(self, user, argv, env=None):
        pre = ["nsenter", "-t", str(self.pid), "-m", "--"]
        if user is not None:
            pre += ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                    "--clear-groups", "--"]
        return as_user(None, pre + list(argv), env=env, timeout=120)

    def gsbx(self, user, args, own_store):
        """gpusandbox as `user` (None: root), the site store searched after
        `own_store` (which need not exist)."""
        return self.run(user, [self.cli] + list(args),
                        env={"GPUSANDBOX_STORE": str(own_store),
                             "GPUSANDBOX_SITE_STORE": str(self.path)})

    def publish(self):
        r = self.run(self.publisher, [self.cli, "pull", "-q", "--store", str(self.path),
                                      f"docker-archive:{self.archive}"])
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def attack(self, attack_user):
        r = self.run(attack_user, ["/usr/bin/python3", "-c", ATTACK, str(self.path)])
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture(params=["root", "user"])
def site(request, cli, archive, test_user):
    """A site store on a nosuid tmpfs, published by root or by the test
    user (an unprivileged account that keeps the site's images)."""
    publisher = None if request.param == "root" else test_user
    d = nsrun.scratch_dir("site")
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
         f"mount -t tmpfs -o nosuid,nodev,mode=0755,size=256m gsbx-test-site {d}\n"
         f"chown {0 if publisher is None else publisher.pw_uid} {d}\n"
         "echo ready\nexec sleep 900"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ready\n"
        yield Site(holder.pid, d, cli, archive, publisher)
    finally:
        holder.kill()
        holder.wait()
        d.rmdir()


def _victims(test_user, shared_tmp):
    own = shared_tmp / "own"          # the victims' own stores: never made
    return [(None, own / "root"), (test_user, own / "user")]


def test_published_tree_gives_other_users_no_write_access(site, attack_user, test_user,
                                                          shared_tmp):
    site.publish()
    # The attacker's uid owns /app and /app/run.sh in the image; /app/open.sh
    # is 0777, /app/drop and /var/tmp 1777.
    assert site.attack(attack_user) == []
    for user, own in _victims(test_user, shared_tmp):
        r = site.gsbx(user, ["run", NAME, "sh", "-c", SHOW], own)
        assert (r.returncode, r.stdout) == (0, WANT), r.stderr
    # In the sandbox the 1777 directories stay writable by a command that
    # is not root (in its own overlay: --writable-tmpfs), and as root the
    # directories keep the image's owners (when root published them).
    probe = "touch /var/tmp/x /app/drop/y && stat -c %u /var/tmp/x /app"
    r = site.gsbx(None, ["run", "--writable-tmpfs", "--user",
                         f"{test_user.pw_uid}:{test_user.pw_gid}", NAME, "sh", "-c", probe],
                  shared_tmp / "own")
    want = [str(test_user.pw_uid), str(attack_user.pw_uid)]
    n = 2 if site.publisher is None else 1      # a user's publish kept no image owner
    assert (r.returncode, r.stdout.splitlines()[:n]) == (0, want[:n]), r.stderr
    r = site.gsbx(test_user, ["run", "--writable-tmpfs", NAME, "sh", "-c", probe],
                  shared_tmp / "own")
    assert (r.returncode, r.stdout.splitlines()[:1]) == (0, [str(test_user.pw_uid)]), r.stderr


def test_tree_of_an_older_version_is_refused_until_published_again(site, attack_user,
                                                                   test_user, shared_tmp):
    """A store filled while private (as an older gpusandbox filled a shared
    one: the image's owners and modes), then opened to others."""
    site.run(site.publisher, ["chmod", "700", str(site.path)])
    dig = site.publish()
    site.run(site.publisher, ["chmod", "-R", "a+rX", str(site.path)])
    for user, own in _victims(test_user, shared_tmp):
        r = site.gsbx(user, ["run", NAME, "true"], own)
        assert r.returncode == 125, (r.stdout, r.stderr)
        assert r.stderr.splitlines() == [
            f"gpusandbox: error: image {dig[:19]} in the shared store {site.path} has no "
            "seal: an older gpusandbox published it with the image's own owners and modes, "
            "so other users may have changed its files",
            f"hint: its owner (uid {site.owner}) publishes it again: gpusandbox pull "
            f"--store {site.path} REF, which rebuilds it"]
    # The owner's pull rebuilds it (layers and tree) from the store's
    # verified blobs.
    assert site.publish() == dig
    assert site.attack(attack_user) == []
    for user, own in _victims(test_user, shared_tmp):
        r = site.gsbx(user, ["run", NAME, "sh", "-c", SHOW], own)
        assert (r.returncode, r.stdout) == (0, WANT), r.stderr


def test_squashfs_from_a_site_store_has_the_image_directories(site, test_user, shared_tmp):
    """`pull -o` from the site store: the file holds the directories the
    seal changed as the image had them, and runs as the store image does."""
    out = shared_tmp / "out"
    out.mkdir()
    os.chown(out, site.owner, -1)
    sqsh = out / "site.sqsh"
    r = site.run(site.publisher, [site.cli, "pull", "-q", "--store", str(site.path),
                                  "-o", str(sqsh), f"docker-archive:{site.archive}"])
    assert r.returncode == 0, r.stderr
    for user, own in _victims(test_user, shared_tmp):
        r = site.gsbx(user, ["run", str(sqsh), "sh", "-c", SHOW], own)
        assert (r.returncode, r.stdout) == (0, WANT), r.stderr
