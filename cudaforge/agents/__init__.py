"""The Coder and the Judge: LLM providers behind one small interface, the forge loop, and its
transcripts (for reading, replaying and resuming a run)."""

from . import file_provider  # noqa: F401 (adds the file: scheme to providers.SCHEMES)
