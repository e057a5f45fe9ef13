"""A candidate's outputs on their way to the reference process, as host copies: `pack` turns an
output (a tensor, or lists, tuples and dicts of them and of plain values) into a JSON tree and
the tensors' bytes; `unpack` rebuilds it on the reference's device. What the copy loses (the
tensor's class, device, layout, strides) travels as facts beside it, which check_outputs reads
in place of the rebuilt tensor's own. `RemoteJudge` is the candidate process's side: it sends
each output to be judged and waits for the verdict."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

from . import wire
from .reference import Judgement


@dataclasses.dataclass
class Opaque:
    """A value that cannot cross as data (an object of some class): it equals nothing."""

    kind: str

    def __eq__(self, other) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self.kind}>"


def pack(value, tensors: list) -> Any:
    """The JSON tree of `value`; its tensors' (dtype, shape, host bytes) appended to `tensors`."""
    import torch

    if isinstance(value, torch.Tensor):
        facts = {
            "type": type(value).__name__ if type(value) is not torch.Tensor else "Tensor",
            "device": str(value.device),
            "layout": str(value.layout),
            "stride": list(value.stride()) if value.layout == torch.strided else [],
            "contiguous": bool(value.layout == torch.strided and value.is_contiguous()),
            "shape": list(value.shape),
            "dtype": str(value.dtype).replace("torch.", ""),
        }
        copyable = value.layout == torch.strided and value.device.type != "meta"
        if not copyable or facts["dtype"] not in wire.ITEMSIZE:
            return {"tensor": None, **facts}
        host = torch.Tensor.contiguous(torch.Tensor.cpu(torch.Tensor.detach(value)))
        tensors.append((facts["dtype"], facts["shape"], _host_bytes(host)))
        return {"tensor": len(tensors) - 1, **facts}
    if isinstance(value, tuple):
        return {"tuple": [pack(v, tensors) for v in value]}
    if isinstance(value, list):
        return {"list": [pack(v, tensors) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[str(k), pack(v, tensors)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"object": type(value).__name__}


def _host_bytes(host):
    """The bytes of a contiguous CPU tensor, without a copy (the view keeps the tensor alive)."""
    nbytes = host.numel() * host.element_size()
    if not nbytes:
        return b""
    view = (ctypes.c_ubyte * nbytes).from_address(host.data_ptr())
    view.tensor = host
    return view


def unpack(tree: Any, tensors: list, device) -> tuple[Any, list]:
    """(value, facts): the output rebuilt from `pack`'s tree with the received tensors on
    `device`, and the facts of each tensor leaf in leaves() order (None for other leaves).
    WireError for a tree that `pack` does not write."""
    facts: list = []
    value = _unpack(tree, tensors, device, facts, 0)
    return value, facts


def _unpack(tree: Any, tensors: list, device, facts: list, depth: int):
    import torch

    if depth > 64 or not isinstance(tree, dict) or len(tree) == 0:
        raise wire.WireError("an output tree that is not one the candidate's side writes")
    if "tensor" in tree:
        index = tree["tensor"]
        fact = {k: tree.get(k) for k in ("type", "device", "layout", "stride", "contiguous")}
        facts.append(fact)
        if index is None:
            return torch.empty(0, device=device)
        if type(index) is not int or not 0 <= index < len(tensors):
            raise wire.WireError(f"an output names tensor {str(index)[:20]}, which was not sent")
        dtype_name, shape, data = tensors[index]
        dtype = getattr(torch, dtype_name)
        if not data:
            return torch.empty(shape, dtype=dtype, device=device)
        flat = torch.frombuffer(data, dtype=torch.uint8).view(dtype)
        return flat.reshape(shape).to(device)
    (kind, inner), *more = tree.items()
    if more:
        raise wire.WireError("an output node with more than one entry")
    if kind in ("tuple", "list") and isinstance(inner, list):
        items = [_unpack(v, tensors, device, facts, depth + 1) for v in inner]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and isinstance(inner, list):
        out = {}
        for pair in inner:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise wire.WireError("a dict entry that is not [key, value]")
            out[pair[0]] = None  # the key's place, in the order given
        # leaves() walks a dict by sorted key: the facts must follow that order
        for key, value in sorted(((p[0], p[1]) for p in inner), key=lambda p: p[0]):
            out[key] = _unpack(value, tensors, device, facts, depth + 1)
        return out
    if kind == "value" and (inner is None or isinstance(inner, (bool, int, float, str))):
        facts.append(None)
        return inner
    if kind == "object" and isinstance(inner, str):
        facts.append(None)
        return Opaque(inner[:80])
    raise wire.WireError(f"an output node of kind {kind[:20]!r}")


class RemoteJudge:
    """The candidate process's side of the comparison: each output (with the inputs after the
    call, in the trials) goes to the reference process as a host copy; the verdict comes back.
    The candidate's process acts on it, but the pool takes the verdict from the reference."""

    def __init__(self, to_reference: int, from_reference: int):
        self.to_reference = to_reference
        self.from_reference = from_reference

    def check(self, phase: str, index: int, call: int, out, inputs=None, of: int = 0) -> Judgement:
        tensors: list = []
        header = {"type": "check", "phase": phase, "index": index, "call": call, "of": of,
                  "outputs": pack(out, tensors)}  # fmt: skip
        header["inputs"] = None if inputs is None else pack(list(inputs), tensors)
        try:
            wire.send_tensors(self.to_reference, header, tensors)
            reply = wire.recv(self.from_reference)
        except (OSError, wire.PeerClosed) as e:
            raise RuntimeError(f"the reference process is gone ({e})") from None
        return Judgement.from_dict(reply)


__all__ = ["Opaque", "RemoteJudge", "pack", "unpack"]
