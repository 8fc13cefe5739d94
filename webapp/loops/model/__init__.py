"""The Loop-lab model, torch only: the looped transformer with its completion head (looped.py), its character
tokenizer, and bundles on disk (checkpoint.py)."""
