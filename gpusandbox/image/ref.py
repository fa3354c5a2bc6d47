"""Image references, as containers-transports(5) spells them: the grammar
is the package's (gpusandbox/image/__init__.py, loaded by a cached `run`
without one more module), re-exported here under these names."""
from . import (DEFAULT_HOST, DEFAULT_TAG, MAX_NAME, MAX_REF, TRANSPORTS,  # noqa: F401
               ImageError, ImageRef, _bad, _component_ok, _host_ok, _ipv6_ok, _label_ok,
               _path_and_tag, _tag_ok, looks_like_transport, parse_name)
from . import parse_ref as parse  # noqa: F401
