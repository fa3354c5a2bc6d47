"""Compiled profiles installed on the real kernel, in forked children.

Each probe runs twice: in a control child without a filter and in a child
that set no_new_privs and installed the filter.  Results come back through a
pipe and are asserted here, against the control where the kernel would give
a different answer without the filter."""
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from gpusandbox.linux import seccomp
from gpusandbox.linux import sys as lsys
from gpusandbox.linux.syscalls_table import AARCH64, X86_64

ARCH = seccomp.host_arch()
NR = {"x86_64": X86_64, "aarch64": AARCH64}.get(ARCH)


def _seccomp_supported():
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(NR is None, reason=f"no syscall table for {ARCH}"),
    pytest.mark.skipif(not _seccomp_supported(), reason="kernel without CONFIG_SECCOMP"),
]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def raw(name_or_nr, *args):
    """(return value, errno) of a raw syscall; never raises."""
    nr = NR[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
    ctypes.set_errno(0)
    res = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a & (2**64 - 1)) for a in args])
    err = ctypes.get_errno() if res == -1 else 0
    if res == 0 and name_or_nr in ("clone", "clone3"):
        os._exit(0)                   # a namespace clone that got through: leave quietly
    if res > 0 and name_or_nr in ("clone", "clone3"):
        os.waitpid(res, 0)
    return res, err


def in_child(probe, prog=None):
    """Run probe() in a forked child (after installing prog, if given).
    Returns (probe result, wait status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            if prog is not None:
                lsys.prctl(lsys.PR_SET_NO_NEW_PRIVS, 1)
                seccomp.install(prog)
            out = json.dumps(probe()).encode()
        except BaseException as e:    # report, never return into pytest
            out = json.dumps({"child error": repr(e)}).encode()
            code = 1
        while out:
            out = out[os.write(w, out):]
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    return (json.loads(data) if data else None), status


CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
TIOCSTI, TIOCGWINSZ = 0x5412, 0x5413
PYTHON_SMOKE = ("import json, threading, subprocess\n"
                "t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n"
                "subprocess.run(['/bin/true'], check=True)\n"
                "print(json.dumps({'ok': True}))\n")


def probe_all():
    import threading
    res = {"getpid": [raw("getpid")[0], os.getpid()]}
    res["keyctl"] = raw("keyctl", 0, 2**64 - 3, 0)        # KEYCTL_GET_KEYRING_ID(session)
    res["bpf"] = raw("bpf", 0, 0, 0)
    res["nr1000"] = raw(1000)
    res["kcmp"] = raw("kcmp", os.getpid(), os.getpid(), 1, 0, 0)      # KCMP_FILES
    res["fanotify"] = raw("fanotify_init", 2**32 - 1, 0)               # EINVAL unfiltered
    res["mount"] = raw("mount", 0, ctypes.addressof(ctypes.create_string_buffer(
        b"/nonexistent-gpusandbox-test")), 0, 0x40000 | 0x4000, 0)  # MS_PRIVATE|MS_REC
    res["clone3"] = raw("clone3", 0, 88)
    res["memfd"] = raw("memfd_create", ctypes.addressof(ctypes.create_string_buffer(b"t")), 1)
    res["perf"] = raw("perf_event_open", 0, 0, 2**64 - 1, 2**64 - 1, 0)

    mfd, sfd = os.openpty()
    ch = ctypes.c_char(b"x")
    res["tiocsti"] = raw("ioctl", sfd, TIOCSTI, ctypes.addressof(ch))
    res["tiocsti_high"] = raw("ioctl", sfd, (1 << 32) | TIOCSTI, ctypes.addressof(ch))
    ws = ctypes.create_string_buffer(8)
    res["tiocgwinsz"] = raw("ioctl", sfd, TIOCGWINSZ, ctypes.addressof(ws))
    os.close(mfd)
    os.close(sfd)

    box = []
    t = threading.Thread(target=box.append, args=(threading.get_native_id(),))
    t.start()
    t.join()
    res["thread"] = len(box) == 1
    res["true"] = subprocess.run(["/bin/true"]).returncode
    p = subprocess.run([sys.executable, "-c", PYTHON_SMOKE], capture_output=True, text=True)
    res["python"] = [p.returncode, p.stdout, p.stderr[-500:]]
    # Last: a successful unshare moves the control child into a new user
    # namespace, where it loses its capabilities for everything above.
    res["clone_user"] = raw("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    res["unshare_user"] = raw("unshare", CLONE_NEWUSER)
    return res


@pytest.fixture(scope="module")
def control():
    res, status = in_child(probe_all)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, res
    return res


@pytest.fixture(scope="module")
def filtered():
    res, status = in_child(probe_all, seccomp.compile_profile("default", cache=False))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (res, status)
    return res


def test_basic_calls_and_python_still_work(filtered):
    assert filtered["getpid"][0] == filtered["getpid"][1]
    assert filtered["memfd"][1] == 0
    assert filtered["thread"] is True          # glibc falls back from clone3 to clone
    assert filtered["true"] == 0
    rc, out, err = filtered["python"]
    assert rc == 0, err
    assert "thread ok" in out and '{"ok": true}' in out


def test_denied_calls_get_eperm(filtered, control):
    assert filtered["keyctl"] == [-1, errno.EPERM]
    assert control["keyctl"][1] != errno.EPERM
    assert filtered["bpf"] == [-1, errno.EPERM]
    assert filtered["mount"] == [-1, errno.EPERM]
    if os.geteuid() == 0:
        assert control["mount"] == [-1, errno.ENOENT]
    assert filtered["perf"] == [-1, errno.EPERM]


def test_new_user_namespaces_are_refused(filtered, control):
    assert filtered["unshare_user"] == [-1, errno.EPERM]
    assert filtered["clone_user"] == [-1, errno.EPERM]
    if control["clone_user"][0] <= 0 or control["unshare_user"][0] != 0:
        pytest.skip("user namespaces are unavailable here even without the filter")


def test_clone3_and_unlisted_calls_get_enosys(filtered, control):
    assert filtered["clone3"] == [-1, errno.ENOSYS]
    assert filtered["nr1000"] == [-1, errno.ENOSYS]
    assert filtered["fanotify"] == [-1, errno.ENOSYS]
    assert control["fanotify"][1] != errno.ENOSYS


def test_kcmp_is_allowed_for_open_mpi_cma(filtered, control):
    # Open MPI 5 compares its peer's address space with kcmp before using
    # process_vm_readv; a filtered kcmp silently turns CMA off.
    if control["kcmp"][1] == errno.ENOSYS:
        pytest.skip("kernel without CONFIG_KCMP")
    assert filtered["kcmp"] == control["kcmp"]


def test_terminal_injection_is_refused_even_with_high_bits(filtered, control):
    assert filtered["tiocsti"] == [-1, errno.EPERM]
    assert filtered["tiocsti_high"] == [-1, errno.EPERM]
    assert filtered["tiocgwinsz"] == [0, 0]
    # Without the filter the kernel treats both requests alike (it reads the
    # request as 32 bits), which is why the filter compares the low half only.
    assert control["tiocsti_high"] == control["tiocsti"]


def test_profiling_profile_allows_perf_event_open(control):
    res, status = in_child(lambda: {"perf": raw("perf_event_open", 0, 0, 2**64 - 1, 2**64 - 1, 0),
                                    "bpf": raw("bpf", 0, 0, 0)},
                           seccomp.compile_profile("profiling", cache=False))
    assert os.WIFEXITED(status), status
    assert res["bpf"] == [-1, errno.EPERM]
    # perf_event_open(NULL attr) fails in the kernel (EFAULT), not in the filter.
    assert res["perf"] == control["perf"] != [-1, errno.EPERM]


@pytest.mark.skipif(ARCH != "x86_64", reason="x32 exists only on x86_64")
def test_x32_syscall_kills_the_process():
    res, status = in_child(lambda: raw(0x40000000 | X86_64["getpid"]),
                           seccomp.compile_profile("default", cache=False))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS, (res, status)


def _int80_getpid():
    """Call getpid through the 32-bit entry point (int 0x80, i386 number 20)."""
    import mmap
    code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"      # mov eax, 20; int 0x80; ret
    m = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return [ctypes.CFUNCTYPE(ctypes.c_int)(addr)(), os.getpid()]


@pytest.mark.skipif(ARCH != "x86_64", reason="int 0x80 exists only on x86")
def test_i386_entry_point_kills_the_process():
    res, status = in_child(_int80_getpid)
    if not (os.WIFEXITED(status) and res and res[0] == res[1]):
        pytest.skip("32-bit syscall emulation is disabled on this kernel")
    res, status = in_child(_int80_getpid, seccomp.compile_profile("default", cache=False))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS, (res, status)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to a uid without CAP_SYS_ADMIN")
def test_install_without_no_new_privs_fails_with_a_message():
    prog = seccomp.compile_profile("default", cache=False)

    def probe():
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)      # no capabilities left
        try:
            seccomp.install(prog)
        except OSError as e:
            return [e.errno, str(e)]
        return None
    res, status = in_child(probe)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, res
    assert res[0] == errno.EACCES
    assert "installing the seccomp filter failed" in res[1] and "no_new_privs" in res[1]
