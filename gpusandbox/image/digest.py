"""Content digests as untrusted input.

A digest comes from a manifest, an index, a registry header or a file name
in an archive: all image-controlled.  It is used as a file name in the
store, so it must be exactly `sha256:` + 64 lowercase hex digits (or
`sha512:` + 128) before anything else looks at it: `sha256:../x`, a wrong
length or upper case are refused, never normalised."""
from ..errors import SandboxError

ALGORITHMS = {"sha256": 64, "sha512": 128}
_HEX = frozenset("0123456789abcdef")


class ImageError(SandboxError):
    """An image, layer, manifest, registry or store failure (exit 125)."""


def parse(text, what="digest"):
    """(algorithm, hex) of a digest string, or ImageError."""
    if not isinstance(text, str):
        raise ImageError(f"invalid {what}", f"not a string: {type(text).__name__}")
    alg, sep, hexpart = text.partition(":")
    want = ALGORITHMS.get(alg)
    if not sep or want is None or len(hexpart) != want or not _HEX.issuperset(hexpart):
        raise ImageError(f"invalid {what} {text[:80]!r}",
                         "expected sha256: followed by 64 lowercase hex digits")
    return alg, hexpart


def validate(text, what="digest"):
    parse(text, what)
    return text


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
