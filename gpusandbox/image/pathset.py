"""A compact set of member paths for the layer applier (unpack.py), which
records every path a layer creates or descends through: a layer of 10^6
entries is real (conda and source trees), and a Python set of per-path
objects costs about 100 bytes an entry (the key object plus its slot).

Here a path is its 64-bit keyed BLAKE2b hash, kept in one open-addressing
table (array of unsigned 64-bit slots, linear probing, at most half full):
8 to 16 bytes a slot, 16 to 32 bytes an entry, whatever the names' length.
The hash key is random per set, so a layer cannot be built to make two of
its paths collide; by chance, two paths of a 10^6-entry layer share a hash
with probability about 3e-8, and the worst a collision does is treat a lower
layer's path as this layer's (a whiteout or opaque marker then keeps it, a
hard link to it is allowed, still beneath the root and to a regular file)."""
import hashlib
import os
from array import array

_MIN = 1 << 12


class PathSet:
    __slots__ = ("_key", "_slots", "_mask", "_n")

    def __init__(self):
        self._key = os.urandom(16)
        self._slots = array("Q", bytes(8 * _MIN))
        self._mask = _MIN - 1
        self._n = 0

    def _hash(self, path):
        h = int.from_bytes(hashlib.blake2b(path, digest_size=8, key=self._key).digest(),
                           "little")
        return h or 1                    # 0 marks an empty slot

    def __len__(self):
        return self._n

    def __contains__(self, path):
        h = self._hash(path)
        slots, mask = self._slots, self._mask
        i = h & mask
        while True:
            v = slots[i]
            if v == h:
                return True
            if not v:
                return False
            i = (i + 1) & mask

    def add(self, path):
        """Add `path`; True when it was not there."""
        h = self._hash(path)
        if not self._put(self._slots, self._mask, h):
            return False
        self._n += 1
        if 2 * self._n > len(self._slots):
            self._grow()
        return True

    @staticmethod
    def _put(slots, mask, h):
        i = h & mask
        while True:
            v = slots[i]
            if v == h:
                return False
            if not v:
                slots[i] = h
                return True
            i = (i + 1) & mask

    def _grow(self):
        size = 2 * len(self._slots)
        new = array("Q", bytes(8 * size))
        mask = size - 1
        for v in self._slots:
            if v:
                self._put(new, mask, v)
        self._slots, self._mask = new, mask

    def nbytes(self):
        """Bytes of the table (tests, the benchmark)."""
        return self._slots.itemsize * len(self._slots)
