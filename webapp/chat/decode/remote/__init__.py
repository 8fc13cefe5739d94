"""Chat replies from OpenAI-compatible servers (GLASSBOX_CHAT_BACKEND): backends.py (the pool, health
checks, one reader thread per reply), wire.py (OpenAI's format in and out), executor.py (the core's executor)."""
