"""DLPack arrays of any dtype, shape, strides and device, without a framework (ctypes only).

The CPU tests use them to reach every argument check of the ops, bfloat16 arrays included (NumPy
has no bfloat16) and arrays that claim to live on a CUDA device. A host array owns a real ctypes
buffer; an array on any other device gets an aligned fake address that is never dereferenced: the
ops check descriptors only and refuse before any launch, which is exactly what these tests probe.
Never pass an all-valid stub "CUDA" array to an op on a machine with a GPU.
"""

import ctypes

KDL_CPU = 1
KDL_CUDA = 2

_CODES = {"int": 0, "uint": 1, "float": 2, "bfloat": 4}
DTYPES = {
    "bfloat16": (_CODES["bfloat"], 16),
    "float16": (_CODES["float"], 16),
    "float32": (_CODES["float"], 32),
    "float64": (_CODES["float"], 64),
    "int8": (_CODES["int"], 8),
    "int32": (_CODES["int"], 32),
    "int64": (_CODES["int"], 64),
    "uint8": (_CODES["uint"], 8),
    "uint32": (_CODES["uint"], 32),
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = ctypes.c_char_p(b"dltensor")


_next_fake = [0]


def _fake_address():
    """Distinct, 4 GiB-apart, 4096-aligned fake device addresses (so bound stubs never overlap)."""
    _next_fake[0] += 1
    return 0x7F0000000000 + (_next_fake[0] % 200) * (1 << 32)


class StubArray:
    """A DLPack array. ``strides`` in elements (default: C-contiguous); ``device=("cuda", 0)`` makes a
    fake device array (each at its own address); ``misalign`` adds that many bytes to the address.
    ``base`` with ``offset_bytes``: a stub "device" view into another stub's memory (to make overlaps)."""

    def __init__(self, shape, dtype="float32", strides=None, device=("cpu", 0), misalign=0, base=None,
                 offset_bytes=0):
        self.shape = tuple(int(s) for s in shape)
        code, bits = DTYPES[dtype]
        self.dtype = dtype
        if strides is None:
            strides, acc = [], 1
            for s in reversed(self.shape):
                strides.insert(0, acc)
                acc *= max(s, 1)
        self.strides = tuple(int(s) for s in strides)
        extent = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0)
        nbytes = max(extent, 1) * bits // 8 + 64 + misalign
        kind, index = device
        self.device = (KDL_CPU if kind == "cpu" else KDL_CUDA, int(index))
        if self.device[0] == KDL_CPU:
            self._buffer = ctypes.create_string_buffer(nbytes + 256)
            start = ctypes.addressof(self._buffer)
            address = (start + 255) // 256 * 256 + misalign
        elif base is not None:
            self._buffer = None
            address = base._managed.dl_tensor.data + offset_bytes
        else:
            self._buffer = None
            address = _fake_address() + misalign  # never dereferenced
        self._shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        self._strides = (ctypes.c_int64 * max(len(self.shape), 1))(*self.strides)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = address
        t.device = _Device(*self.device)
        t.ndim = len(self.shape)
        t.dtype = _DataType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0
        self._managed.deleter = None  # the buffers belong to this object

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _PyCapsule_New(ctypes.addressof(self._managed), _CAPSULE_NAME, None)

    def __dlpack_device__(self):
        return self.device

    def __repr__(self):
        return f"StubArray({self.shape}, {self.dtype}, strides={self.strides}, device={self.device})"


def cpu(shape, dtype="float32", **kw):
    return StubArray(shape, dtype, **kw)


def cuda(shape, dtype="float32", **kw):
    return StubArray(shape, dtype, device=("cuda", 0), **kw)
