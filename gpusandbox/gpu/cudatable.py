"""Minimum Linux drivers per CUDA release, as data, and the notes drawn from it.

Source: the CUDA toolkit release notes, Table 3 ("CUDA Toolkit and
Corresponding Driver Versions": the driver each toolkit release shipped
with, GA first, then its updates) and Table 2 ("CUDA minor version
compatibility": the oldest driver on which any release of a major version
runs without forward-compatibility libraries, PTX JIT aside).  There was no
CUDA 12.7.  Versions are kept as text and compared as dotted numbers.
"""

# (major, minor) -> drivers of the GA release and its updates, oldest first.
TOOLKIT_DRIVERS = {
    (11, 0): ("450.51.05", "450.51.06"),
    (11, 1): ("455.23", "455.32"),
    (11, 2): ("460.27.03", "460.32.03"),
    (11, 3): ("465.19.01",),
    (11, 4): ("470.42.01", "470.57.02", "470.82.01"),
    (11, 5): ("495.29.05",),
    (11, 6): ("510.39.01", "510.47.03"),
    (11, 7): ("515.43.04", "515.48.07"),
    (11, 8): ("520.61.05",),
    (12, 0): ("525.60.13", "525.85.12"),
    (12, 1): ("530.30.02",),
    (12, 2): ("535.54.03", "535.86.09", "535.104.05"),
    (12, 3): ("545.23.06", "545.23.08"),
    (12, 4): ("550.54.14", "550.54.15"),
    (12, 5): ("555.42.02", "555.42.06"),
    (12, 6): ("560.28.03", "560.35.03", "560.35.05"),
    (12, 8): ("570.26", "570.124.06"),
    (12, 9): ("575.51.03", "575.57.08"),
    (13, 0): ("580.65.06", "580.82.07", "580.95.05"),
    (13, 1): ("590.44.01", "590.48.01"),
    (13, 2): ("595.45.04", "595.58.03", "595.71.05"),
}

# major -> the oldest driver on which every minor release of it runs
# (minor-version compatibility; 11.0 itself needed 450.36.06).
MINOR_COMPAT_MIN = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def parse(text):
    """A dotted version as a tuple of ints, trailing zeros dropped; None if
    it is not one."""
    parts = str(text).strip().split(".")
    if not parts or len(parts) > 4 or not all(p.isascii() and p.isdigit() and len(p) <= 6
                                              for p in parts):
        return None
    nums = [int(p) for p in parts]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    return tuple(nums)


def release(text):
    """(major, minor) of a CUDA version text such as 12.4.1, or None."""
    v = parse(text)
    if v is None:
        return None
    return (v[0], v[1] if len(v) > 1 else 0)


def toolkit_driver(cuda):
    """(release, driver) where release is the first CUDA release in the table
    at or after `cuda`, and driver its GA minimum; None past the table."""
    want = release(cuda)
    if want is None:
        return None
    for rel in sorted(TOOLKIT_DRIVERS):
        if rel >= want:
            return rel, TOOLKIT_DRIVERS[rel][0]
    return None


def minor_compat(cuda, driver):
    """True when `driver` meets the minor-version-compatibility floor of
    `cuda`'s major (a 12.x runtime on a 12.y driver), False when it does not,
    None when the major or the driver is unknown."""
    rel, drv = release(cuda), parse(driver)
    if rel is None or drv is None or rel[0] not in MINOR_COMPAT_MIN:
        return None
    return drv >= parse(MINOR_COMPAT_MIN[rel[0]])


def driver_cuda(driver):
    """The newest CUDA release whose GA driver `driver` meets, or None."""
    drv = parse(driver)
    if drv is None:
        return None
    best = None
    for rel in sorted(TOOLKIT_DRIVERS):
        if drv >= parse(TOOLKIT_DRIVERS[rel][0]):
            best = rel
    return best


def ways_out(cuda, driver, datacenter):
    """Notes beyond "older image, newer driver" for an image that needs CUDA
    `cuda` on `driver`: the same-major note and the forward-compatibility
    note.  datacenter: True, False or None (unknown brand)."""
    notes = []
    rel, host = release(cuda), driver_cuda(driver)
    if rel and host and rel[0] == host[0] and minor_compat(cuda, driver):
        notes.append(f"CUDA {rel[0]}.{rel[1]} and the driver's CUDA {host[0]}.{host[1]} share "
                     f"major {rel[0]}: minor-version compatibility often lets it run "
                     f"(driver >= {MINOR_COMPAT_MIN[rel[0]]}; PTX JIT and newer APIs aside), "
                     "so --no-require may be enough")
    if datacenter is False:
        notes.append("forward-compatibility libraries (cuda-compat) do not work on this "
                     "GPU brand (CUDA error 804): data-center GPUs only")
    else:
        notes.append("on a data-center GPU an image carrying the cuda-compat libraries "
                     "(/usr/local/cuda/compat) runs through them (--cuda-compat auto)")
    return notes
