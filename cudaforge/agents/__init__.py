"""The Coder and the Judge: the LLM providers behind one small interface (providers, and the
`file:` provider in file_provider), the prompts and the reading of replies (prompts), the Coder's
target (target), the evidence the Judge reads (evidence), the forge loop (loop), its
transcripts for reading and replaying a run (transcript), and resuming a run from its transcript
(resume)."""

from . import file_provider  # noqa: F401 (adds the file: scheme to providers.SCHEMES)
