"""CUDA source -> NVRTC cubin -> kernels callable on torch tensors.

`compile()` caches each result on disk, keyed by everything that determines the binary (source,
options, arch, NVRTC version, header folders), written atomically. A `CompiledModule` exposes each
`extern "C"` kernel as an attribute; the call itself (`mod.add(grid, block, args)`) is handled in C.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import _core
from ..errors import NoGPUError
from . import libs as _libs

CACHE_FORMAT = 2  # bump when the options or cudaforge/include change
_MAGIC = b"CUDAFORGE-KERNEL\n"
_memory_cache: dict[str, dict] = {}
_memory_lock = threading.Lock()
_torch_hooked = False


def cache_dir() -> Path:
    """Folder of the on-disk caches: $CUDAFORGE_CACHE_DIR, else ~/.cache/cudaforge."""
    root = os.environ.get("CUDAFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cudaforge"
    )
    return Path(root)


# ---------------------------------------------------------------- arch


def normalize_arch(arch) -> str:
    """'sm_90a', 'sm_90', 'compute_90', '90', 90 or (9, 0) -> an NVRTC target name."""
    if isinstance(arch, tuple):
        arch = f"sm_{arch[0]}{arch[1]}"
    text = str(arch).strip().lower()
    if re.fullmatch(r"\d{2,3}[af]?", text):
        text = "sm_" + text
    if not re.fullmatch(r"(sm|compute)_\d{2,3}[af]?", text):
        raise ValueError(f"arch {arch!r} is not like 'sm_90', 'sm_90a' or 'compute_90'")
    number = int(re.sub(r"\D", "", text))
    supported = _supported_archs()
    if number not in supported:
        raise ValueError(
            f"arch {text}: NVRTC {'.'.join(map(str, _nvrtc_version()))} targets only "
            + ", ".join(f"sm_{a}" for a in sorted(supported))
        )
    return text


def current_arch(device: int | None = None) -> str:
    """The NVRTC target for a GPU of this machine: sm_XY, with the 'a' features from sm_90 on."""
    try:
        _libs.ensure("cuda")
        if _core.device_count() == 0:
            raise NoGPUError("no CUDA device is visible")
    except (_core.LibraryNotFound, _core.CudaError) as exc:
        raise NoGPUError(
            f"no GPU to compile for ({str(exc).splitlines()[0]}); pass arch='sm_90' (or another "
            "target) to compile without one"
        ) from None
    if device is None:
        device = _torch_current_device()
    info = _core.device_info(device)
    cc = info["cc_major"] * 10 + info["cc_minor"]
    supported = sorted(_supported_archs())
    if cc in supported:
        return f"sm_{cc}a" if info["cc_major"] >= 9 else f"sm_{cc}"
    older = [a for a in supported if a <= cc]
    if not older:
        raise NoGPUError(f"NVRTC cannot target this GPU (compute capability {cc})")
    return f"compute_{older[-1]}"  # PTX: the driver compiles it for the GPU at load


def _torch_current_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


# ---------------------------------------------------------------- kernel signatures

_CODES = {
    "int": "i", "signed": "i", "signed int": "i", "int32_t": "i",
    "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "long": "l", "long int": "l", "long long": "l", "long long int": "l", "int64_t": "l",
    "ptrdiff_t": "l", "ssize_t": "l",
    "unsigned long": "L", "unsigned long int": "L", "unsigned long long": "L",
    "unsigned long long int": "L", "uint64_t": "L", "size_t": "L",
    "short": "h", "int16_t": "h", "unsigned short": "H", "uint16_t": "H",
    "char": "b", "signed char": "b", "int8_t": "b",
    "unsigned char": "B", "uint8_t": "B", "bool": "B",
    "float": "f", "double": "d",
}  # fmt: skip
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"}
_KERNEL = re.compile(
    r"__global__\s+(?:(?:__launch_bounds__\s*\([^)]*\)|static|inline|__forceinline__)\s+)*"
    r"void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)"
)


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", source)


def _extern_c_spans(source: str) -> list[tuple[int, int]]:
    spans = []
    for match in re.finditer(r'extern\s+"C"\s*\{', source):
        depth, i = 1, match.end()
        while i < len(source) and depth:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        spans.append((match.end(), i))
    return spans


def param_code(declaration: str) -> tuple[str, str]:
    """'const float* __restrict__ x' -> ('p', 'x'); 'int n' -> ('i', 'n'); unknown -> '?'."""
    decl = declaration.strip()
    name_match = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl)
    name = name_match.group(1) if name_match else ""
    if "*" in decl or "[" in decl:
        return "p", name
    if "&" in decl:
        return "?", name
    words = [w for w in decl.split() if w not in _QUALIFIERS]
    base = " ".join(words[:-1]) if len(words) > 1 else ""
    return _CODES.get(base, "?"), name


@dataclass
class KernelSignature:
    name: str
    codes: str
    param_names: list[str]


def find_kernels(source: str) -> dict[str, KernelSignature]:
    """The `extern "C"` kernels of a source, with one type code per parameter."""
    clean = _strip_comments(source)
    spans = _extern_c_spans(clean)
    found = {}
    for match in _KERNEL.finditer(clean):
        before = clean[max(0, match.start() - 40) : match.start()]
        in_block = any(a <= match.start() < b for a, b in spans)
        if not (in_block or re.search(r'extern\s+"C"\s*$', before)):
            continue
        params = [p for p in _split_params(match.group(2)) if p.strip() not in ("", "void")]
        codes, names = zip(*(param_code(p) for p in params)) if params else ((), ())
        found[match.group(1)] = KernelSignature(match.group(1), "".join(codes), list(names))
    return found


def _split_params(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def parse_ptxas_info(log: str) -> dict[str, dict[str, int]]:
    """Registers, spills and stack per kernel from NVRTC's ptxas --verbose lines."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([\w$]+)'?", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        for key, pattern in (
            ("stack_frame_bytes", r"(\d+) bytes stack frame"),
            ("spill_store_bytes", r"(\d+) bytes spill stores"),
            ("spill_load_bytes", r"(\d+) bytes spill loads"),
            ("registers", r"Used (\d+) registers"),
        ):
            found = re.search(pattern, line)
            if found:
                current[key] = int(found.group(1))
    return out


# ---------------------------------------------------------------- compiled modules


@dataclass
class CompiledModule:
    """A compiled source: its `extern "C"` kernels are attributes, callable as
    `mod.name(grid, block, (args...), shared_mem=0, stream=None)`."""

    name: str
    arch: str
    options: list[str]
    image: bytes  # cubin, or PTX for a compute_XX target
    log: str
    lowered: dict[str, str]
    signatures: dict[str, KernelSignature]
    cached: bool = False
    compile_seconds: float = 0.0
    _loaded: object = field(default=None, repr=False)
    _kernels: dict = field(default_factory=dict, repr=False)

    @property
    def kernels(self) -> list[str]:
        """Names of the `extern "C"` kernels found in the source."""
        return sorted(self.signatures)

    @property
    def resources(self) -> dict[str, dict[str, int]]:
        """Per kernel: registers, spill store/load bytes, stack frame bytes (from ptxas)."""
        return parse_ptxas_info(self.log)

    def kernel(self, name: str):
        """The kernel `name`: an `extern "C"` name, or a name expression given to compile()."""
        got = self._kernels.get(name)
        if got is not None:
            return got
        _libs.ensure("cuda")
        _hook_torch()
        if self._loaded is None:
            self._loaded = _core.Module(self.image, self.name)
        signature = self.signatures.get(name)
        if signature is not None:
            got = _core.Kernel(self._loaded, name, signature.codes, signature.param_names)
        elif name in self.lowered:
            got = _core.Kernel(self._loaded, self.lowered[name])
        else:
            raise AttributeError(
                f"{self.name} has no kernel {name!r}; kernels: {', '.join(self.kernels) or 'none'}"
                " (a kernel needs extern \"C\", or name_expressions= for templates)"
            )
        self._kernels[name] = got
        return got

    __getitem__ = kernel

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        got = self.kernel(name)
        object.__setattr__(self, name, got)  # later lookups skip __getattr__
        return got


def _hook_torch() -> None:
    global _torch_hooked
    if _torch_hooked:
        return
    try:
        import torch
    except ImportError:
        return
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:

        def raw(device):
            return torch.cuda.current_stream(device).cuda_stream

    _core.set_torch_hooks(torch.Tensor, raw)
    _torch_hooked = True


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> tuple[int, int]:
    _libs.ensure("nvrtc")
    return _core.nvrtc_version()


@functools.lru_cache(maxsize=1)
def _supported_archs() -> frozenset[int]:
    _libs.ensure("nvrtc")  # current_arch() may be the process's first NVRTC call
    return frozenset(_core.nvrtc_supported_archs())


def _cache_key(source, options, arch, name_expressions) -> str:
    payload = json.dumps(
        [CACHE_FORMAT, source, list(options), arch, list(name_expressions), _nvrtc_version()]
    )  # options hold the include folders
    return hashlib.sha256(payload.encode()).hexdigest()


def _read_cache(path: Path) -> dict | None:
    """The cached entry at path, or None if missing or damaged (a damaged file is removed)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        header_end = data.index(b"\n", len(_MAGIC))
        header = json.loads(data[len(_MAGIC) : header_end])
        image = data[header_end + 1 :]
        if hashlib.sha256(image).hexdigest() != header["sha256"]:
            raise ValueError("checksum mismatch")
        header["image"] = image
        return header
    except (ValueError, KeyError, json.JSONDecodeError):
        path.unlink(missing_ok=True)
        return None


def _write_cache(path: Path, entry: dict) -> None:
    header = {k: v for k, v in entry.items() if k in ("log", "lowered")}
    header["sha256"] = hashlib.sha256(entry["image"]).hexdigest()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + json.dumps(header).encode() + b"\n" + entry["image"])
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    except BaseException:
        os.unlink(tmp)
        raise


def compile(
    source: str,
    options=(),
    arch=None,
    *,
    name: str = "kernel.cu",
    name_expressions=(),
    cache: bool = True,
) -> CompiledModule:
    """Compile CUDA C++ with NVRTC for `arch` (default: $CUDAFORGE_ARCH if set, else this
    machine's GPU: sm_90a on an H200).

    Raises CompileError with the NVRTC log (.log) and the failing line quoted (.line).
    Results are cached in memory and on disk under cache_dir()/kernels."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError("source must be a non-empty string of CUDA C++")
    _libs.ensure("nvrtc")
    arch = arch if arch is not None else os.environ.get("CUDAFORGE_ARCH") or None
    arch = normalize_arch(arch) if arch is not None else current_arch()
    full_options = [f"--gpu-architecture={arch}", "--std=c++17", "-lineinfo",
                    "--pre-include=cudaforge_prelude.h"]
    if arch.startswith("sm_"):
        full_options.append("--ptxas-options=--verbose")
    full_options += [f"-I{d}" for d in _libs.include_dirs()] + [str(o) for o in options]
    key = _cache_key(source, full_options, arch, name_expressions)
    path = cache_dir() / "kernels" / key[:2] / f"{key}.bin"
    entry, cached = None, False
    started = time.perf_counter()
    if cache:
        with _memory_lock:
            entry = _memory_cache.get(key)
        if entry is None:
            entry = _read_cache(path)
        cached = entry is not None
    if entry is None:
        out = _core.nvrtc_compile(source, name, full_options, list(name_expressions))
        entry = {
            "image": out["cubin"] if out["cubin"] is not None else out["ptx"] + b"\0",
            "log": out["log"],
            "lowered": out["lowered"],
        }
        if cache:
            _write_cache(path, entry)
    if cache:
        with _memory_lock:
            _memory_cache[key] = entry
    return CompiledModule(
        name=name,
        arch=arch,
        options=full_options,
        image=entry["image"],
        log=entry["log"],
        lowered=dict(entry["lowered"]),
        signatures=entry.setdefault("signatures", find_kernels(source)),
        cached=cached,
        compile_seconds=time.perf_counter() - started,
    )


def synchronize() -> None:
    """Wait for the GPU; raises KernelFault if a kernel hit a sticky error (illegal address,
    trap): after that the process's CUDA context is unusable."""
    _libs.ensure("cuda")
    _core.synchronize()
