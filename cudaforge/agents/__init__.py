"""The Coder and the Judge: the LLM providers behind one small interface (providers, and the
`file:` provider in file_provider), the prompts and the reading of replies (prompts), the Coder's
target (target), the evidence the Judge reads (evidence), the forge loop (loop), and its
transcripts for reading, replaying and resuming a run (transcript)."""

from . import file_provider  # noqa: F401 (adds the file: scheme to providers.SCHEMES)
