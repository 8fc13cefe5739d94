"""Chat on the web: the blueprint (blueprint.py) and the routes of the conversation itself — conversations.py
(pages, sending, streams), glass.py (tokens, odds, branches, prompt), share.py (read-only links), present.py
(follow links and replays at a pace). Each experiment's routes live in its own package (pages.py) and are
registered on the same blueprint by the list of experiments (webapp/chat/experiments.py)."""

from webapp.chat.web import conversations, glass, present, share  # noqa: F401  (each registers its routes on bp)
from webapp.chat.web.blueprint import bp

__all__ = ["bp"]
