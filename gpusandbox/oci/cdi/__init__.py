"""CDI (Container Device Interface) specs out and in.

API for the other front doors (OCI hook, runtime wrapper, OCI runtime):

  resolve(names, spec_dirs=None, rootfd=None, environ=None) -> apply.Result
      Qualified names ("nvidia.com/gpu=0") -> .edits (ContainerEdits, in the
      reference's order: spec edits, then each device's), .rules (device
      filter rules), .warnings (lines without "gpusandbox: ").  Specs come
      from spec_dirs (lowest priority first), default
      registry.spec_dirs(environ): $GPUSANDBOX_CDI_SPEC_DIRS or /etc/cdi,
      /var/run/cdi.  rootfd (the image root, fd or path) is needed for the
      native update-ldcache / enable-cuda-compat hooks; without it hooks are
      only collected.  Raises SandboxError (unknown or conflicting device,
      stale node, bad spec).
  generate(driver_root="/", dev_root=None, vendor="nvidia.com", cls="gpu",
           strategies=("index", "uuid"), caps=None, cdi_version=None,
           hook_path=None) -> dict
      A spec for this host's GPUs from gpu/inject.plan(), cdiVersion the
      lowest its content needs.  produce.dump(doc, "json"|"yaml") and
      produce.write(doc, path_or_dir, fmt) serialise it (atomic, 0644).
  spec.parse(bytes, name) -> (doc, lowest version); spec.validate(doc)
      Strict parsing (unknown fields are errors) and the version rules.
  registry.Registry(dirs), registry.parse_name(text)
      The specs of a set of directories: .devices, .conflicts, .errors, .lookup().

Modules: spec (model, strict parser, versions), registry (spec directories),
apply (spec -> ContainerEdits), hooks (NVIDIA's hook commands done natively),
produce (the producer), cli (`gpusandbox cdi generate|list|check`).
Nothing here is imported by a `run` without a CDI device.
"""


def resolve(names, spec_dirs=None, rootfd=None, environ=None):
    from gpusandbox.oci.cdi.apply import resolve as _resolve
    return _resolve(names, spec_dirs=spec_dirs, rootfd=rootfd, environ=environ)


def generate(*args, **kw):
    from gpusandbox.oci.cdi.produce import generate as _generate
    return _generate(*args, **kw)
