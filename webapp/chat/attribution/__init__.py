"""Who pushed this token: direct logit attribution, per head and MLP. compute.py (torch), jobs.py (request,
result, executor), service.py, pages.py (routes), view.py (what its templates show)."""
