"""A strict array namespace for the tests: arrays that are not NumPy's and refuse to be mixed with it.

The model math must take its module from its arrays (minillm/backend.py). A test that runs it on
these arrays proves that: any `np.something(x)` left in the code, any NumPy array mixed into an
operation, any implicit conversion to NumPy raises TypeError, as CuPy does on a GPU. What they
accept is the ground NumPy and CuPy share (array methods, `out=`, integer-array indexing, `take`,
`einsum`, `.nbytes`), not the narrower array-API standard: `array_api_strict` (installed) has no
`.reshape`/`.transpose` methods, no `out=`, no integer-array writes, `take` with 1-D indices only,
no `.nbytes` — and it lets `np.exp(x)` and `np.asarray(x)` through silently, so it cannot show
that an operation took its module from its arrays.

    xp = strict                                  # the namespace
    x = strict.asarray(np.ones((2, 3)))          # the one way in (like cupy.asarray: a host -> device copy)
    x.get()                                      # the one way out (like cupy.ndarray.get)
    with strict.capturing(): step()              # any host read of a value inside raises, as in a graph capture

Underneath, each array holds a NumPy array; views stay views, so in-place writes through a slice
or a reshape reach the array they came from, as on NumPy and CuPy.
"""

from __future__ import annotations

import operator
from contextlib import contextmanager

import numpy as np

_capturing = [False]     # inside `strict.capturing()`: reading a value back to the host is refused


def _host_read(what: str) -> None:
    if _capturing[0]:
        raise RuntimeError(f"{what} of a device value inside a graph capture: a CUDA graph cannot wait for the "
                           "host; keep the value on the device, or read it before the capture")

_SCALARS = (int, float, bool, np.generic)   # host scalars CuPy accepts in arithmetic


def _refuse(what: str):
    raise TypeError(f"a NumPy array in an operation on strict arrays ({what}): take the module from the "
                    "arrays (backend.namespace) and move host data over with xp.asarray")


def _in(x, what: str = "an argument"):
    """An operand: a strict array's NumPy array, or a host scalar; a NumPy array is refused."""
    if isinstance(x, StrictArray):
        return x._a
    if isinstance(x, np.ndarray):
        _refuse(what)
    if isinstance(x, (list, tuple)):
        return type(x)(_in(v, what) for v in x)
    return x


def _index(key):
    """An index: ints, slices, None, Ellipsis, strict arrays, and lists of ints (CuPy takes those too)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, StrictArray):
        return key._a
    if isinstance(key, np.ndarray):
        _refuse("an index")
    return key


def _out(x):
    """A result as a strict array; a NumPy scalar becomes a 0-d array, as CuPy returns them."""
    if isinstance(x, np.generic):
        return StrictArray(np.asarray(x))
    return StrictArray(x) if isinstance(x, np.ndarray) else x


class StrictArray:
    """One array of the strict namespace (see the module's docstring)."""

    __slots__ = ("_a",)
    __array_ufunc__ = None          # np.exp(x), np_array + x: NumPy gives up, TypeError

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    # refused: every implicit way into NumPy
    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a strict array to NumPy refused (CuPy refuses it too): "
                        "use backend.to_host(x)")

    def __array_function__(self, func, types, args, kwargs):
        return NotImplemented       # np.concatenate([x]), np.take(x, ...): TypeError

    def __array_namespace__(self, api_version=None):
        return strict

    def get(self) -> np.ndarray:
        """A NumPy copy (cupy.ndarray.get): the one way out."""
        _host_read("get()")
        return self._a.copy()

    # what the meter and the shapes read
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    T = property(lambda self: StrictArray(self._a.T))

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"strict({self._a!r})"

    # methods NumPy and CuPy arrays share
    def reshape(self, *shape):
        return StrictArray(self._a.reshape(*shape))

    def transpose(self, *axes):
        return StrictArray(self._a.transpose(*axes))

    def astype(self, dtype, copy=True):
        return StrictArray(self._a.astype(dtype, copy=copy))

    def copy(self):
        return StrictArray(self._a.copy())

    def max(self, axis=None, keepdims=False):
        return _out(self._a.max(axis=axis, keepdims=keepdims))

    def sum(self, axis=None, keepdims=False, dtype=None):
        return _out(self._a.sum(axis=axis, keepdims=keepdims, dtype=dtype))

    def any(self):
        return _out(self._a.any())

    # a 0-d or one-element array to a host number: allowed, as in CuPy (it waits for the device)
    def __int__(self) -> int:
        _host_read("int()")
        return int(self._a)

    def __float__(self) -> float:
        _host_read("float()")
        return float(self._a)

    def __index__(self) -> int:
        _host_read("an index")
        return operator.index(self._a.item()) if self._a.ndim == 0 else operator.index(self._a)

    def __bool__(self) -> bool:
        _host_read("bool()")
        return bool(self._a)

    # indexing: reads give views or gathers; writes go into this array
    def __getitem__(self, key):
        return _out(self._a[_index(key)])

    def __setitem__(self, key, value) -> None:
        self._a[_index(key)] = _in(value, "a value written into a strict array")


def _accepts(other, name: str, kinds) -> bool:
    """Is `other` an operand of `kinds`? A NumPy array is refused outright; anything else is left to Python."""
    if isinstance(other, kinds):
        return True
    if isinstance(other, np.ndarray):
        _refuse(f"operator {name}")
    return False


def _binary(name: str):
    f = getattr(operator, name)

    def op(self, other):
        return _out(f(self._a, _in(other))) if _accepts(other, name, (StrictArray, *_SCALARS)) else NotImplemented

    def rop(self, other):
        return _out(f(other, self._a)) if _accepts(other, name, _SCALARS) else NotImplemented

    return op, rop


def _inplace(name: str):
    f = getattr(operator, name)

    def op(self, other):
        if not _accepts(other, name, (StrictArray, *_SCALARS)):
            return NotImplemented
        f(self._a, _in(other))
        return self

    return op


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_"):
    _op, _rop = _binary(_name)
    _dunder = _name.rstrip("_")
    setattr(StrictArray, f"__{_dunder}__", _op)
    setattr(StrictArray, f"__r{_dunder}__", _rop)
for _name in ("iadd", "isub", "imul", "itruediv", "ipow", "iand", "ior"):
    setattr(StrictArray, f"__{_name}__", _inplace(_name))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(StrictArray, f"__{_name}__", _binary(_name)[0])
StrictArray.__neg__ = lambda self: StrictArray(-self._a)
StrictArray.__invert__ = lambda self: StrictArray(~self._a)
StrictArray.__hash__ = None


class StrictNamespace:
    """The functions the model calls, each refusing NumPy arrays among its arguments (`out=` too)."""

    __name__ = "strict"
    inf, pi, newaxis = np.inf, np.pi, None
    float16, float32, float64 = np.float16, np.float32, np.float64
    int32, int64, intp, bool_ = np.int32, np.int64, np.intp, np.bool_

    @staticmethod
    def asarray(a, dtype=None):
        """The one way in: a host array or list copied into a strict array (cupy.asarray)."""
        if isinstance(a, StrictArray):
            return a if dtype is None else a.astype(dtype, copy=False)
        return StrictArray(np.array(a, dtype=dtype))

    def __getattr__(self, name: str):
        f = getattr(np, name, None)
        if name not in _FUNCTIONS or f is None:
            raise AttributeError(f"the strict namespace has no {name!r} (not common to NumPy and CuPy, or not "
                                 "needed yet: add it to tests/strict_arrays.py's list if CuPy has it)")

        def call(*args, out=None, **kwargs):
            args = _in(args)
            kwargs = {k: _in(v, f"keyword {k}") for k, v in kwargs.items()}
            if out is not None:
                if not isinstance(out, StrictArray):
                    _refuse("out=")
                f(*args, out=out._a, **kwargs)
                return out
            result = f(*args, **kwargs)
            return tuple(_out(r) for r in result) if isinstance(result, tuple) else _out(result)

        call.__name__ = name
        return call

    def __repr__(self) -> str:
        return "<strict array namespace>"

    @staticmethod
    @contextmanager
    def capturing():
        """Inside, reading any strict array's value on the host raises, as it cannot happen inside a
        CUDA graph capture: run a step in here to show it never waits for the device."""
        before, _capturing[0] = _capturing[0], True
        try:
            yield
        finally:
            _capturing[0] = before


# What CuPy also has under the same name and arguments (checked against CuPy 13's API by name).
_FUNCTIONS = frozenset("""
    zeros zeros_like empty empty_like ones ones_like full arange where concatenate stack take take_along_axis
    exp tanh sqrt cos sin multiply add subtract divide matmul einsum sum maximum minimum argmax
    argsort isnan isfinite ascontiguousarray broadcast_to tril triu abs log
""".split())

strict = StrictNamespace()
