"""`gpusandbox pull REF -o FILE.sqsh`: one squashfs file written from the
pulled image, atomically, that `gpusandbox run FILE.sqsh` runs; root and
rootless."""
import os
import subprocess

from .test_images_local import gsbx, image_files, store  # noqa: F401 (fixtures)


def _owners(path):
    """{path inside: "user/group"} as unsquashfs lists the file."""
    out = subprocess.run(["unsquashfs", "-lls", "-d", "", str(path)], capture_output=True,
                         text=True, check=True).stdout
    owners = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0][0] in "-dlcbps":
            owners[parts[5]] = parts[1]
    return owners


def test_pull_writes_one_squashfs_file_that_runs(runner, store, image_files):  # noqa: F811
    target = store.parent / "out.sqsh"
    ref = f"oci:{image_files['layout']}:v1"
    r = gsbx(runner, store, ["pull", "-q", "-o", str(target), ref])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == image_files["digest"]
    with open(target, "rb") as f:
        assert f.read(4) == b"hsqs"
    st = os.stat(target)
    assert st.st_uid == runner.uid and st.st_mode & 0o777 == 0o644
    # Only the file: the private directory it was written in is gone.
    assert sorted(os.listdir(store.parent)) == ["out.sqsh", "store"]
    # As the image has them as root; rootless the caller's tree says nothing
    # of the image, and the file gets root (what a rootless run maps to you).
    owners = _owners(target)
    assert owners["/etc/passwd"] == "root/root" and owners["/srv/app/hello"] == "root/root"
    # The image's Entrypoint is `/bin/sh -c` (the file carries its config):
    # the CMD is one shell command.
    r = gsbx(runner, store, ["run", str(target), "cat /srv/app/hello"])
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    # A second pull replaces the file by rename: a reader holding the old one
    # keeps reading it.
    with open(target, "rb") as old:
        r = gsbx(runner, store, ["pull", "-q", "-o", str(target), ref])
        assert r.returncode == 0, r.stderr
        assert os.fstat(old.fileno()).st_ino != os.stat(target).st_ino
        assert old.read(4) == b"hsqs"


def test_pull_output_must_be_named_sqsh(runner, store, image_files):  # noqa: F811
    target = store.parent / "out.tar"
    r = gsbx(runner, store, ["pull", "-q", "-o", str(target), f"oci:{image_files['layout']}:v1"])
    assert r.returncode == 125, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpusandbox: error: pull -o ") and ".sqsh" in lines[0], r.stderr
    assert all(ln.startswith("hint: ") for ln in lines[1:]), r.stderr
    # Refused before any work: nothing pulled, nothing written.
    assert not store.exists() and not target.exists()


def test_pull_output_says_what_it_writes_unless_quiet(runner, store, image_files):  # noqa: F811
    """While mksquashfs writes the file a progress line says so (tty: in
    place; plain, a log: a line when it starts), then where it went; -q:
    nothing but the digest."""
    import re
    from gpusandbox.image.sizes import human
    target = store.parent / "p.sqsh"
    ref = f"oci:{image_files['layout']}:v1"
    r = gsbx(runner, store, ["pull", "--progress", "tty", "-o", str(target), ref])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == image_files["digest"]
    wrote = re.escape(f"wrote {target} ({human(os.stat(target).st_size)}) in ") + r"\d+ s\n"
    # (text mode reads the \r of an in-place rewrite as a line end)
    assert re.search(r"\x1b\[K" + wrote + r"\Z", r.stderr), r.stderr
    squash = r.stderr[r.stderr.index("done: "):].splitlines()[1:-1]
    assert all(re.fullmatch(r"\x1b\[Kwriting p\.sqsh: [\d.]+ [kMG]?B so far, \d+ s", ln)
               for ln in squash if ln not in ("", "\x1b[K")), squash
    r = gsbx(runner, store, ["pull", "--progress", "plain", "-o", str(target), ref])
    assert r.returncode == 0, r.stderr
    assert f"writing {target} with mksquashfs" in r.stderr.splitlines()
    assert re.search(wrote + r"\Z", r.stderr), r.stderr
    r = gsbx(runner, store, ["pull", "-q", "-o", str(target), ref])
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
