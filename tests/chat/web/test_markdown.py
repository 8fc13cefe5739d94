"""Replies as Markdown: what renders, and that model text never becomes markup that runs or fetches.

The renderer (webapp/chat/web/markdown.py) is checked on its own, then through a chat app whose model
always says the same Markdown: the final fragment and the history page show it rendered, a person's
message stays plain."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chat.web.test_conversations import sent_and_streamed
from tests.conftest import csrf_of, make_app
from tests.support.chat_models import tiny_checkpoint
from webapp.chat.web.markdown import MAX_MARKDOWN_CHARS, render_markdown
from webapp.web.state import glassbox

# Everything the renderer may write: anything else in its output is a bug.
TAGS = {"p", "br", "em", "strong", "s", "code", "pre", "span", "a", "ul", "ol", "li", "blockquote", "hr",
        "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}
ATTRIBUTES = {"href", "rel", "class", "start"}  # never style: the CSP would block it


class Tags(HTMLParser):
    """The tags and attributes a browser would see in the output."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def assert_safe(html: str) -> None:
    assert "<script" not in html.lower()
    for tag in re.findall(r"<[^>]*>", html):  # text's own < is always escaped: every <…> here is markup
        assert "javascript:" not in tag.lower() and not re.search(r"\son\w*\s*=", tag, re.I), tag
    for tag, attrs in Tags(html).tags:
        assert tag in TAGS, tag
        assert set(attrs) <= ATTRIBUTES, (tag, attrs)
        if "href" in attrs:
            # What a browser takes for a scheme (WHATWG URL): none means a relative address.
            scheme = re.match(r"[\t\n\r\x00-\x20]*([a-z][a-z0-9+.\-\t\n\r]*):", attrs["href"], re.I)
            assert not scheme or re.sub(r"[\t\n\r]", "", scheme.group(1)).lower() in {"http", "https", "mailto"}, attrs
            assert attrs["rel"] == "noopener nofollow"


def test_paragraphs_headings_emphasis_lists_code_and_links_render():
    html = str(render_markdown("# Title\n\nSome *em*, **strong**, ~~gone~~ and `x < y`.\nNext line.\n\n"
                               "- one\n- two\n\n3. three\n4. four\n\n> quoted\n\n[docs](https://example.org/a?b=1)"))
    assert "<h2>Title</h2>" in html  # one level below the page's own <h1>
    assert "<em>em</em>" in html and "<strong>strong</strong>" in html and "<s>gone</s>" in html
    assert "<code>x &lt; y</code>" in html
    assert "Next line." in html and "<br" in html  # a single line break stays one
    assert "<ul>\n<li>one</li>" in html and '<ol start="3">' in html and "<blockquote>" in html
    assert '<a href="https://example.org/a?b=1" rel="noopener nofollow">docs</a>' in html
    assert_safe(html)


def test_fenced_code_is_coloured_on_the_server_with_pygments_classes_only():
    html = str(render_markdown('```python\ndef f(x):\n    return "<b>" if x else None\n```'))
    assert html.startswith('<pre class="highlight"><code>')
    assert '<span class="k">def</span>' in html and '<span class="nf">f</span>' in html
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert "style=" not in html  # the CSP allows no inline styles: colours come from static/pygments.css
    # An unknown or hostile language name: the code comes out plain, still escaped, still in a code box.
    for fence in ("```nosuchlanguage", '```"><script>alert(1)</script>', "```"):
        html = str(render_markdown(fence + "\n<i>x</i>\n```"))
        assert html == '<pre class="highlight"><code>&lt;i&gt;x&lt;/i&gt;\n</code></pre>\n', fence


def test_table_columns_are_aligned_by_class_not_by_inline_style():
    html = str(render_markdown("| a | b | c |\n|:--|:-:|--:|\n| 1 | 2 | 3 |"))
    assert '<th class="align-left">a</th>' in html and '<td class="align-center">2</td>' in html
    assert 'class="align-right"' in html and "style=" not in html  # the CSP allows no inline styles
    assert_safe(html)


def test_raw_html_is_shown_as_text_never_as_markup():
    text = ('<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>\n\n'
            '<div>\n<iframe src="//evil"></iframe>\n</div>\n\n'
            'inline <b onclick="x()">b</b> <!-- c --> <a href="javascript:alert(1)">a</a> <svg onload=alert(1)>')
    html = str(render_markdown(text))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;iframe" in html and "&lt;b onclick=" in html and "&lt;svg onload=alert(1)&gt;" in html
    assert_safe(html)


@pytest.mark.parametrize("url", [
    "javascript:alert(1)", "JaVaScRiPt:alert(1)", "&#106;avascript:alert(1)", "&#x6A;avascript:alert(1)",
    "javascript&colon;alert(1)", "java%0ascript:alert(1)", "<java\tscript:alert(1)>", "<\x01javascript:alert(1)>",
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==", "data:image/png;base64,AAAA",
    "vbscript:msgbox(1)", "file:///etc/passwd", "ftp://example.org/", "blob:https://x/1",
])
def test_links_go_only_to_http_https_mailto_or_a_relative_address(url):
    for text in (f"[click]({url})", f"<{url}>", f"[click][r]\n\n[r]: {url}", f"![pic]({url})"):
        html = str(render_markdown(text))
        assert_safe(html)
        for tag, attrs in Tags(html).tags:
            if tag == "a":  # anything that stayed a link has a harmless address
                assert not re.match(r"\s*(javascript|vbscript|data|file|ftp|blob):", attrs["href"], re.I), attrs


def test_safe_links_keep_their_address_and_images_never_load():
    html = str(render_markdown("[a](http://x.org) [b](HTTPS://x.org) [c](mailto:a@b.org) [d](/chat/) [e](#top) "
                               "<https://auto.org> <me@example.org> ![pic](https://tracker.example/p.png)"))
    hrefs = [attrs["href"] for tag, attrs in Tags(html).tags if tag == "a"]
    assert hrefs == ["http://x.org", "HTTPS://x.org", "mailto:a@b.org", "/chat/", "#top", "https://auto.org",
                     "mailto:me@example.org", "https://tracker.example/p.png"]
    assert "<img" not in html  # a reply cannot make the browser fetch anything: the picture is a link
    assert_safe(html)


NESTED = {
    "quotes": ">" * 10_000 + " deep",
    "brackets": "[" * 10_000 + "x" + "]" * 10_000,
    "stars": "*" * 10_000 + "x" + "*" * 10_000,
    "star-words": "*a " * 6_000,
    "lists": "".join("  " * i + "- x\n" for i in range(1_000))[:MAX_MARKDOWN_CHARS],
    "quoted-lists": "> - " * 5_000,
    "links": "[a](" * 5_000,
    "images": "![" * 10_000,
    "backticks": "`" * 10_000 + "x",
    "angles": "<" * 10_000 + "a" + ">" * 10_000,
    "emphasis-mix": "_*~" * 6_000,
    "table": ("|" * 200 + "\n") * 90,
}


@pytest.mark.parametrize("name", NESTED)
def test_nested_hostile_markdown_renders_safely_in_bounded_time(name):
    started = time.thread_time()  # this thread's CPU time: what the input costs, whatever else the machine runs
    html = str(render_markdown(NESTED[name]))
    assert time.thread_time() - started < 5  # a blow-up (quadratic, exponential) takes minutes, not seconds
    assert_safe(html)
    assert html.count("<blockquote>") <= 20 and html.count("<ul>") <= 20  # markdown-it's maxNesting


def test_text_longer_than_the_cap_is_plain_escaped_text():
    long = "# not a heading <script>\n" + "*x* " * MAX_MARKDOWN_CHARS
    started = time.thread_time()
    html = str(render_markdown(long))
    assert time.thread_time() - started < 1
    assert html.startswith('<p class="plain"># not a heading &lt;script&gt;\n*x* ')
    assert "<h2>" not in html and "<em>" not in html
    assert "<em>x</em>" in str(render_markdown("*x* " * (MAX_MARKDOWN_CHARS // 4)))  # at the cap: rendered
    assert render_markdown("") == "" and render_markdown(None) == ""


# Markdown's punctuation, HTML's, URL schemes and event handlers, so the fuzzer builds hostile mixes.
PIECES = list("ab *_~`#>-+=|!:()[]<>&\"'\\/\n\t1.") + [
    "```", "```python\n", "\n\n", "    ", "](", "![", "<script>", "</script>", "<img src=x ", " onerror=", "onload=",
    "javascript:", "JaVaScRiPt:", "data:", "vbscript:", "&#106;", "&#x3a;", "&colon;", "%0a", "http://", "mailto:",
    "<a href=", "<!--", "-->", "<![CDATA[", "\x00", "\u2028",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=80).map("".join))
def test_fuzzed_markdown_never_yields_script_handlers_or_javascript_urls(text):
    assert_safe(str(render_markdown(text)))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_any_text_renders_safely(text):
    assert_safe(str(render_markdown(text)))


def test_the_code_colours_are_a_light_and_a_dark_theme_in_a_static_css_file():
    css = (Path(__file__).resolve().parents[3] / "static" / "pygments.css").read_text()
    light, dark = css.split("@media (prefers-color-scheme: dark)")
    assert "@media not all and (prefers-color-scheme: dark)" in light
    assert ".highlight .k {" in light and ".highlight .k {" in dark
    # Only .highlight rules: nothing that could restyle the rest of the page.
    selectors = re.findall(r"^ *([^@ }][^{\n]*)\{", css, re.M)
    assert selectors and all(s.startswith(".highlight") for s in selectors), selectors


REPLY = ('## Steps\n\nSome **bold** and `<code>`.\n\n```python\nprint("<hi>")\n```\n\n'
         '<script>alert(1)</script> [x](javascript:alert(1))')
HX = {"HX-Request": "true"}


@pytest.fixture
def markdown_app(tmp_path):
    """A chat app whose model always says REPLY."""
    from webapp.chat.model.loading import load_chat_model
    model = load_chat_model(str(tiny_checkpoint(tmp_path / "chat")), arch="script:" + REPLY.encode().hex(),
                            factory="tests.support.served_models:build_chat_model")
    app = make_app(tmp_path, {"chat": model})  # create_app registers the `markdown` filter
    yield app
    glassbox(app).core.shutdown()


def assert_rendered_reply(html: str) -> None:
    assert "<h3>Steps</h3>" in html and "<strong>bold</strong>" in html and "<code>&lt;code&gt;</code>" in html
    assert '<pre class="highlight"><code><span class="nb">print</span>' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert 'href="javascript' not in html


def test_the_final_fragment_and_the_history_page_render_the_reply_but_not_the_question(markdown_app):
    client = markdown_app.test_client()
    question = "Is **this** <b>bold</b>?\nSecond line"
    csrf = csrf_of(client, "/chat/")
    sent, events = sent_and_streamed(markdown_app, client, lambda: client.post(
        "/chat/send", data={"content": question, "csrf_token": csrf}, headers=HX))
    streamed = "".join(d for n, d in events if n == "token")
    tokens = re.sub(r'<span class="tok s\d" title="[\d.]+%">|</span>', "", streamed)  # a span per token
    assert "**bold**" in tokens and "<strong>" not in tokens  # while it streams: plain, escaped text
    assert events[-1][0] == "done"
    assert_rendered_reply(events[-1][1])
    page = client.get(sent.headers["HX-Push-Url"]).get_data(as_text=True)
    assert_rendered_reply(page)
    # A person's message stays plain text (the bubble keeps its line breaks with CSS).
    assert '<span class="text">Is **this** &lt;b&gt;bold&lt;/b&gt;?\nSecond line</span>' in page
    assert "<strong>this</strong>" not in page
    # The Markdown source rides along, escaped, for the Copy button; the button itself is made by app.js.
    assert 'data-copy="## Steps\n\nSome **bold** and `&lt;code&gt;`.' in page
    assert 'class="copy"' not in page and "pygments.css" in page
