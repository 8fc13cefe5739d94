"""Sparse dictionaries of the chat model's residual stream (issue 49): the dictionary and its losses (sae.py), SAELens's
files (saelens.py), a corpus read through the hooked forward (activations.py), training (train.py), quality
(quality.py), each feature's density and top contexts (contexts.py). `python -m webapp.features train` is the
command line (webapp/features/__main__.py)."""
