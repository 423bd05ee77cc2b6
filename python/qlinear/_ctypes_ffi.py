"""The part of cffi's ABI mode that qlinear uses, over ctypes (standard library).

Used where cffi is not installed (e.g. a CUDA machine's own Python) or when
QLINEAR_FFI=ctypes. Declarations come from the same cdef text as for cffi
(qlinear.h reduced by _header._cdef_source), so struct layouts are read from the
header, not written twice. Every pointer is a plain address (int, or None for
NULL) in both directions; `new` returns what cffi's would be used as:
structs as ctypes Structures (passed by reference), `T **` as a box indexed
with [0], `char[]` as a buffer. A call through ctypes costs a few µs more than
through cffi; nothing else differs.
"""
import ctypes
import re

from ._header import header_constants  # the values _lib.C holds, read the same way

_SCALARS = {
    "void": None, "char": ctypes.c_char, "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint, "long": ctypes.c_long,
    "double": ctypes.c_double, "float": ctypes.c_float, "size_t": ctypes.c_size_t,
    "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "uintptr_t": ctypes.c_size_t,
}


# Every pointer parameter is a c_void_p: ctypes converts in C what it is given
# (an address, None, bytes, an array, or _as_parameter_: the boxes below and
# structs pass their address), with no Python code per argument.
_Ptr = ctypes.c_void_p


def _address(v):
    """The address a struct field of pointer type is set to."""
    if v is None or isinstance(v, int):
        return v
    p = getattr(v, "_as_parameter_", None)
    if p is not None:
        return _address(p)
    if isinstance(v, ctypes.c_void_p):
        return v.value
    if isinstance(v, ctypes._Pointer):
        return ctypes.cast(v, ctypes.c_void_p).value
    if isinstance(v, (ctypes.Structure, ctypes.Array)):
        return ctypes.addressof(v)
    raise TypeError(f"qlinear (ctypes): cannot store {type(v).__name__} as a pointer")


class _Struct(ctypes.Structure):
    """Passed by address. Pointer fields are set from addresses (or anything
    _address takes); those to numbers are typed, so that they can be indexed
    (t.shape[j])."""
    _ptr_fields = {}

    @property
    def _as_parameter_(self):
        return ctypes.byref(self)

    def __setattr__(self, name, value):
        t = self._ptr_fields.get(name, 0)
        if t != 0:
            value = _address(value)
            if t is not None and value is not None:
                value = ctypes.cast(value, t)
        super().__setattr__(name, value)


class _Box:
    """ffi.new("T **") / ("char **"): storage for one pointer, passed by address."""

    def __init__(self):
        self._v = ctypes.c_void_p()
        self._as_parameter_ = ctypes.byref(self._v)

    def __getitem__(self, i):
        if i != 0:
            raise IndexError(i)
        return self._v.value


class _Owned:
    """ffi.gc(pointer, destructor): the destructor runs when this is collected."""

    def __init__(self, ptr, destructor):
        self.value, self._destructor = ptr, destructor
        self._as_parameter_ = ctypes.c_void_p(ptr)

    def __del__(self):
        if self.value is not None and self._destructor is not None:
            try:
                self._destructor(self.value)
            except Exception:  # at interpreter exit ctypes may already be torn down; the process frees it
                pass
            self.value = None


def _norm(t):
    return " ".join(t.replace("const", " ").split())


class FFI:
    NULL = None

    def __init__(self):
        self._types = dict(_SCALARS)
        self._opaque = set()
        self._consts = {}
        self._funcs = {}

    # -- declarations
    def cdef(self, src):
        self._consts.update(header_constants(src))
        src = re.sub(r"#[^\n]*", "", src)
        # opaque types first: a struct may hold a pointer to one declared before it
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", src):
            self._opaque.add(m.group(2))
            self._types.setdefault(m.group(2), None)
        pos = 0
        block = re.compile(r"typedef\s+(struct|enum|union)\s*(\w*)\s*\{(.*?)\}\s*(\w+)\s*;", re.S)
        rest = []
        for m in block.finditer(src):
            rest.append(src[pos:m.start()])
            pos = m.end()
            kind, body, name = m.group(1), m.group(3), m.group(4)
            if kind == "enum":
                self._types[name] = ctypes.c_int  # its values: header_constants
            else:
                self._struct(kind, name, body)
        rest.append(src[pos:])
        for decl in "".join(rest).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            m = re.match(r"typedef\s+struct\s+(\w+)\s+(\w+)$", decl)
            if m:
                self._opaque.add(m.group(2))
                continue
            m = re.match(r"(.+?)\b(\w+)\s*\((.*)\)$", decl)
            if not m:
                raise ValueError(f"qlinear (ctypes): cannot read the declaration '{decl}'")
            ret, name, params = m.groups()
            self._funcs[name] = (self._ctype(ret), [self._param(p) for p in self._split(params)])

    @staticmethod
    def _split(params):
        params = params.strip()
        return [] if params in ("", "void") else [p.strip() for p in params.split(",")]

    def _struct(self, kind, name, body):
        fields, ptrs = [], {}
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            m = re.match(r".*\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", decl)  # function pointer
            if m:
                fields.append((m.group(1), ctypes.c_void_p))
                ptrs[m.group(1)] = None
                continue
            m = re.match(r"((?:const\s+)?(?:unsigned\s+|signed\s+)?\w+)\s+(.*)$", decl)
            base = _norm(m.group(1))
            for d in m.group(2).split(","):
                d = d.strip()
                stars, d = d.count("*"), d.replace("*", "").strip()
                arr = re.match(r"(\w+)\s*\[(\d+)\]$", d)
                fname = arr.group(1) if arr else d
                t = self._types[base]
                if stars:  # typed when it points to numbers; an address otherwise
                    typed = stars == 1 and t not in (None, ctypes.c_char) and issubclass(t, ctypes._SimpleCData)
                    t = ctypes.POINTER(t) if typed else ctypes.c_void_p
                    ptrs[fname] = t if typed else None
                if arr:
                    t = t * int(arr.group(2))
                fields.append((fname, t))
        base_cls = _Struct if kind == "struct" else ctypes.Union
        self._types[name] = type(name, (base_cls,), {"_fields_": fields, "_ptr_fields": ptrs})

    def _ctype(self, decl):
        """ctypes type of a return or parameter type (no name)."""
        if "*" in decl or "[" in decl:
            return _Ptr
        t = _norm(decl)
        if t in self._opaque:
            raise ValueError(f"qlinear (ctypes): opaque type {t} by value")
        return self._types[t]

    def _param(self, p):
        p = _norm(p)
        if "*" in p or "[" in p:
            return _Ptr
        parts = p.split()
        t = " ".join(parts[:-1]) if len(parts) > 1 and " ".join(parts[:-1]) in self._types else p
        return self._types[t]

    def dlopen(self, path):
        return _Lib(ctypes.CDLL(path), self)

    # -- values
    def new(self, decl, init=None):
        d = _norm(decl)
        if d.endswith("**"):
            return _Box()
        if d in ("char[]", "char []"):
            return ctypes.create_string_buffer(init)
        if d.endswith("*"):
            t = self._types[d[:-1].strip()]
            return t()
        raise ValueError(f"qlinear (ctypes): ffi.new('{decl}') is not supported")

    def cast(self, decl, value):
        if "(" in decl:  # a function pointer type: ctypes' pointer parameters already take integers
            return value
        return _address(value)

    @staticmethod
    def string(p):
        if isinstance(p, bytes):
            return p
        if isinstance(p, ctypes.Array):
            return p.value
        p = _address(p)
        if not p:
            raise RuntimeError("qlinear (ctypes): string of a NULL pointer")
        return ctypes.string_at(p)

    @staticmethod
    def gc(ptr, destructor):
        return _Owned(ptr, destructor)

    @staticmethod
    def buffer(p, size):
        return (ctypes.c_char * size).from_address(_address(p)) if size else b""

    @staticmethod
    def from_buffer(obj):
        ai = getattr(obj, "__array_interface__", None)
        if ai is not None:
            return ai["data"][0]
        return ctypes.addressof(ctypes.c_char.from_buffer(obj))


class _Lib:
    def __init__(self, dll, ffi):
        self._dll, self._ffi = dll, ffi

    def __getattr__(self, name):
        ffi = self._ffi
        if name in ffi._consts:
            v = ffi._consts[name]
        elif name in ffi._funcs:
            restype, argtypes = ffi._funcs[name]
            v = getattr(self._dll, name)
            v.restype = ctypes.c_void_p if restype is _Ptr else restype
            v.argtypes = argtypes
        else:
            raise AttributeError(f"libqlinear has no '{name}'")
        setattr(self, name, v)
        return v
