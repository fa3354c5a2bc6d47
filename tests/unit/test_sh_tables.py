"""The sh entries' copies of the Python tables, held to them.

bin/gpusandbox-oci answers state, start, delete and kill without Python and
bin/gpusandbox-runtime execs the real runtime for a create that cannot ask
for a GPU; each repeats a rule of the Python path: the signal table, the
container-id rule, the state files and their delete order, the state
root's candidates, the global options, and the GPU-request words.  Each
table is read out of the sh text (and, where the sh maps something, the sh
fragment is run) and compared with the Python table it copies: the entry
must answer exactly as the Python path, or hand over to it."""
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from gpusandbox import rundir
from gpusandbox.errors import SandboxError
from gpusandbox.oci import configedit, wrapper
from gpusandbox.oci.runtime import cli, ops, state

REPO = Path(__file__).resolve().parents[2]
OCI = (REPO / "bin" / "gpusandbox-oci").read_text()
RUNTIME = (REPO / "bin" / "gpusandbox-runtime").read_text()
PY = "PY"       # what a fragment prints where the entry hands over to Python


def block(text, first, last):
    """The lines of `text` from the one containing `first` to the first
    one after it that starts with `last`."""
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if first in ln)
    j = next(n for n in range(i + 1, len(lines)) if lines[n].startswith(last))
    return "\n".join(lines[i:j + 1]) + "\n"


def run_fragment(fragment, setup, out, inputs, env=None):
    """`fragment` run once per input in a subshell of one sh: `setup` sets
    its variables from "$x", `out` prints the answer; py() prints PY."""
    code = (f"set -f\npy() {{ echo {PY}; exit 0; }}\n"
            f"for x; do (\n{setup}\n{fragment}\n{out}\n); done\n")
    r = subprocess.run(["sh", "-c", code, "sh", *inputs], capture_output=True, text=True,
                       check=True, env=env or {"PATH": "/usr/bin:/bin"})
    got = r.stdout.split("\n")[:-1]
    assert len(got) == len(inputs), r.stdout
    return dict(zip(inputs, got))


# -- signals -----------------------------------------------------------------

SIG_BLOCK = block(OCI, "case ${sig#SIG} in", "  esac")


def sh_signal_names():
    """NAME -> number of the sh's `NAME|ALIAS) signo=N ;;` arms."""
    out = {}
    for pats, num in re.findall(r"([A-Z][A-Z0-9|]*)\) signo=(\d+) ;;", SIG_BLOCK):
        for p in pats.split("|"):
            assert p not in out, p
            out[p] = int(num)
    return out


def py_signal(text):
    try:
        return str(ops.parse_signal(text))
    except SandboxError:
        return "ERR"


def test_the_sh_signal_names_are_the_python_table():
    assert sh_signal_names() == ops.SIGNALS


def test_the_python_signal_table_is_the_kernels():
    for name, num in ops.SIGNALS.items():
        assert signal.Signals["SIG" + name] == num, name
    named = {s.name[3:] for s in signal.Signals if not s.name.startswith("SIGRT")}
    # SIGCLD is glibc's old alias of SIGCHLD: neither kill(1) nor runc names it.
    assert named - set(ops.SIGNALS) <= {"CLD"}


SIG_INPUTS = sorted({*ops.SIGNALS, *("SIG" + n for n in ops.SIGNALS),
                     *(n.lower() for n in ops.SIGNALS), *(str(i) for i in range(0, 70)),
                     "", "SIG", "SIG9", "SIGSIGKILL", "015", "09", "+9", "-9", " 9", "9 ", "0x9",
                     "\u0661\u0665", "1e1", "KILLX", "XKILL", "Kill", "RTMIN", "SIGRTMIN+1",
                     "RTMAX-1", "RTMIN+30", "RTMIN+31", "RTMINX", "RTMIN-1", "RTMAX+1",
                     "RTMIN+", "RTMAX-", "RTMIN+-1", "RTMAX-31", "100", "4294967305"})


def test_the_sh_signal_mapping_answers_as_parse_signal_or_hands_over():
    sh = run_fragment(SIG_BLOCK, 'sig=$x signo=', 'echo "$signo"', SIG_INPUTS)
    for text, got in sh.items():
        assert got in (PY, py_signal(text)), (text, got, py_signal(text))
    # What callers send (podman: a number; runc's examples: a name, with or
    # without SIG) never starts Python.
    for text in (*ops.SIGNALS, *("SIG" + n for n in ops.SIGNALS), *map(str, range(1, 65))):
        assert sh[text] != PY, text
    assert sh[""] == "15"        # `kill ID`: TERM, as cli's default


@pytest.mark.parametrize("n", range(0, 31))
def test_realtime_signals_by_name_are_the_kernels(n):
    lo, hi = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
    for base, num in (("RTMIN", lo + n), ("RTMAX", hi - n)):
        want = str(num) if lo <= num <= hi else "ERR"
        assert py_signal(f"{base}+{n}" if base == "RTMIN" else f"{base}-{n}") == want
        assert py_signal(f"SIG{base}+{n}" if base == "RTMIN" else f"SIG{base}-{n}") == want
    assert py_signal("RTMIN") == str(lo) and py_signal("RTMAX") == str(hi)


@pytest.mark.parametrize("text", ["RTMINX", "RTMIN-1", "RTMAX+1", "RTMIN+", "RTMAX-",
                                  "RTMIN+-1", "RTMIN+31", "RTMAX-31", "RTMIN+1x",
                                  "\u0661\u0665", "0", "65", "SIG", "SIG9"])
def test_parse_signal_refuses_what_the_kernel_does_not_name(text):
    assert py_signal(text) == "ERR"


# -- container ids -----------------------------------------------------------

ID_BLOCK = block(OCI, "# state.check_id's rules", '[ ${#id} -le ')


def test_the_sh_id_rule_is_check_ids():
    first, rest = re.findall(r"\[!?([A-Za-z0-9_.+-]+)\]", ID_BLOCK)
    assert set(first) == state.ID_FIRST
    assert set(rest) == state.ID_CHARS
    assert re.search(r"-le (\d+) \]", ID_BLOCK).group(1) == str(state.ID_MAX)


ID_INPUTS = ["a", "Z9", "0", "A_b.c+d-e", "_a", ".a", "-a", "+a", "a/b", "a b", "a\tb",
             "\u00e9", "a\u00e9", "\u0661", "a*", "*", "[a]", "a?", "a\\b", "a'b", 'a"b', "a$b",
             "a" * state.ID_MAX, "a" * (state.ID_MAX + 1), "..", "a..b", "a\nb"]


def test_the_sh_id_rule_answers_as_check_id():
    sh = run_fragment(ID_BLOCK, "id=$x", "echo ok", ID_INPUTS)
    for cid, got in sh.items():
        try:
            state.check_id(cid)
            want = "ok"
        except SandboxError:
            want = PY
        assert got == want, cid


# -- state files -------------------------------------------------------------

def test_the_sh_state_file_names_and_delete_order_are_state_files():
    names = dict(re.findall(r"^\s*(\w+)=\$d/([\w.]+)$", OCI, re.M))
    assert names == {"f": "state.fast", "fifo": "exec.fifo"}
    rm = re.search(r'"\$rm" -f -d -- (.*) 2>/dev/null', OCI).group(1).split()
    paths = [names[p.strip('"$')] if "/" not in p else p.strip('"').split("/")[1]
             for p in rm[:-1]]
    assert paths == list(state.FILES) and rm[-1] == '"$d"'
    # Every name under ROOT/ID the entry touches is one of the state's files.
    assert set(re.findall(r"\$d/([\w.]+)", OCI)) <= set(state.FILES)


def _st(tmp_path, **kw):
    return dict({"id": "c1", "pid": 4242, "start_time": 777, "bundle": "/b", "rootfs": "/b/r",
                 "created": "2026-01-01T00:00:00Z", "annotations": {"k": "v \" \\ \u00e9"},
                 "_dir": str(tmp_path)}, **kw)


FAST_READ = block(OCI, '{ IFS= read -r magic', '[ "$magic" = ')
STATE_OUT = block(OCI, "  printf '%s%s\", \"pid\": %s%s\\n'", "  exit 0")


@pytest.mark.parametrize("status", ["created", "running", "paused", "stopped"])
@pytest.mark.parametrize("hooks", [{}, {"poststop": [{"path": "/bin/true"}]}])
def test_the_sh_reads_state_fast_as_save_writes_it(tmp_path, monkeypatch, status, hooks):
    """The entry's read of state.fast and its `state` line give the object
    state.public gives, for each status; `how` is plain where _fast says so."""
    st = _st(tmp_path, hooks=hooks, cgroup="/sys/fs/cgroup/x", cgroup_version=2)
    fast = state._fast(st)
    assert fast.splitlines()[0] == state.FAST_MAGIC
    assert f'[ "$magic" = "{state.FAST_MAGIC}" ]' in FAST_READ
    (tmp_path / "state.fast").write_text(fast)
    monkeypatch.setattr(state, "status", lambda st: status)
    want = state.public(st)
    s_pid = "pid=0" if status == "stopped" else ""
    code = (f'f={tmp_path}/state.fast\n{FAST_READ}\ns={status} {s_pid}\n'
            + STATE_OUT.replace("  exit 0", 'echo "$how"'))
    r = subprocess.run(["sh", "-c", f"py() {{ echo {PY}; exit 0; }}\n{code}"],
                       capture_output=True, text=True, check=True)
    line, how = r.stdout.splitlines()
    assert json.loads(line) == want
    assert how == ("python" if hooks else "plain")


@pytest.mark.parametrize("cmd,python", [("start", False), ("delete", True)])
def test_v1_leaves_leave_start_to_the_sh_and_delete_to_python(tmp_path, cmd, python):
    """A container with cgroup v1 leaves: the entry may start it, but only
    Python's delete removes those leaves."""
    st = _st(tmp_path, cgroup="/sys/fs/cgroup/unified/x", cgroup_version=2,
             cgroup_v1=["/sys/fs/cgroup/memory/x"])
    assert state._fast(st).splitlines()[-1] == "start"
    gate = block(OCI, "# start and delete act on the directory", "case $cmd$how")
    r = subprocess.run(["sh", "-c", f"py() {{ echo {PY}; exit 0; }}\ncmd={cmd} how=start\n"
                        f"{gate}\necho sh"], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == (PY if python else "sh")


# -- state root --------------------------------------------------------------

ROOT_BLOCK = block(OCI, "kind=given", "fi") + \
    block(OCI, "case $root in /*) ;; *) py", 'case $root/ in *//*|*/./*|*/../*) py "$@" ;; esac')


@pytest.mark.parametrize("uid", [0, 1000])
@pytest.mark.parametrize("xdg", [None, "", "/x/run", "/x/run/", "rel", "/", "/x/./run"])
def test_the_sh_state_root_is_rundirs_first_candidate(monkeypatch, uid, xdg):
    """The entry takes the first candidate oci_root tries (it hands over
    where that one fails the chain's checks): the same path, or Python."""
    monkeypatch.setattr(rundir, "host_uid", lambda: uid)
    tried = []
    monkeypatch.setattr(rundir, "usable_runtime",
                        lambda p: tried.append(p) or p.startswith("/"))
    env = {"PATH": "/usr/bin:/bin"} | ({} if xdg is None else {"XDG_RUNTIME_DIR": xdg})
    want = rundir.oci_root({} if xdg is None else {"XDG_RUNTIME_DIR": xdg})
    got = run_fragment(f"root_set= uid={uid}\n{ROOT_BLOCK}", "", 'echo "$root"', ["x"],
                       env)["x"]
    assert got in (PY, want), (got, want)
    if not xdg or xdg in ("/x/run", "rel"):
        assert got == want
    if uid:
        assert want == f"{tried[-1]}/{rundir.OCI_NAME}".replace("//", "/")


def test_the_sh_state_root_names_are_rundirs():
    assert f"root=$XDG_RUNTIME_DIR/{rundir.OCI_NAME} " in OCI
    assert f"root=/run/user/$uid/{rundir.OCI_NAME} " in OCI
    assert f"root={rundir.ROOT_OCI} kind=run" in OCI


# -- command lines -----------------------------------------------------------

def test_the_sh_global_options_are_clis():
    opts = block(OCI, 'for a in "$@"; do', "done")
    valued, flags = set(), set()
    for line in opts.splitlines():
        m = re.match(r"\s+([-\w=*|]+)\) (.*)", line)
        if not m or not m.group(1).startswith("--"):
            continue
        pats = m.group(1).split("|")
        if "next=" in m.group(2):
            valued.update(pats)           # --opt VALUE
        elif m.group(2) == ";;":
            flags.update(p for p in pats if "=" not in p)     # --flag (or --flag=X)
    assert valued == cli.GLOBAL_VALUE
    assert flags <= cli.GLOBAL_FLAG
    cmds = re.search(r"^\s+(state\|[\w|]+)\) break ;;", opts, re.M).group(1).split("|")
    assert set(cmds) <= cli.STATE_COMMANDS and set(cmds) == {"state", "start", "delete", "kill"}


def test_the_runtime_sh_global_options_are_the_wrappers():
    skip = re.search(r"^\s+(--root\|[-\w|]+)\) skip=1 ;;", RUNTIME, re.M).group(1).split("|")
    assert tuple(skip) == wrapper._VALUED


# -- GPU-request words -------------------------------------------------------

def request_words():
    """The named table of the words a config.json that the GPU edit acts
    on holds (configedit.REQUEST_WORDS)."""
    return configedit.REQUEST_WORDS


def sh_grep_words():
    m = re.search(r"grep -q -F((?: \\?\s*-e \S+)+) --", RUNTIME)
    return tuple(re.findall(r"-e (\S+)", m.group(1)))


def test_the_runtime_sh_greps_for_the_request_words():
    assert sorted(sh_grep_words()) == sorted(request_words())


class _Acts(Exception):
    pass


def _edit_acts(cfg, monkeypatch):
    """Whether configedit.edit changes `cfg` (its host side stubbed out:
    only the decision is looked at)."""
    def acts(*a, **k):
        raise _Acts
    monkeypatch.setattr(configedit, "open_rootfs", lambda *a, **k: None)
    monkeypatch.setattr(configedit, "resolve_cdi", acts)
    monkeypatch.setattr(configedit, "memo_gpu_edits", acts)
    try:
        return configedit.edit(cfg, {}, "/nonexistent") is not None
    except _Acts:
        return True
    except SandboxError:
        return True      # refused (mixed names): the wrapper's words it


def _env(*items):
    return {"process": {"env": ["PATH=/bin", *items]}}


CONFIGS = {
    "nothing": {"process": {"env": ["PATH=/bin"]}},
    "visible": _env("NVIDIA_VISIBLE_DEVICES=0"),
    "visible all": _env("NVIDIA_VISIBLE_DEVICES=all"),
    "visible void": _env("NVIDIA_VISIBLE_DEVICES=void"),
    "visible cdi": _env("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"),
    "capabilities only": _env("NVIDIA_DRIVER_CAPABILITIES=all"),
    "mig only": _env("NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all"),
    "cdi annotation": {"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}},
    "legacy hook": {"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook"}]}},
    "toolkit hook": {"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-toolkit"}]}},
    "word in a label": {"annotations": {"note": "NVIDIA_VISIBLE_DEVICES"}},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_a_config_the_edit_acts_on_holds_a_grep_word(name, monkeypatch, tmp_path):
    """The sh's grep itself, on the config's text: where the Python edit
    would act (or refuse), grep finds a word; the runtime is exec'd
    directly only for configs the edit leaves as they are."""
    cfg = CONFIGS[name]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    grep = re.search(r"(grep -q -F(?: \\?\s*-e \S+)+ --) \"\$b/config.json\"", RUNTIME).group(1)
    r = subprocess.run(["sh", "-c", f'{grep} "$1"', "sh", str(tmp_path / "config.json")])
    assert r.returncode in (0, 1)
    if _edit_acts(json.loads(json.dumps(cfg)), monkeypatch):
        assert r.returncode == 0, name
