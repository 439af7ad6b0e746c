"""A stand-in GPU on the CPU: catch host/device mixing without a GPU.

Inside :class:`DeviceDiscipline`, :data:`DEVICE` (``cpu:0``) plays a compute
device and the plain CPU plays the host. Every tensor made on ``DEVICE`` (a
factory given ``device=DEVICE``, ``.to(DEVICE)``, a model moved there) is
tracked as a device tensor, and so is every result of an operation on one;
``.device`` of a device tensor answers ``DEVICE``, so library code that asks
a model for its device and allocates there behaves as on a GPU. The mode then
refuses what CUDA refuses, with the operation named:

- an operation that combines a device tensor with a host tensor of one or more
  dimensions (zero-dimensional host tensors, like CUDA's CPU scalars, may
  join; indexing a device tensor with host indices is allowed, as on CUDA);
- ``.numpy()`` (and ``np.asarray``) of a device tensor.

Values are real CPU values, so a whole computation runs and its numbers can
be compared with a plain run. Gradients of device parameters are device
tensors (autograd makes them outside the mode's sight).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = torch.device("cpu", 0)
HOST = torch.device("cpu")
Tensor = torch.Tensor

_MAY_MIX = {
    Tensor.__getitem__,
    Tensor.__setitem__,
    Tensor.copy_,
    torch._has_compatible_shallow_copy_type,
}
_TO_HOST = {Tensor.numpy, Tensor.__array__, Tensor.tolist, Tensor.item}
_DEVICE_GET = Tensor.device.__get__
_GRAD_GET = Tensor.grad.__get__
_DATA_SET = Tensor.data.__set__  # the storage, and so the mark, follows


class DeviceMixError(RuntimeError):
    """Library code combined a device tensor with a host tensor."""


def _where(arg: Any) -> torch.device | None:
    """The device an argument names (``None`` when it names none)."""
    if isinstance(arg, torch.device):
        return arg
    if isinstance(arg, str) and arg.split(":")[0] in ("cpu", "cuda", "meta"):
        return torch.device(arg)
    return None


class DeviceDiscipline(TorchFunctionMode):
    """Track device tensors and refuse host/device mixing (see the module docstring).

    A tensor is on the device when its storage is: views, parameters made
    from device data and copies loaded into a device parameter follow without
    being seen. Moves between host and device therefore always copy.
    """

    def __init__(self) -> None:
        super().__init__()
        self.storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def on_device(self, t: Any) -> bool:
        return isinstance(t, Tensor) and _storage(t) in self.storages

    def mark(self, out: Any, device: bool) -> Any:
        if device:
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    self.storages[_storage(t)] = True
        return out

    def move(self, func: Any, args: tuple, kwargs: dict, device: bool) -> Any:
        out = func(*args, **kwargs)
        if self.on_device(args[0]) != device:
            out = out.clone()  # a host copy never shares the device's storage
        return self.mark(out, device)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func == _DEVICE_GET:
            return DEVICE if self.on_device(args[0]) else HOST
        if func == _GRAD_GET:
            return self.mark(func(*args), self.on_device(args[0]))
        if func == _DATA_SET:
            return func(*args)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        dev = [t for t in tensors if self.on_device(t)]
        if func in (Tensor.numpy, Tensor.__array__) and dev:
            raise DeviceMixError(
                f"{func.__name__}() of a device tensor: copy it with .cpu() first"
            )
        if func is Tensor.cpu:
            return self.move(func, args, kwargs, device=False)
        named = [d for d in map(_where, (*args, *kwargs.values())) if d is not None]
        if func is Tensor.to:
            others = [t for t in tensors[1:] if t is not args[0]]
            if named or others:
                to_dev = named[0] == DEVICE if named else self.on_device(others[0])
                return self.move(func, args, kwargs, device=to_dev)
            return self.mark(func(*args, **kwargs), bool(dev))  # a dtype change
        host = [t for t in tensors if not self.on_device(t) and t.dim() and t.numel()]
        if dev and host and func not in _MAY_MIX:
            raise DeviceMixError(
                f"{getattr(func, '__qualname__', func)} combines a device tensor with "
                f"a host tensor of shape {tuple(host[0].shape)}: move it to the "
                "device of the other operand"
            )
        out = func(*args, **kwargs)
        if func in _TO_HOST:
            return out
        if func in _MAY_MIX:  # the result lives where the indexed tensor does
            return self.mark(out, self.on_device(args[0]))
        return self.mark(out, named[0] == DEVICE if named else bool(dev))


def _storage(t: Tensor) -> Any:
    """The storage object of ``t``: one per storage, alive while any view is.

    Inside ``torch.vmap`` a tensor is a wrapper around the batched tensor
    it stands for: that tensor's storage decides.
    """
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        t = functorch.get_unwrapped(t)
    return t.untyped_storage()


def to_device(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` moved to :data:`DEVICE` (call inside a :class:`DeviceDiscipline`)."""
    return module.to(DEVICE)
