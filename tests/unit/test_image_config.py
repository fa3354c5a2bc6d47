"""Image config as untrusted data, and docker's rules for applying it."""
import json

import pytest

from gpusandbox.image import config as cfgmod
from gpusandbox.image.digest import ImageError
from tests.unit import image_fixtures as fx

AMD64 = {"os": "linux", "architecture": "amd64", "variant": None}
D = "sha256:" + "c" * 64


def conf(**cfg):
    return cfgmod.parse(fx.image_config([D], **cfg))


def test_fields():
    c = conf(Env=["PATH=/opt/bin:/bin", "A=x=y", "EMPTY="], Entrypoint=["/bin/ep"],
             Cmd=["-v"], WorkingDir="/srv/../work//x/", User="1000:100",
             Labels={"a": "b"})
    assert c.env == [("PATH", "/opt/bin:/bin"), ("A", "x=y"), ("EMPTY", "")]
    assert c.workdir == "/work/x" and c.user == "1000:100" and c.labels == {"a": "b"}
    assert c.diff_ids == [D] and c.platform() == AMD64


def test_workdir_normalised_inside():
    # a WorkingDir through /proc/self/fd or with .. stays a plain container
    # path: the launcher's init creates it beneath the image root by fd
    assert conf(WorkingDir="../../../../etc").workdir == "/etc"
    assert conf(WorkingDir="rel/dir").workdir == "/rel/dir"


def test_command_rules():
    c = conf(Entrypoint=["/ep", "a"], Cmd=["c1", "c2"])
    assert cfgmod.command(c, [], None) == ["/ep", "a", "c1", "c2"]
    assert cfgmod.command(c, ["x"], None) == ["/ep", "a", "x"]
    assert cfgmod.command(c, [], "/other") == ["/other"]
    assert cfgmod.command(c, ["y"], "/other") == ["/other", "y"]
    assert cfgmod.command(c, ["y"], "") == ["y"]
    assert cfgmod.command(conf(Cmd=["sh"]), [], None) == ["sh"]
    assert cfgmod.command(conf(), [], None) == []


@pytest.mark.parametrize("cfg", [
    {"Env": "A=1"}, {"Env": [1]}, {"Env": ["NOEQUALS"]}, {"Env": ["A B=1"]},
    {"Env": ["A=\0"]}, {"Env": ["A=1"] * 5000}, {"Cmd": "sh"}, {"Cmd": [["sh"]]},
    {"Entrypoint": {"a": 1}}, {"WorkingDir": 5}, {"WorkingDir": "/a\0b"},
    {"User": 0}, {"Labels": ["a"]}, {"Labels": {"a": 1}}, {"Cmd": ["x" * 70000]},
])
def test_bad_fields(cfg):
    with pytest.raises(ImageError) as e:
        conf(**cfg)
    assert "\n" not in e.value.line()


@pytest.mark.parametrize("doc", [
    {"rootfs": {"type": "layers", "diff_ids": ["sha256:../x"]}},
    {"rootfs": {"type": "other", "diff_ids": []}},
    {"architecture": 1, "rootfs": {"type": "layers", "diff_ids": []}},
    {"config": [], "rootfs": {"type": "layers", "diff_ids": []}},
    [],
])
def test_bad_documents(doc):
    with pytest.raises(ImageError):
        cfgmod.parse(json.dumps(doc).encode())


def test_foreign_architecture():
    c = cfgmod.parse(fx.image_config([D], arch="arm64"))
    with pytest.raises(ImageError) as e:
        cfgmod.check_platform(c, AMD64, False)
    assert e.value.hint == "to run it anyway (emulated), pass --platform linux/arm64"
    cfgmod.check_platform(c, {"os": "linux", "architecture": "arm64"}, True)
    with pytest.raises(ImageError, match="asked for with --platform"):
        cfgmod.check_platform(c, {"os": "linux", "architecture": "s390x"}, True)


def test_user_resolution():
    files = {"/etc/passwd": b"root:x:0:0::/root:/bin/sh\nsvc:x:1001:1002::/h:/bin/sh\n",
             "/etc/group": b"root:x:0:\nstaff:x:50:\n"}

    def read(path, limit):
        assert limit <= 4 << 20
        return files.get(path)
    assert cfgmod.resolve_user(conf(User="1000"), None, read) == (1000, 1000)
    assert cfgmod.resolve_user(conf(User="1000:7"), None, read) == (1000, 7)
    assert cfgmod.resolve_user(conf(User="svc"), None, read) == (1001, 1002)
    assert cfgmod.resolve_user(conf(User="svc:staff"), None, read) == (1001, 50)
    for bad in ("nobody", "svc:nogroup", "99999999999"):
        with pytest.raises(ImageError):
            cfgmod.resolve_user(conf(User=bad), None, read)
    # an image whose passwd is not a readable regular file: read() gives None
    with pytest.raises(ImageError, match="not in its /etc/passwd"):
        cfgmod.resolve_user(conf(User="svc"), None, lambda p, n: None)
