"""Steering: directions added to the residual stream, features clamped, in a new version of a reply.
compute.py (torch: a contrastive direction, llama.cpp's control vectors), jobs.py (making a direction on the
core), service.py, pages.py (routes). The steered edit every run honours is webapp/chat/model/steer.py; the
saved directions, webapp/chat/directions.py."""
