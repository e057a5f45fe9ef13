"""The Coder and the Judge: the LLM providers behind one small interface (providers), the prompts
and the reading of replies (prompts), the evidence the Judge reads (evidence), the forge loop
(loop), and its transcripts for reading, replaying and resuming a run (transcript)."""
