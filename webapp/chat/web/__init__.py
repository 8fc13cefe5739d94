"""Chat on the web: the blueprint (blueprint.py) and its routes — conversations.py (pages, sending,
streams), glass.py (tokens, odds, branches, prompt), inside_pages.py (inside a token: logit lens, attention),
head_pages.py (one head over a reply, query × key), share.py (read-only links), ablate_views.py (switching
parts off), attribution_pages.py (who pushed a token: direct logit attribution), patching_pages.py (patch
from another question), lens_pages.py (the logit lens over a whole reply), steer_views.py (directions and
steered versions), present.py (follow links and replays at a pace)."""

from webapp.chat.web import (  # noqa: F401  (each registers its routes on bp)
    ablate_views,
    attribution_pages,
    conversations,
    dictionary_views,
    feature_views,
    glass,
    head_pages,
    inside_pages,
    lens_pages,
    patching_pages,
    present,
    share,
    steer_views,
)
from webapp.chat.web.blueprint import bp

__all__ = ["bp"]
