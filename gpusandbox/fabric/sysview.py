"""The sandbox's /sys shows the task's HCAs (and Slingshot CXI NICs) only,
as its /proc/driver/nvidia
shows its GPUs only (gpu/inject.py): the same edits, a read-only tmpfs over
the directory that lists every device, and the task's own entries put back
on it.

- /sys/class/infiniband, infiniband_verbs and infiniband_mad: each covered
  by a tmpfs holding the chosen HCAs' entries, the host's own symlinks with
  their own (relative) targets, so realpath(/sys/class/infiniband/<hca>/
  device), the PCI path NCCL reads, is the host's; the plain files there
  (abi_version, which libibverbs checks first) are bound read-only.
  uverbs/umad/issm entries belong to the HCA their `ibdev` file names.
  /sys/class/cxi and cxi_user (whose cxiN entries libcxi enumerates) alike.
- The PCI device directory of every HCA the task did not get: covered by an
  empty read-only tmpfs (what runc's masked paths and the init's covering of
  /sys's submounts use), so its infiniband/, infiniband_verbs/ and net/
  trees are gone too.

The sandbox's /sys is the launcher's own (stages/sysmounts.py clones it), so
the view is built only when discovery read that same tree: on a simulated
host whose HCAs live in a sysfs snapshot, /sys is left as it is (a note
says so), since there is nothing of them in it to hide."""
import os

from gpusandbox.edits import ContainerEdits, Mount, Symlink, Tmpfs

CLASSES = ("infiniband", "infiniband_verbs", "infiniband_mad", "cxi", "cxi_user")
SYS = "/sys"
RO = ("ro", "nosuid", "nodev", "noexec")


def _owner(host, cls, name, path):
    """The HCA a class entry belongs to (its own name, or its ibdev file)."""
    if cls in ("infiniband", "cxi", "cxi_user"):
        return name
    try:
        with open(os.path.join(path, "ibdev"), "rb") as f:
            return f.read(256).decode("utf-8", "replace").strip()
    except OSError:
        return None


def is_sandbox_sys(sys_root, launcher_sys=SYS):
    """Whether the sysfs tree discovery read is the one the sandbox gets."""
    try:
        return os.path.samestat(os.stat(sys_root), os.stat(launcher_sys))
    except OSError:
        return False


def view(host, chosen, launcher_sys=SYS):
    """(ContainerEdits, notes) hiding from /sys every HCA and CXI NIC of
    `host` not in `chosen` (Hca/Cxi list); empty edits when it has none."""
    edits, notes = ContainerEdits(), []
    nics = host.nics()
    if not nics:
        return edits, notes
    if not is_sandbox_sys(host.sys_root, launcher_sys):
        notes.append(f"fabric: /sys left as it is: the adapters were read from {host.sys_root}, "
                     "which is not this host's /sys (a simulated host)")
        return edits, notes
    keep = {h.name for h in chosen}
    for cls in CLASSES:
        cdir = host.sys(f"class/{cls}")
        try:
            names = sorted(os.listdir(cdir))
        except OSError:
            continue
        edits.tmpfs.append(Tmpfs(f"{SYS}/class/{cls}"))
        for name in names:
            path = os.path.join(cdir, name)
            if os.path.islink(path):
                if _owner(host, cls, name, path) in keep:
                    edits.symlinks.append(Symlink(f"{SYS}/class/{cls}/{name}",
                                                  os.readlink(path)))
            elif os.path.isfile(path):
                edits.mounts.append(Mount(path, f"{SYS}/class/{cls}/{name}", RO, kind="file"))
    base = os.path.realpath(host.sys_root)
    kept = [h.pci_path for h in chosen]
    covered = set()
    for h in nics:
        if h.name in keep or h.pci_path in covered:
            continue
        rel = os.path.relpath(h.pci_path, base)
        if not rel.startswith("devices/") or \
                any(k == h.pci_path or k.startswith(h.pci_path + "/") for k in kept):
            continue        # outside sysfs's device tree, or a chosen HCA's own
        covered.add(h.pci_path)
        edits.tmpfs.append(Tmpfs(f"{SYS}/{rel}"))
    if covered:
        notes.append(f"fabric: /sys hides the {len(covered)} adapter(s) this task did not get")
    return edits, notes
