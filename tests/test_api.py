"""cudaforge/__init__.py: the public API fits one screen, every name it lists resolves, and the
exceptions at the top are the four a user catches (the rest are in cudaforge.errors)."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

import cudaforge

SCREEN_LINES = 60


def code_lines(source: str) -> int:
    """Lines of code: not blank, not a comment, not part of the module docstring."""
    tree = ast.parse(source)
    docstring = set()
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        docstring = set(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstring
    )


def test_the_public_api_fits_one_screen():
    lines = code_lines(inspect.getsource(cudaforge))
    assert lines <= SCREEN_LINES, f"cudaforge/__init__.py has {lines} lines of code"


def test_all_is_sorted_and_unique():
    assert cudaforge.__all__ == sorted(set(cudaforge.__all__))




@pytest.mark.parametrize("name", cudaforge.__all__)
def test_every_public_name_resolves(name):
    assert getattr(cudaforge, name) is not None
    assert name in dir(cudaforge) or name in cudaforge._LAZY


def test_apply_stored_is_load():
    assert cudaforge.apply_stored is cudaforge.load


def test_the_forge_loop_and_its_results_are_at_the_top():
    loop = importlib.import_module("cudaforge.agents.loop")
    assert cudaforge.forge is loop.run_loop
    assert cudaforge.LoopResult is loop.LoopResult
    assert cudaforge.EvalResult.__name__ == "EvalResult"
    assert cudaforge.OptimizeResult.__name__ == "OptimizeResult"


def test_the_top_exceptions_are_the_four_a_user_catches():
    loaded = {name: vars(cudaforge).get(name) for name in cudaforge.__all__}
    top = {
        name
        for name, value in loaded.items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert top == {"CudaforgeError", "CompileError", "NoGPUError", "LLMError"}
    for name in cudaforge.errors.__all__:
        error = getattr(cudaforge.errors, name)
        assert issubclass(error, cudaforge.CudaforgeError), name
        if name not in top:
            assert not hasattr(cudaforge, name), f"{name} is still at the top"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        cudaforge.no_such_name  # noqa: B018
