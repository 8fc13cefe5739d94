"""Inside this token: the logit lens and every head's attention at the position that produced a token of a
reply. compute.py (torch: one hooked forward), jobs.py (its request, result and executor), service.py (the
checks every experiment shares: the reply's own model, run here, its exact ids, a steered version's terms),
waiting.py (what every experiment's views share: those checks as HTTP errors, a request that waits for its
job), pages.py (its routes), view.py (what its templates show)."""
