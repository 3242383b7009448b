"""The one conversion of a caller's array into host memory the device can copy from.

Every facade call that takes host data (``copy_from_numpy`` and its typed
twins, the one-shot FFTs, ``from_dlpack``) goes through ``host_array``, so
every kind of array is read the same way everywhere:

* NumPy arrays, and anything with ``__array__`` (lists too);
* PyTorch tensors of every dtype the package has (bfloat16 included), with
  ``requires_grad`` (the data is read, the graph is left alone), conjugate or
  negative views, on the CPU or on a GPU (copied to the host);
* CuPy arrays (copied to the host);
* objects with ``__dlpack__`` and raw DLPack capsules.

The elements are always read by their logical indices, never as raw memory,
so strides, views and negative steps are honoured. What cannot be read is a
``GpuRuntimeError``: ``DTypeMismatch`` for a dtype the package has no buffer
for, ``InvalidArgument`` for anything else, chaining the library's error.

A flat buffer has no shape, so ``flat_elements`` fixes one rule for copying
an n-D array into it: C (row-major) order, as ``np.ravel`` gives. An n-D array
whose memory is Fortran-ordered (column by column, as ``np.asfortranarray``
or a transpose makes it) is refused rather than guessed at: flatten it
yourself, ``a.ravel(order="F")`` for column-major BLAS/LAPACK layouts or
``np.ascontiguousarray(a)`` for row-major.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, InvalidArgument

__all__ = ["flat_elements", "host_array"]


def host_array(data: Any, what: str = "array") -> np.ndarray[Any, Any]:
    """A NumPy array of ``data``'s elements (a view where it can be, a copy else).

    ``what`` names the argument in error messages. Raises ``DTypeMismatch``
    for elements of a type no buffer holds and ``InvalidArgument`` for
    anything that is not an array.
    """
    if isinstance(data, np.ndarray):
        return _checked(data, what)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return _checked(_from_torch(torch, data, what), what)
    if hasattr(data, "__cuda_array_interface__") and hasattr(data, "get"):
        return _checked(np.asarray(data.get()), what)  # CuPy: copy to the host
    if type(data).__name__ == "PyCapsule":
        return _checked(_from_dlpack(_Capsule(data), what), what)
    if hasattr(data, "__dlpack__") and not hasattr(data, "__array__"):
        return _checked(_from_dlpack(data, what), what)
    try:
        array = np.asarray(data)
    except Exception as exc:  # a foreign __array__ may raise anything
        raise InvalidArgument(f"{what} cannot be read as an array: {exc}") from exc
    return _checked(array, what)


def flat_elements(data: np.ndarray[Any, Any], what: str = "array") -> np.ndarray[Any, Any]:
    """``data``'s elements in C (row-major) order, as a contiguous 1-D array.

    Raises ``InvalidArgument`` for an n-D array whose memory is Fortran-ordered:
    which order it meant is the caller's to say (see the module docstring).
    """
    if data.ndim > 1 and data.flags.f_contiguous and not data.flags.c_contiguous:
        raise InvalidArgument(
            f"{what} of shape {data.shape} is Fortran-ordered (column-major) and a buffer is "
            "flat: say which order you mean with a.ravel(order='F') (column by column, as "
            "gemm and the solvers read a matrix) or np.ascontiguousarray(a) (row by row)")
    return np.ascontiguousarray(data).reshape(-1)


def _checked(array: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
    """``array``, if a buffer can hold its elements (``DTypeMismatch`` else)."""
    if array.dtype.kind == "O":
        raise InvalidArgument(f"{what} is not an array of numbers (NumPy read it as objects: "
                              f"{type(array.reshape(-1)[0]).__name__ if array.size else 'empty'})")
    try:
        DType.of(array.dtype)
    except InvalidArgument:
        raise DTypeMismatch(f"{what} has dtype {array.dtype}, which no buffer holds; "
                            f"convert it to one of {', '.join(d.value for d in DType)}") from None
    return array


def _from_torch(torch: Any, tensor: Any, what: str) -> np.ndarray[Any, Any]:
    """A CPU NumPy view of a tensor's data (copied first when it lives on another device)."""
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.resolve_conj().resolve_neg()
    if data.dtype is torch.bfloat16:
        return np.asarray(data.view(torch.int16).numpy().view(DType.BF16.numpy))
    try:
        return np.asarray(data.numpy())
    except (TypeError, RuntimeError) as exc:
        if "ScalarType" not in str(exc):  # a sparse or quantized tensor, say
            raise InvalidArgument(f"{what} cannot be read from torch: {exc}") from exc
        raise DTypeMismatch(f"{what} is a torch tensor of {data.dtype}, which no buffer holds; "
                            f"convert it to one of {', '.join(d.value for d in DType)}") from exc


def _from_dlpack(producer: Any, what: str) -> np.ndarray[Any, Any]:
    """A NumPy array of a DLPack producer's data (through torch, when it is loaded, for what
    NumPy cannot take: device memory and bfloat16)."""
    try:
        return np.from_dlpack(producer)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        torch = sys.modules.get("torch")
        if torch is None:
            raise _dlpack_error(exc, what) from exc
        first = exc
    try:
        tensor = torch.from_dlpack(producer.capsule if isinstance(producer, _Capsule)
                                   else producer)
    except Exception as exc:  # torch could not take it either: say what NumPy said
        raise _dlpack_error(first, what) from exc
    return _from_torch(torch, tensor, what)


def _dlpack_error(exc: BaseException, what: str) -> InvalidArgument:
    message = f"{what} cannot be read through DLPack: {exc}"
    return DTypeMismatch(message) if "dtype" in str(exc).lower() else InvalidArgument(message)


class _Capsule:
    """A raw DLPack capsule as a producer NumPy takes (it checks the capsule's device)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)
