"""Loading libqlinear through cffi (ABI mode: nothing compiled), or through
ctypes where cffi is not installed (QLINEAR_FFI=cffi / ctypes forces one).

The declarations come from the library's own header, qlinear.h, read when the
package is imported, so struct layouts cannot drift from the C side; so do the
integer constants (enum values such as QL_F32 or QL_LINEAR_W8A8, #defines such
as QL_SHARED_MAX: `C.QL_F32`), which the rest of the package takes from `C`
instead of copying them. The header's version must match ql_version() of the
library that was loaded.
"""
import ctypes.util
import os
from pathlib import Path

from ._header import _cdef_source, header_constants  # noqa: F401 (re-exported)


class QlinearError(Exception):
    """A failure reported by libqlinear (its one-line message), or a missing library.

    `status` is the library's status name ("invalid argument", "format error", ...),
    or None for errors raised on the Python side."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


_HERE = Path(__file__).resolve().parent


def _installed():
    try:
        from . import _installed as inst  # written by cmake --install
    except ImportError:
        return None, None
    return Path(os.path.normpath(_HERE / inst.LIBRARY)), Path(os.path.normpath(_HERE / inst.HEADER))


def _library_candidates():
    env = os.environ.get("QLINEAR_LIBRARY")
    if env:
        return [Path(env)], True
    c = sorted(_HERE.glob("libqlinear.so*"))  # next to the package
    lib, _ = _installed()
    if lib:
        c.append(lib)
    c.append(_HERE.parent.parent / "build" / "libqlinear.so")  # a source tree's build/
    sys_lib = ctypes.util.find_library("qlinear")
    c.append(Path(sys_lib) if sys_lib else Path("libqlinear.so"))
    return c, False


def _how_to_build():
    return ("build it (cmake -S . -B build && cmake --build build: a source tree's build/ is found), "
            "install it (cmake --install build), or set QLINEAR_LIBRARY=/path/to/libqlinear.so")


def _header_candidates(lib_path):
    env = os.environ.get("QLINEAR_HEADER")
    if env:
        return [Path(env)]
    c = [_HERE / "qlinear.h"]
    _, h = _installed()
    if h:
        c.append(h)
    c.append(_HERE.parent.parent / "include" / "qlinear.h")
    if lib_path is not None and lib_path.is_absolute():
        # <prefix>/lib[/<triplet>]/libqlinear.so -> <prefix>/include/qlinear.h
        for up in (lib_path.parent.parent, lib_path.parent.parent.parent):
            c.append(up / "include" / "qlinear.h")
    c += [Path("/usr/local/include/qlinear.h"), Path("/usr/include/qlinear.h")]
    return c


class Constants:
    """The integer constants of qlinear.h by name (C.QL_F32, C.QL_SHARED_MAX)."""

    def __init__(self, header, values):
        self.__dict__.update(values)
        self._header = header

    def __getattr__(self, name):
        raise AttributeError(f"qlinear: {self._header} defines no constant {name}")


def _first_library():
    """The library load() will try first, where that is a file (for the header
    beside an install prefix's lib/): load() looks no further unless it fails."""
    cands, _ = _library_candidates()
    return next((p for p in cands if "/" in str(p) and p.exists()), None)


def _read_header():
    """(path, cdef text, Constants) of the qlinear.h the binding uses: the first
    of _header_candidates that exists. QlinearError if there is none, or if it
    cannot be read."""
    lib = _first_library()
    header = next((h for h in _header_candidates(lib) if h.is_file()), None)
    if header is None:
        looked = ("looked next to the package, in the install prefix and the source tree; "
                  "set QLINEAR_HEADER=/path/to/qlinear.h")
        if lib:
            raise QlinearError(f"qlinear: found {lib} but not its header qlinear.h ({looked})")
        raise QlinearError(f"qlinear: cannot find libqlinear's header qlinear.h ({looked}), nor the library: "
                           + _how_to_build())
    try:
        src = _cdef_source(header.read_text())
        return header, src, Constants(header, header_constants(src))
    except (OSError, UnicodeDecodeError, ValueError, IndexError) as e:
        raise QlinearError(f"qlinear: cannot read the declarations of {header}: {e}") from e


_HEADER, _CDEF, C = _read_header()
_state = {}


def _new_ffi():
    """(an FFI, its name): cffi's, else the ctypes one (QLINEAR_FFI picks)."""
    want = os.environ.get("QLINEAR_FFI", "")
    if want not in ("", "cffi", "ctypes"):
        raise QlinearError(f"qlinear: QLINEAR_FFI={want!r} is not 'cffi' or 'ctypes'")
    if want != "ctypes":
        try:
            import cffi
            return cffi.FFI(), "cffi"
        except ImportError as e:
            if want == "cffi":
                raise QlinearError(f"qlinear: QLINEAR_FFI=cffi but cffi cannot be imported ({e})") from e
    from ._ctypes_ffi import FFI
    return FFI(), "ctypes"


def load():
    """(ffi, lib), loaded once per process. QlinearError if not found."""
    if "lib" in _state:
        return _state["ffi"], _state["lib"]
    cands, from_env = _library_candidates()
    tried, lib_path, handle_errors = [], None, []
    ffi, ffi_name = _new_ffi()
    for p in cands:
        tried.append(str(p))
        if p.is_absolute() or "/" in str(p):
            if not p.exists():
                continue
        try:
            ctypes.CDLL(str(p))  # probe (raises OSError with the loader's reason)
        except OSError as e:
            handle_errors.append(f"{p}: {e}")
            continue
        lib_path = p
        break
    if lib_path is None:
        why = "; ".join(handle_errors)
        where = "QLINEAR_LIBRARY=" + tried[0] if from_env else "tried " + ", ".join(tried)
        raise QlinearError(f"qlinear: cannot load libqlinear ({where}{'; ' + why if why else ''}): {_how_to_build()}")
    header = _HEADER  # read on import: the constants in C come from the same text
    try:
        ffi.cdef(_CDEF)
    except Exception as e:  # pycparser / cffi errors have no common base
        raise QlinearError(f"qlinear: cannot read the declarations of {header}: {e}") from e
    lib = ffi.dlopen(str(lib_path))
    want = ".".join(str(getattr(lib, "QL_VERSION_" + p)) for p in ("MAJOR", "MINOR", "PATCH"))
    have = ffi.string(lib.ql_version()).decode()
    if have != want:
        raise QlinearError(f"qlinear: {lib_path} is version {have} but {header} is {want}; point "
                           "QLINEAR_LIBRARY and QLINEAR_HEADER at one build")
    resolved = lib_path
    if not lib_path.is_absolute():
        resolved = _loaded_path(lib_path.name) or lib_path
    _state.update(ffi=ffi, lib=lib, path=str(resolved), header=str(header), ffi_name=ffi_name)
    return ffi, lib


def _loaded_path(name):
    """The absolute path the dynamic loader picked for a bare soname."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if os.path.basename(p).startswith("libqlinear.so"):
                    return p
    except OSError:
        pass
    return None


def library_path():
    """Absolute path of the libqlinear that was loaded."""
    load()
    return _state["path"]


def ffi_name():
    """"cffi" or "ctypes": how libqlinear is called."""
    load()
    return _state["ffi_name"]


def version():
    """Version of the loaded libqlinear ("MAJOR.MINOR.PATCH")."""
    ffi, lib = load()
    return ffi.string(lib.ql_version()).decode()


def fast_fn(name, signature):
    """lib.<name> cast to `signature` (pointers declared uintptr_t, which every
    ABI cffi runs on passes as it passes a pointer: callers pass torch's
    data_ptr() integers, no ffi.cast per call); made once per process."""
    if name not in _fast_fns:
        ffi, lib = load()
        _fast_fns[name] = ffi.cast(signature, getattr(lib, name))
    return _fast_fns[name]


_fast_fns = {}


def check(status, what=""):
    """Raise QlinearError with the library's message when status != QL_OK (0:
    the fast paths test a status for truth, as C callers do)."""
    if status != C.QL_OK:
        ffi, lib = _state["ffi"], _state["lib"]
        msg = ffi.string(lib.ql_last_error()).decode("utf-8", "replace")
        name = ffi.string(lib.ql_status_string(status)).decode()
        raise QlinearError(msg or f"{what}: {name}", name)
