"""Sparse dictionaries of the chat model's residual stream (issue 49): the dictionary and its losses (sae.py), SAELens's
files (saelens.py), a corpus read through the hooked forward (activations.py), training (train.py), quality
(quality.py), each feature's density and top contexts (contexts.py), the dictionaries loaded beside a model
(dictionaries.py); a token's features on the core (jobs.py, service.py, pages.py) and training from the page
(training_jobs.py, training.py, dictionary_pages.py). `python -m webapp.features train` is the command line
(webapp/features/__main__.py)."""
