"""Patch from another question: activation patching, cell by cell. compute.py (torch), jobs.py (request,
result, executor), service.py, pages.py (routes), view.py (what its templates show)."""
