"""docker's --gpus forms and duplicates, resolved against a fake driver root;
the driver root a plain run reads from the caller's environment."""
import pytest

from gpusandbox.errors import UsageError
from gpusandbox.gpu import discover, select
from gpusandbox.plandev import driver_roots
from gpusandbox.spec import RunSpec
from tests.unit import gpu_fixtures as fx

needs_fake = pytest.mark.skipif(not (fx.HAVE_GCC and fx.HAVE_LDCONFIG),
                                reason="the fake driver root needs gcc and ldconfig")


@pytest.fixture(scope="module")
def host():
    with fx.FakeDriver(gpus=3, mig={1: [(1, 0), (2, 0)]}) as fd:
        yield discover.discover(fd.root)


def idx(sel):
    return [g.index for g in sel.gpus]


@needs_fake
def test_count_takes_the_first_gpus(host):
    assert idx(select.resolve("count=2", None, {}, host)) == [0, 1]
    sel = select.resolve("count=3", None, {}, host)
    assert idx(sel) == [0, 1, 2] and sel.migs == []
    assert idx(select.resolve("count=all", None, {}, host)) == [0, 1, 2]


@needs_fake
def test_count_beyond_the_host_is_refused(host):
    with pytest.raises(UsageError) as ei:
        select.resolve("count=4", None, {}, host)
    assert ei.value.line() == "--gpus count=4: this host has 3 GPUs"


@needs_fake
def test_docker_device_forms_resolve(host):
    assert idx(select.resolve('"device=0,2"', None, {}, host)) == [0, 2]
    assert idx(select.resolve("device=1", None, {}, host)) == [1]


@needs_fake
@pytest.mark.parametrize("value,needle", [
    ("0,{uuid0}", "names GPU 0 again"),
    ("{bus0},0", "names GPU 0 again"),
    ("1:1,1:1:0", "names MIG device 1:1:0 again"),
])
def test_the_same_device_named_twice_is_refused(host, value, needle):
    value = value.format(uuid0=host.gpus[0].uuid, bus0=host.gpus[0].bus_id)
    with pytest.raises(UsageError) as ei:
        select.resolve(value, None, {}, host)
    assert needle in ei.value.line() and ei.value.line().startswith("invalid --gpus ")


@needs_fake
def test_the_callers_variable_keeps_its_lenient_dedup(host):
    sel = select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": "0,0"}, host)
    assert idx(sel) == [0]


def _spec(driver_root=None, dev_root=None):
    s = RunSpec()
    s.driver_root, s.dev_root = driver_root, dev_root
    return s


def test_driver_root_from_the_callers_variable():
    env = {"GPUSANDBOX_DRIVER_ROOT": "/drv", "GPUSANDBOX_DEV_ROOT": "/drv/dev2"}
    assert driver_roots(_spec(), {}) == ("/", None)
    assert driver_roots(_spec(), env) == ("/drv", "/drv/dev2")
    assert driver_roots(_spec(), {"GPUSANDBOX_DRIVER_ROOT": "/drv"}) == ("/drv", None)
    # --driver-root wins over both variables; --dev-root over the variable.
    assert driver_roots(_spec("/opt"), env) == ("/opt", None)
    assert driver_roots(_spec(None, "/d"), env) == ("/drv", "/d")
