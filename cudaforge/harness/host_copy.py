"""A candidate's outputs on their way to the reference process, as host copies: `pack` turns an
output (a tensor, or lists, tuples and dicts of them and of plain values) into a JSON tree and
the tensors' bytes; `unpack` rebuilds it on the reference's device. What the copy loses (the
tensor's class, device, layout, strides) travels as facts beside it, which check_outputs reads
in place of the rebuilt tensor's own. `RemoteJudge` is the candidate process's side: it sends
each output to be judged and waits for the verdict."""

from __future__ import annotations

import ctypes
import dataclasses
import os
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
    """The JSON tree of `value`; its tensors' (dtype, shape, tensor) appended to `tensors`, the
    tensor detached where it lies (`host_bytes` or a device area takes it from there)."""
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
        tensors.append((facts["dtype"], facts["shape"], torch.Tensor.detach(value)))
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


def host_bytes(tensor):
    """The bytes of `tensor` in host memory, C order (no copy for a contiguous CPU tensor; the
    view keeps the tensor alive)."""
    import torch

    host = torch.Tensor.contiguous(torch.Tensor.cpu(tensor))
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
        if isinstance(data, torch.Tensor):  # bytes in a device area: a snapshot of our own
            return data.clone().view(dtype).reshape(shape)
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
    call, in the trials) goes to the reference process, in a device area it lends when they are
    on a GPU (area.py), else as a host copy; the verdict comes back. The candidate's process
    acts on it, but the pool takes the verdict from the reference."""

    def __init__(self, to_reference: int, from_reference: int):
        self.to_reference = to_reference
        self.from_reference = from_reference  # a Unix socket: a lent area's descriptor comes on it
        self.area = None
        self.area_refused = ""  # why the reference lent none; host copies from then on

    def check(self, phase: str, index: int, call: int, out, inputs=None, of: int = 0) -> Judgement:
        tensors: list = []
        header = {"type": "check", "phase": phase, "index": index, "call": call, "of": of,
                  "outputs": pack(out, tensors)}  # fmt: skip
        header["inputs"] = None if inputs is None else pack(list(inputs), tensors)
        try:
            if not self._send_in_area(header, tensors):
                host = [(d, shape, host_bytes(t)) for d, shape, t in tensors]
                wire.send_tensors(self.to_reference, header, host)
            reply = wire.recv(self.from_reference)
        except (OSError, wire.PeerClosed, wire.WireError) as e:
            raise RuntimeError(f"the reference process is gone ({e})") from None
        return Judgement.from_dict(reply)

    def _send_in_area(self, header: dict, tensors: list) -> bool:
        """Copy the tensors into the lent area (asking for one first) and send the header; False
        where they go as host copies instead (not all on one GPU, or no area)."""
        import torch

        if self.area_refused or not tensors:
            return False
        devices = {t.device for _, _, t in tensors}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            return False
        device = next(iter(devices))
        sizes = [t.numel() * t.element_size() for _, _, t in tensors]
        offsets, span = wire.area_layout(sizes)
        if (self.area is None or self.area.size < span) and not self._borrow(span, device):
            return False
        for (_, _, t), offset, n in zip(tensors, offsets, sizes):
            if n:
                flat = torch.Tensor.contiguous(t).reshape(-1).view(torch.uint8)
                self.area.view(offset, n).copy_(flat)
        torch.cuda.synchronize(device)
        wire.send_in_area(self.to_reference, header, [(d, shape) for d, shape, _ in tensors])
        return True

    def _borrow(self, nbytes: int, device) -> bool:
        from .area import DeviceArea, recv_fd

        wire.send(self.to_reference, {"type": "area", "bytes": nbytes})
        reply = wire.recv(self.from_reference)
        if not reply.get("ok"):
            self.area_refused = str(reply.get("why") or "refused")
            return False
        fd = recv_fd(self.from_reference)
        try:
            if self.area is not None:
                self.area.free()
            self.area = DeviceArea.adopt(fd, int(reply["size"]), device)
        finally:
            os.close(fd)
        return True


__all__ = ["Opaque", "RemoteJudge", "host_bytes", "pack", "unpack"]
