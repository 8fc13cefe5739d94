"""One head over a whole reply: its attention as query × key weights. compute.py (torch), jobs.py (request,
result, executor), service.py, pages.py (routes), view.py (what its templates show)."""
