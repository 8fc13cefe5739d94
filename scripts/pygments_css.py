"""Writes static/pygments.css: the colours of the code blocks in rendered replies (webapp/chat/web/markdown.py).

    .venv/bin/python scripts/pygments_css.py

Run it again after changing a style or upgrading Pygments, and commit the file. A light and a dark style,
each under its own `prefers-color-scheme` query so neither leaks a colour into the other. Only class
rules (no inline styles: the CSP says `style-src 'self'`), and none of Pygments' rules for bare `pre` or
line numbers, which would reach outside the code blocks.
"""

from __future__ import annotations

from pathlib import Path

from pygments.formatters import HtmlFormatter

LIGHT, DARK = "default", "github-dark"  # both meet WCAG AA contrast on their own background
OUT = Path(__file__).resolve().parent.parent / "static" / "pygments.css"


def rules(style: str) -> str:
    formatter = HtmlFormatter(style=style)
    lines = formatter.get_background_style_defs(".highlight") + formatter.get_token_style_defs(".highlight")
    return "\n".join("  " + line for line in lines)


def main() -> None:
    OUT.write_text(f"/* Written by scripts/pygments_css.py (Pygments styles {LIGHT!r} and {DARK!r}): do not edit. */\n"
                   f"@media not all and (prefers-color-scheme: dark) {{\n{rules(LIGHT)}\n}}\n"
                   f"@media (prefers-color-scheme: dark) {{\n{rules(DARK)}\n}}\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
