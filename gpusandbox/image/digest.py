"""Content digests as untrusted input: the check itself (parse, validate)
is the package's (gpusandbox/image/__init__.py, which says why a digest is
refused rather than normalised), re-exported here under these names;
hashing and the streaming verifier are here."""
from . import ALGORITHMS, ImageError  # noqa: F401
from . import parse_digest as parse, validate_digest as validate


def hasher(text):
    """A hashlib object for the algorithm of `text` (validated).  hashlib is
    imported here, not above: `run` of a cached image validates digests but
    hashes nothing, and _hashlib (OpenSSL) costs ~3 ms to load."""
    import hashlib
    alg, _ = parse(text)
    return hashlib.new(alg)


class Verifier:
    """Counts and hashes bytes as they stream by; check() compares both
    with the descriptor (never read past its size: callers stop at
    `remaining`)."""

    def __init__(self, digest, size):
        self.digest = validate(digest)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ImageError(f"invalid size {size!r} for blob {digest}")
        self.size = size
        self.seen = 0
        self._h = hasher(digest)

    @property
    def remaining(self):
        return self.size - self.seen

    def update(self, data):
        self.seen += len(data)
        if self.seen > self.size:
            raise ImageError(f"blob {self.digest} is larger than its descriptor says",
                             f"more than {self.size} bytes")
        self._h.update(data)

    def check(self):
        if self.seen != self.size:
            raise ImageError(f"blob {self.digest} is truncated",
                             f"{self.seen} of {self.size} bytes")
        got = f"{self.digest.partition(':')[0]}:{self._h.hexdigest()}"
        if got != self.digest:
            raise ImageError(f"blob {self.digest} does not match its digest", f"got {got}")
