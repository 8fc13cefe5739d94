"""Errors of the chat model path that the web layer shows to people."""


class ModelLoadError(Exception):
    """A checkpoint, config or tokenizer cannot be used; the message names the file and the mismatch."""
