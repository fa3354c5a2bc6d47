"""linux/sys.py builds the C types it needs on _ctypes instead of importing
ctypes (issue 24, a lean launch path): the types, the libc handle and the
helpers must behave as ctypes' own do, and the launch path must not load
ctypes behind them."""
import ctypes
import os
import subprocess
import sys

import pytest

from gpusandbox.linux import caps, sys as k


@pytest.mark.parametrize("ours, theirs", [
    (k.c_int, ctypes.c_int), (k.c_uint, ctypes.c_uint), (k.c_long, ctypes.c_long),
    (k.c_ulong, ctypes.c_ulong), (k.c_ushort, ctypes.c_ushort), (k.c_char, ctypes.c_char),
    (k.c_char_p, ctypes.c_char_p), (k.c_void_p, ctypes.c_void_p),
    (k.c_uint32, ctypes.c_uint32), (k.c_uint64, ctypes.c_uint64), (k.c_size_t, ctypes.c_size_t),
])
def test_each_type_has_ctypes_size_and_alignment(ours, theirs):
    assert (ctypes.sizeof(ours), ctypes.alignment(ours)) == \
        (ctypes.sizeof(theirs), ctypes.alignment(theirs))
    assert ours._type_ == theirs._type_ or ctypes.sizeof(ours) == ctypes.sizeof(theirs)


def test_the_kernel_structs_keep_their_abi_layout():
    # include/uapi/linux/sched.h clone_args (v2, with cgroup): 88 bytes;
    # open_how 24; mount_attr 32; capability header 8 and data 12.
    assert [k.sizeof(t) for t in (k._CloneArgs, k._OpenHow, k._MountAttr, caps._Hdr, caps._Data)] \
        == [88, 24, 32, 8, 12]


def test_libc_calls_return_ints_and_keep_errno():
    assert k.libc.getpid() == os.getpid()
    with pytest.raises(OSError) as e:
        k.openat2(k.AT_FDCWD, "/nonexistent/gsbx", os.O_RDONLY, 0, 0)
    assert e.value.errno == 2 and "openat2(/nonexistent/gsbx)" in str(e.value)
    assert k.libc.close(-1) == -1 and k.get_errno() == 9      # EBADF, as ctypes.get_errno
    assert ctypes.get_errno() == 9                            # the one errno slot both read


def test_create_string_buffer_matches_ctypes():
    for args in ((b"abc",), (b"abcd", 4), (b"ab", 8)):
        ours, theirs = k.create_string_buffer(*args), ctypes.create_string_buffer(*args)
        assert (bytes(ours), k.sizeof(ours)) == (bytes(theirs), ctypes.sizeof(theirs))


def test_the_python_api_handle_runs_the_fork_hooks_in_order():
    # clone_fork's PyOS_BeforeFork / AfterFork_Parent pair, as fork() runs it.
    k._pyapi.PyOS_BeforeFork()
    k._pyapi.PyOS_AfterFork_Parent()


def test_the_kernel_layer_loads_no_ctypes_or_struct():
    code = ("import sys; import gpusandbox.linux.sys, gpusandbox.linux.caps, "
            "gpusandbox.linux.seccomp, gpusandbox.gpu.ldcache; "
            "print(sorted(m for m in ('ctypes', 'struct', 'types') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
