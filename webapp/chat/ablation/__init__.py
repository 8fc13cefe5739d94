"""Switching parts off: heads and MLPs zeroed or mean-ablated, for one position or as a new version of a
reply. compute.py (torch: the edit and the means), jobs.py (request, result, executor), service.py, pages.py
(routes)."""
