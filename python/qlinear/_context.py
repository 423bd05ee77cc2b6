"""ql_context: where layers run (a CPU thread count and ISA, or a CUDA device
and stream), device strings, and the contexts layers share by default."""
import sys

from ._lib import C, QlinearError, check, load


def parse_device(device):
    """"cpu" or "cuda:N" from None, "cpu", "cuda", "cuda:N" or a torch.device
    ("cuda" alone: torch's current device when torch is loaded, else 0)."""
    if device is None:
        return "cpu"
    s = str(device)
    if s == "cpu":
        return s
    if s == "cuda" or (s.startswith("cuda:") and s[5:].isdigit()):
        if s == "cuda":
            torch = sys.modules.get("torch")
            idx = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
            return f"cuda:{idx}"
        return s
    raise QlinearError(f"qlinear: device {device!r} is not 'cpu', 'cuda' or 'cuda:N'", "invalid argument")


class Context:
    """A ql_context: thread count and ISA, or a CUDA device and the stream its
    calls are queued on. The context outlives its linears."""

    def __init__(self, threads=None, device="cpu"):
        ffi, lib = load()
        p = ffi.new("ql_context **")
        check(lib.ql_context_create(p), "ql_context_create")
        self._ffi, self._lib = ffi, lib
        self.ptr = ffi.gc(p[0], lib.ql_context_destroy)
        self.threads = lib.ql_context_threads(self.ptr)
        self.device, self.stream, self.torch_stream = device, None, None
        if device != "cpu":
            check(lib.ql_context_set_device(self.ptr, C.QL_DEVICE_CUDA, int(device[5:])), "ql_context_set_device")
        if threads is not None:
            self.set_threads(threads)

    def use_stream(self, stream):
        """Queue this context's next calls on `stream` (a cudaStream_t as an int; 0: the default stream)."""
        if stream != self.stream:
            # a cast, not the int or None: cffi takes no int (nor None) for a void *; the ctypes binding takes both
            check(self._lib.ql_context_set_cuda_stream(self.ptr, self._ffi.cast("void *", stream or 0)),
                  "ql_context_set_cuda_stream")
            self.stream = stream

    def set_threads(self, threads):
        if not isinstance(threads, int) or isinstance(threads, bool):
            raise TypeError(f"qlinear: threads must be an int, not {type(threads).__name__}")
        check(self._lib.ql_context_set_threads(self.ptr, threads), "ql_context_set_threads")
        self.threads = threads

    @property
    def isa(self):
        ffi, lib = load()
        return ffi.string(lib.ql_isa_name(lib.ql_context_isa(self.ptr))).decode()


_default_ctx = None
_device_ctx = {}  # "cuda:N" -> the context every layer on that device shares


def default_context(device="cpu"):
    """The context layers on `device` share unless given their own, made on
    first use (the CPU's threads: the library's default, QLINEAR_THREADS or
    every online CPU)."""
    global _default_ctx
    if device != "cpu":
        if device not in _device_ctx:
            _device_ctx[device] = Context(device=device)
        return _device_ctx[device]
    if _default_ctx is None:
        _default_ctx = Context()
    return _default_ctx


def is_default_cpu_context(ctx):
    """Whether `ctx` is the CPU's shared default context."""
    return ctx is _default_ctx
