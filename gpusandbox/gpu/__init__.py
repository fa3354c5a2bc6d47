"""GPU discovery, selection and injection (docs/DESIGN.md, "Layers").

What an image asks of the GPU stack is read here, in the package every GPU
module loads anyway: a launch whose image asks nothing (no NVIDIA_REQUIRE_*,
no CUDA_VERSION, no CUDA runtime among its files, no NVIDIA_DISABLE_REQUIRE)
never loads the requirement check (require.py), which re-exports these."""
from gpusandbox import number, short
from gpusandbox.errors import GpuError

_TRUE = ("1", "t", "true", "y", "yes", "on")


def disabled(env):
    return str(env.get("NVIDIA_DISABLE_REQUIRE", "")).strip().lower() in _TRUE


def requirements(image_env, image_root):
    """The image's constraints as [(source, expression)].

    image_env: the sandbox's variables as the image, --env-file and -e set
    them (later rows winning).  source names where the constraint came from
    (a variable, or the file that shows the CUDA release the image carries)
    for the error message."""
    reqs = [(k, v) for k, v in sorted(image_env.items())
            if k.startswith("NVIDIA_REQUIRE_") and v.strip()]
    if "NVIDIA_REQUIRE_CUDA" in image_env:
        return reqs
    legacy = image_env.get("CUDA_VERSION", "").strip()
    if legacy:
        parts = legacy.split(".")
        major, minor = (number(parts[0]), number(parts[1])) if len(parts) >= 2 else (None, None)
        if major is None or minor is None:
            raise GpuError(f"invalid CUDA_VERSION={short(legacy)} in the image",
                           hint="set CUDA_VERSION=MAJOR.MINOR[.PATCH] in the image, "
                                "or NVIDIA_DISABLE_REQUIRE=true to skip the check")
        reqs.append((f"CUDA_VERSION={short(legacy)[1:-1]}", f"cuda>={major}.{minor}"))
        return reqs
    if image_root is not None:
        from .carried import image_cuda_version     # an image that names no CUDA release
        carried = image_cuda_version(image_root)
        if carried:
            (major, minor), where = carried
            reqs.append((f"the image's CUDA {major}.{minor} ({where})",
                         f"cuda>={major}.{minor}"))
    return reqs
