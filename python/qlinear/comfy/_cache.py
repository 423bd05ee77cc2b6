"""The packed-weight cache of the comfy-kitchen backend.

comfy-kitchen hands a backend raw tensors on every call (there is no
"prepare" hook), so the backend packs a weight once and finds the packed
layer again by the weight tensor: an entry is keyed by id(weight) and holds a
weak reference to it (its finalizer evicts the entry, so a freed weight
leaves nothing behind and an id reused by a new tensor cannot hit), its data
pointer, shape, strides and `_version` (bumped by an in-place `copy_`, as
ComfyUI's LoRA patching does), and the values of the small tensors that are
part of the layer (scales, codebook, ...), compared by identity first and by
value when the caller passes a fresh copy. Entries are created under a lock
(two threads on one new weight pack it once); lookups take no lock.

Memory: an entry holds the packed layer (qlinear.Linear.weight_bytes), which
is a copy — the caller's tensor stays resident in ComfyUI. `limit_bytes`
(QLINEAR_COMFY_CACHE_MB) bounds the packed bytes: past it the least recently
used entries are dropped (and packed again when their weight returns).
"""
import os
import threading
import weakref
from collections import OrderedDict


class _Entry:
    __slots__ = ("key", "ref", "ptr", "shape", "stride", "version", "extra", "parts", "layer", "bytes", "failed",
                 "bias_memo", "plan")


def _part_sig(t):
    """What identifies a small tensor of the layer cheaply: (object, version)."""
    return (t, t._version) if t is not None else (None, 0)


def _same(e, weight, extra):
    """Entry e (or None) is this weight, unchanged since it was packed, for this call's extra key."""
    return (e is not None and e.ref() is weight and e.version == weight._version and e.extra == extra
            and e.ptr == weight.data_ptr())


class WeightCache:
    def __init__(self, limit_bytes=None):
        if limit_bytes is None:
            mb = os.environ.get("QLINEAR_COMFY_CACHE_MB")
            limit_bytes = int(float(mb) * 2**20) if mb else 0
        self.limit_bytes = limit_bytes  # 0: no limit beyond the weights' own lifetimes
        self._d = OrderedDict()  # id(weight) -> _Entry, least recently used first
        self._lock = threading.RLock()  # re-entrant: a finalizer may run inside get()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self):
        return len(self._d)

    def stats(self):
        return {"entries": len(self._d), "packed_bytes": self.bytes, "limit_bytes": self.limit_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}

    def clear(self):
        with self._lock:
            self._d.clear()
            self.bytes = 0

    def get(self, weight, extra, parts, make):
        """The layer packed from `weight` with the call's `extra` key (a tuple
        of plain values: ConvRot group, ...) and `parts` (the small tensors
        that go into the layer, compared by identity, then by value). make()
        packs it on a miss; a QlinearError from make() is remembered (the
        entry then says failed, and the caller declines) until the weight
        changes."""
        e = self._d.get(id(weight))
        if _same(e, weight, extra) and self._parts_match(e, parts):
            self.hits += 1
            if self.limit_bytes:
                self._touch(e)
            return e
        with self._lock:
            e = self._d.get(id(weight))
            if _same(e, weight, extra) and e.shape == weight.shape and self._parts_match(e, parts):
                self.hits += 1
                return e
            self.misses += 1
            if e is not None:
                self._drop(e)
            e = _Entry()
            e.key = id(weight)
            e.ref = weakref.ref(weight, self._finalizer(e.key))
            e.ptr, e.shape, e.stride, e.version = weight.data_ptr(), weight.shape, weight.stride(), weight._version
            e.extra = extra
            e.parts = [(_part_sig(t), None if t is None else t.detach().clone()) for t in parts]
            e.layer, e.failed, e.bias_memo, e.plan = None, None, None, None
            try:
                e.layer = make()
                e.bytes = e.layer.weight_bytes
            except Exception as err:  # remembered: the call declines to eager until the weight changes
                e.failed, e.bytes = err, 0
            self._d[e.key] = e
            self.bytes += e.bytes
            self._shrink()
            return e

    def hit(self, weight, extra, part):
        """get()'s hit for a layer of one small part, found without building
        the call's make() (the common call: the same weight and scale
        tensors); None where get() must decide."""
        e = self._d.get(id(weight))
        if not _same(e, weight, extra) or len(e.parts) != 1:
            return None
        sig = e.parts[0][0]
        if sig[0] is not part or sig[1] != part._version:
            return None
        self.hits += 1
        if self.limit_bytes:
            self._touch(e)
        return e

    def _parts_match(self, e, parts):
        for (sig, copy), t in zip(e.parts, parts):
            if t is None:
                if sig[0] is not None:
                    return False
                continue
            if sig[0] is t and sig[1] == t._version:
                continue
            # a fresh tensor (ComfyUI clones scales when relabelling dtypes): compare values
            if copy is None or copy.shape != t.shape or copy.dtype != t.dtype or not bool((copy == t).all()):
                return False
        return True

    def _touch(self, e):
        with self._lock:
            if self._d.get(e.key) is e:
                self._d.move_to_end(e.key)

    def _shrink(self):
        while self.limit_bytes and self.bytes > self.limit_bytes and len(self._d) > 1:
            _, old = self._d.popitem(last=False)
            self.bytes -= old.bytes
            self.evictions += 1

    def _drop(self, e):
        if self._d.get(e.key) is e:
            del self._d[e.key]
            self.bytes -= e.bytes

    def _finalizer(self, key):
        wself = weakref.ref(self)

        def evict(ref):
            cache = wself()
            if cache is None:
                return
            with cache._lock:
                e = cache._d.get(key)
                if e is not None and e.ref is ref:
                    cache._drop(e)
        return evict
