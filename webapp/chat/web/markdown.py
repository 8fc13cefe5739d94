"""Assistant replies as safe Markdown, rendered on the server (so it works without JavaScript).

Model text is untrusted. markdown-it-py runs with raw HTML off (any tag in the text comes out escaped),
links may only go to http(s), mailto or a relative address, images are off (a reply must not make the
browser fetch anything), and fenced code is coloured by Pygments with CSS classes only: the CSP's
`style-src 'self'` allows no inline styles. The classes' colours are in static/pygments.css
(scripts/pygments_css.py writes it).
"""

from __future__ import annotations

import functools
import re

from markdown_it import MarkdownIt
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

# Longer text is shown as plain text: it bounds the parser's and the highlighter's work per message
# (a reply is at most a context window, a few thousand characters, so only hostile text gets here).
MAX_MARKDOWN_CHARS = 20_000

# http(s), mailto, or relative: no colon before the first / ? or # (where a scheme would end), which
# also refuses what only looks relative, such as "%01javascript:", rather than trust every browser.
SAFE_URL = re.compile(r"^(https?:|mailto:|[^:/?#]*([/?#]|$))", re.I)
LANGUAGE = re.compile(r"^[\w+#.-]{1,40}$")  # what a fence's info string may name; anything else: plain

FORMATTER = HtmlFormatter(nowrap=True)  # just the coloured <span>s; we write the <pre> around them


def render_markdown(text: str | None) -> Markup:
    """An assistant message as HTML that is safe to put in the page as it is."""
    text = text or ""
    if len(text) > MAX_MARKDOWN_CHARS:
        return Markup('<p class="plain">%s</p>') % text
    md = _parser()
    tokens = md.parse(text)
    for token in tokens:
        if token.type in ("heading_open", "heading_close"):
            # The page's title is the <h1>: a reply's headings sit one level below it.
            token.tag = f"h{min(int(token.tag[1]) + 1, 6)}"
        elif "style" in token.attrs:
            # A table column's alignment comes as style="text-align:…", which the CSP would block: a class.
            token.attrSet("class", "align-" + str(token.attrs.pop("style")).rpartition(":")[2])
        for child in token.children or ():
            if child.type == "link_open":
                child.attrSet("rel", "noopener nofollow")
    return Markup(md.renderer.render(tokens, md.options, {}))


# A line that starts a block (a heading, emphasis such as the export's "**Assistant**", a rule or setext
# underline, a list, a quote, raw HTML, a table): in an exported message it is escaped, so a message
# cannot forge a turn marker or a heading of the export around it. Indented 4+ spaces is code already.
BLOCK_START = re.compile(r"^( {0,3})([#*_=+\-<>|]+)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def escape_turn_markers(text: str | None) -> str:
    """A message as Markdown text for the export (templates/chat/export.md.txt): block markers at line
    starts backslash-escaped outside code fences, and a fence the message leaves open closed, so the
    turns after it are not swallowed into code. What the message says still reads the same."""
    out, fence = [], ""
    for line in re.split(r"\r\n|\r|\n", text or ""):
        opening = FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = ""
        elif opening and not (opening.group(1)[0] == "`" and "`" in line[opening.end():]):
            fence = opening.group(1)
        else:
            line = BLOCK_START.sub(lambda m: m.group(1) + "".join("\\" + c for c in m.group(2)), line)
        out.append(line)
    if fence:
        out.append(fence)
    return "\n".join(out)


def init_app(app) -> None:
    """Registers the `markdown` Jinja filter (templates/chat/_macros.html uses it) and the export's
    `markdown_text` (templates/chat/export.md.txt)."""
    app.add_template_filter(render_markdown, "markdown")
    app.add_template_filter(escape_turn_markers, "markdown_text")


@functools.cache
def _parser() -> MarkdownIt:
    # CommonMark (maxNesting 20 caps how deep hostile nesting goes) plus GFM's tables and ~~strike~~.
    # breaks: a single line break in a reply stays one, as it did when replies were plain text.
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "highlight": _highlight})
    md.enable(["table", "strikethrough"]).disable("image")
    md.validateLink = _safe_link  # type: ignore[method-assign]  # markdown-it-py's documented hook
    return md


def _safe_link(url: str) -> bool:
    # markdown-it hands over the address as it will write it: entities decoded, controls and spaces
    # percent-encoded, so a browser cannot read a scheme into it that this does not see.
    return SAFE_URL.match(url) is not None


def _highlight(code: str, lang: str, attrs: str) -> str:
    # Starts with "<pre", so markdown-it uses it as it is. Pygments escapes the code.
    return f'<pre class="highlight"><code>{highlight(code, _lexer(lang), FORMATTER)}</code></pre>'


@functools.lru_cache(maxsize=64)
def _lexer(lang: str):
    if LANGUAGE.match(lang):
        try:
            return get_lexer_by_name(lang)
        except ClassNotFound:
            pass
    return TextLexer()
