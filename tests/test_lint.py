"""Static checks of the C core: paired GIL release, no borrowed Py_None returned, and driver
functions resolved at the CUDA version of the prototype they are called through."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cudaforge.cuda import libs as _libs

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = sorted(CSRC.glob("*.c"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_gil_release_is_paired(path):
    text = path.read_text()
    assert text.count("Py_BEGIN_ALLOW_THREADS") == text.count("Py_END_ALLOW_THREADS")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_bare_return_of_py_none(path):
    # `return Py_None;` returns a borrowed reference: use Py_RETURN_NONE
    assert not re.search(r"return\s+Py_None\s*;", path.read_text())


def test_driver_functions_are_resolved_at_their_prototype_version():
    header = (CSRC / "cudaforge.h").read_text()
    block = header[header.index("#define CF_CUDA_API(X)") : header.index("#define CF_NVRTC_API")]
    entries = re.findall(r"X\((\w+), (\d+)\)", block)
    assert len(entries) > 10
    typedefs = None
    for folder in _libs.include_dirs():
        candidate = Path(folder) / "cudaTypedefs.h"
        if candidate.exists():
            typedefs = candidate.read_text()
            break
    if typedefs is None:
        pytest.skip("cudaTypedefs.h not found in the CUDA include folders")
    cuda_h = (candidate.parent / "cuda.h").read_text()
    for name, version in entries:
        assert f"PFN_{name}_v{version})" in typedefs, f"{name} has no ABI version {version}"
        # A plain name that cuda.h does not map to a suffixed symbol keeps its first ABI (a new
        # ABI gets a new name, e.g. cuCtxGetDevice_v2 at 13.0); a mapped one takes the newest.
        versions = sorted(int(v) for v in re.findall(rf"PFN_{name}_v(\d+)\)", typedefs))
        mapped = re.search(rf"#define {name}\s+(?:__CUDA_API_\w+\()?{name}_v\d", cuda_h)
        expected = versions[-1] if mapped else versions[0]
        assert int(version) == expected, f"{name}: resolve at {expected}, not {version}"


def test_c_sources_are_clang_formatted():
    import shutil
    import subprocess

    tool = shutil.which("clang-format")
    if tool is None:
        pytest.skip("clang-format is not installed (apt-get install clang-format)")
    paths = [str(p) for p in sorted(CSRC.glob("*.[ch]"))]
    out = subprocess.run(
        [tool, "--dry-run", "--Werror", *paths], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_only_errors_c_turns_a_library_status_into_words():
    # errors.c alone maps CUresult, nvrtcResult, CUptiResult and CURLcode to a message or .reason
    status_words = re.compile(
        r"\b(cuGetErrorName|cuGetErrorString|nvrtcGetErrorString|cuptiGetResultString"
        r"|curl_easy_strerror)\s*\("
    )
    offenders = [
        p.name for p in SOURCES if p.name != "errors.c" and status_words.search(p.read_text())
    ]
    assert not offenders, f"library status mapped outside errors.c in {offenders}"
