"""OpenAI's API (/v1) for scripts and apps, on the same core, queue and limits as the pages.

The optional bearer-token check (GLASSBOX_API_KEYS, webapp/web/api_auth.py) is in front of its routes,
as in front of the Loop-lab JSON API's (/api/loops/...), so scripts use one key for both.
No cookie is read or set for /v1: its owner is the key (or the client address), never a browser's.
"""

from webapp.v1 import views  # noqa: F401  (the routes register themselves on bp)
from webapp.v1.blueprint import bp

__all__ = ["bp"]
