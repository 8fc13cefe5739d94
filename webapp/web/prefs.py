"""This browser's display preferences, kept in its session (no JavaScript needed): the colour theme,
and presentation mode (large type for a room, issue 31)."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, abort, redirect, request, session, url_for

bp = Blueprint("prefs", __name__, url_prefix="/prefs")
THEMES = ("auto", "dark", "light")  # auto: the system's prefers-color-scheme
BAD_NEXT = "The page to return to (the form's `next` field) is not an address: it holds a control character."


def theme() -> str:
    value = session.get("theme", "auto")
    return value if value in THEMES else "auto"


def next_theme(current: str) -> str:
    return THEMES[(THEMES.index(current) + 1) % len(THEMES)]


def presenting() -> bool:
    return session.get("present") is True


@bp.post("/theme")
def set_theme():
    """Sets the theme asked for (or the next one), then goes back to the page the form was on."""
    wanted = request.form.get("theme", "")
    session["theme"] = wanted if wanted in THEMES else next_theme(theme())
    return back_to_page()


@bp.post("/present")
def set_present():
    """Presentation mode on ("on") or off (anything else), then back to the page the form was on."""
    session["present"] = request.form.get("present") == "on"
    return back_to_page()


def back_to_page():
    back = request.form.get("next", "")
    if any(ord(c) < 32 or ord(c) == 127 for c in back):  # CR/LF cannot go into a Location header
        abort(400, BAD_NEXT)
    parts = urlsplit(back)
    # only a path on this site: never an address elsewhere (//evil.example, https://…)
    if not back.startswith("/") or back.startswith("//") or parts.scheme or parts.netloc or "\\" in back:
        back = url_for("pages.home")
    return redirect(back, 303)


def init_app(app) -> None:
    app.register_blueprint(bp)
    app.jinja_env.globals.update(theme=theme, next_theme=next_theme, presenting=presenting)
