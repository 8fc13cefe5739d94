"""The logit lens over a whole reply: what each layer would have said at every position. compute.py (torch),
jobs.py (request, result, executor), service.py, pages.py (routes), view.py (what its templates show)."""
