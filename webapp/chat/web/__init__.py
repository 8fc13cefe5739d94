"""Chat on the web: the blueprint (blueprint.py) and its routes — conversations.py (pages, sending,
streams), glass.py (tokens, odds, branches, prompt), inside_pages.py (inside a token: logit lens, attention),
share.py (read-only links)."""

from webapp.chat.web import conversations, glass, inside_pages, patching_pages, share  # noqa: F401  (each registers its routes on bp)
from webapp.chat.web.blueprint import bp

__all__ = ["bp"]
