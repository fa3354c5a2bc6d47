"""`--mpi host`: the host's MPI in place of the image's, by SONAME, after an
ABI check read from the ELF files (Sarus's MPI hook, WAVE3-FACTS.md section 4).

The MPICH ABI (MPICH >= 3.1, Intel MPI >= 5.0, Cray MPT >= 7.0, MVAPICH2 >=
2.0) names its libraries libmpi.so.12 or libmpich.so.12 (and the C++ and
Fortran companions): a program linked against any of them runs on another
member of the family with the same SONAME major.  The host's libraries are
the site's (the mpi-libs setting: a site file or GPUSANDBOX_MPI_LIBS,
colon-separated host paths), else the host loader cache's MPICH-ABI
libraries.  Each image library of the same family is replaced when the
majors agree; a major that differs (Open MPI's libmpi.so.40) refuses the
launch, as does an image with no MPI library at all.  Strictness
(the mpi-compat setting, GPUSANDBOX_MPI_COMPAT; Sarus's
MPI_COMPATIBILITY_TYPE): major (default),
full (the host's minor must be at least the image's, else a warning),
strict (the same full version)."""
import os

from . import elf, hostlibs
from .hostlibs import LibError

# linker name -> role; members of one role are interchangeable under the MPICH ABI.
FAMILY = {"libmpi": "C", "libmpich": "C", "libmpicxx": "C++", "libmpichcxx": "C++",
          "libmpifort": "Fortran", "libmpichfort": "Fortran"}
MPICH_ABI_MAJOR = "12"
COMPAT = ("major", "full", "strict")


def _split(name):
    """libmpich.so.12.2.2 -> ("libmpich", ["12", "2", "2"])."""
    base, sep, ver = name.partition(".so.")
    return base, (ver.split(".") if sep else [])


def _num(parts):
    return [int(p) if p.isdigit() else 0 for p in parts]


def host_mpi(conf, host):
    """[host path] of the host's MPI libraries: the mpi-libs setting
    (conf: settings.Settings of the caller; a site lock holds), else the
    host loader cache's MPICH-ABI libraries."""
    site, where = conf.lookup("mpi-libs")
    if site:
        paths = [p for p in site.split(":") if p]
        for p in paths:
            if not os.path.isfile(p):
                raise LibError(f"mpi-libs ({where or 'the default'}): {p}", "no such file",
                               "name the host's MPI libraries (libmpi.so.12 ...)")
        return paths
    out = [host[n] for n in sorted(host) if _split(n)[0] in FAMILY and
           _split(n)[1] == [MPICH_ABI_MAJOR]]
    if not out:
        raise LibError("--mpi host", "the host's loader cache has no MPICH-ABI library "
                       "(libmpi.so.12, libmpich.so.12)",
                       "install the site's MPI on the host, or name it with GPUSANDBOX_MPI_LIBS")
    return out


def add_mpi(plan, rootfd, inj, host, image, caller_env):
    """Add the host's MPI to `inj` under the image's names; raise LibError
    with the mismatch."""
    from .. import settings
    conf = settings.Settings(caller_env)
    compat = conf.get("mpi-compat")
    replaced = 0
    for hp in host_mpi(conf, host):
        d = elf.read(hp)
        soname = d.soname if d and d.soname else os.path.basename(hp)
        hbase, hver = _split(soname)
        role = FAMILY.get(hbase)
        hreal = _split(os.path.basename(os.path.realpath(hp)))[1] or hver
        theirs = [n for n in image if FAMILY.get(_split(n)[0]) == role] if role else \
            [n for n in image if _split(n)[0] == hbase]
        for name in theirs:
            iver = _split(name)[1]
            if iver[:1] != hver[:1]:
                raise LibError(f"--mpi host: the image's {name} is not ABI-compatible with the "
                               f"host's {soname}",
                               f"SONAME major {'.'.join(iver[:1]) or '?'} (image) != "
                               f"{'.'.join(hver[:1]) or '?'} (host)" +
                               (" (the image carries Open MPI, not the MPICH ABI)"
                                if _split(name)[0] == "libmpi" and iver[:1] == ["40"] else ""),
                               "run without --mpi host, or use an image built against "
                               "an MPICH-ABI MPI")
            ireal = _split(hostlibs.real_name_in_root(rootfd, image[name]) or name)[1]
            if compat == "strict" and ireal != hreal:
                raise LibError(f"--mpi host (strict): the image's {name} is "
                               f"{'.'.join(ireal)}, the host's {soname} {'.'.join(hreal)}",
                               "strict needs the same version",
                               "GPUSANDBOX_MPI_COMPAT=full or major")
            if compat == "full" and _num(hreal[1:2]) < _num(ireal[1:2]):
                plan.warnings.append(f"warning: --mpi host: the host's {soname} "
                                     f"({'.'.join(hreal)}) is older than the image's {name} "
                                     f"({'.'.join(ireal)}): symbols added since may be missing")
            inj.add(name, hp)
            inj.notes.append(f"mpi: the image's {name} is the host's {os.path.realpath(hp)}")
            replaced += 1
        # The host's own SONAME too: its companions name it (libmpichcxx -> libmpich.so.12).
        if theirs:
            inj.add(soname, hp)
    if not replaced:
        raise LibError("--mpi host: the image has no MPI library to replace",
                       "its loader cache lists no libmpi.so.*/libmpich.so.*",
                       "run ldconfig in the image, or drop --mpi host")
