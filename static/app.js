// Glassbox's own behaviour on top of htmx. No build step; the pages work without it.
(function () {
  "use strict";

  // Enter sends, Shift+Enter adds a line (in any textarea marked data-enter-submits).
  document.addEventListener("keydown", function (event) {
    var box = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    if (!(box instanceof HTMLTextAreaElement) || !box.hasAttribute("data-enter-submits")) return;
    event.preventDefault();
    if (box.form && box.value.trim() !== "") box.form.requestSubmit();
  });

  // Follow a streaming reply, unless the reader scrolled up to read something else.
  var stickToBottom = true;
  function nearBottom() {
    var doc = document.scrollingElement || document.documentElement;
    return doc.scrollHeight - doc.scrollTop - doc.clientHeight < 80;
  }
  window.addEventListener("scroll", function () { stickToBottom = nearBottom(); }, { passive: true });
  function follow() {
    if (stickToBottom && document.querySelector("[data-autoscroll]")) {
      window.scrollTo(0, document.scrollingElement.scrollHeight);
    }
  }
  document.addEventListener("htmx:sseMessage", follow);
  document.addEventListener("htmx:afterSettle", follow);
  // After a send, the new composer takes the focus back. On afterSwap, the same task as the swap
  // (afterSettle comes a settle delay later), so nobody ever finds the focus on <body> in between.
  document.addEventListener("htmx:afterSwap", function (event) {
    var composer = document.getElementById("content");
    if (composer && event.target && event.target.id === "conversation") composer.focus();
  });
  document.addEventListener("DOMContentLoaded", function () { stickToBottom = true; follow(); });

  // No answer at all, or one that is not the app's (a proxy's 502 while it restarts): say so,
  // rather than leave a button that seems to do nothing. The text is the page's own.
  function unreachable() {
    var flash = document.getElementById("flash");
    if (flash) flash.textContent = flash.getAttribute("data-unreachable");
  }
  document.addEventListener("htmx:sendError", unreachable);
  document.addEventListener("htmx:responseError", unreachable);
  // A message in #flash is about the last action: the next one starts with it cleared.
  document.addEventListener("htmx:beforeRequest", function () {
    var flash = document.getElementById("flash");
    if (flash) flash.textContent = "";
  });

  // A swap that removes the focused control (a Stop button, once its reply or run is final) would
  // drop a keyboard user back to the top of the page: move the focus to the page's main control
  // (the one marked autofocus) or to <main> instead.
  var focusBeforeSwap = null;
  function rememberFocus() { focusBeforeSwap = document.activeElement; }
  document.addEventListener("htmx:beforeSwap", rememberFocus);
  document.addEventListener("htmx:sseBeforeMessage", rememberFocus);
  document.addEventListener("htmx:afterSwap", function () {
    var lost = focusBeforeSwap && focusBeforeSwap !== document.body && !focusBeforeSwap.isConnected;
    focusBeforeSwap = null;
    if (!lost || (document.activeElement && document.activeElement !== document.body)) return;
    var fallback = document.querySelector("main [autofocus]") || document.getElementById("main");
    if (fallback) fallback.focus({ preventScroll: true });
  });

  // A Copy button for each finished message and each code block in a reply. Made here, so there is
  // none without JavaScript, nor where the browser has no Clipboard API (pages not served over https
  // or from localhost): a button that cannot work is worse than none.
  function copyButton(text) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    function say(label) {  // for a moment, then the button's name again
      button.textContent = label;
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(text()).then(function () { say("Copied"); }, function () { say("Not copied"); });
    });
    return button;
  }
  function addCopyButtons() {
    if (!navigator.clipboard) return;
    document.querySelectorAll("li.message:not(.pending)").forEach(function (message) {
      var meta = message.querySelector(".meta");
      var bubble = message.querySelector(".bubble");
      if (!meta || !bubble || meta.querySelector(".copy")) return;
      // A reply's Markdown source (data-copy), not its rendering; a person's text as it is.
      var text = function () {
        return bubble.hasAttribute("data-copy") ? bubble.getAttribute("data-copy") : bubble.textContent;
      };
      if (text()) meta.insertBefore(copyButton(text), meta.querySelector("form, details"));
    });
    document.querySelectorAll(".markdown pre").forEach(function (pre) {
      if (pre.parentElement.classList.contains("code-block")) return;
      var block = document.createElement("div");
      block.className = "code-block";
      pre.replaceWith(block);
      block.append(copyButton(function () { return pre.textContent; }), pre);
    });
  }
  document.addEventListener("DOMContentLoaded", addCopyButtons);
  document.addEventListener("htmx:load", addCopyButtons);  // a final reply, a swapped conversation
})();

// Issue 14: the Enter hint where Enter does send, and the Loop lab's player.
(function () {
  "use strict";

  // Without JavaScript Enter adds a line, so the page's placeholder does not promise otherwise.
  function enterHints() {
    document.querySelectorAll("textarea[data-enter-placeholder]").forEach(function (box) {
      box.placeholder = box.getAttribute("data-enter-placeholder");
    });
  }
  document.addEventListener("DOMContentLoaded", enterHints);
  document.addEventListener("htmx:load", enterHints);

  // The player (templates/loops/_player.html): its links and slider are plain GETs of ?loop=N;
  // here they step in place, the keyboard's arrows, Home and End step too, and Play runs at
  // 1, 4 or 16 loops a second. Rows after the current loop are held back (class "ahead").
  function setupPlayer(nav) {
    if (nav.hasAttribute("data-ready")) return;
    nav.setAttribute("data-ready", "");
    var results = nav.closest(".results") || document;
    var rows = Array.prototype.slice.call(results.querySelectorAll(".trace-table tbody tr"));
    var total = rows.length;
    if (!total) return;
    var at = parseInt(nav.getAttribute("data-current"), 10) || total;
    var url = nav.getAttribute("data-url");
    var range = nav.querySelector("input[type=range]");
    var now = nav.querySelector(".player-now");
    var nodes = results.querySelectorAll(".graph .node[data-symbol]");
    var mark = results.querySelector(".chart .now-mark");
    var play = nav.querySelector(".player-play");
    var toggle = nav.querySelector(".player-toggle");
    var speed = nav.querySelector(".player-speed");
    var links = nav.querySelectorAll("a[data-to]");
    var attention = results.querySelector(".loop-attention");  // one loop's, rendered by the server
    var reload = attention && attention.querySelector(".attention-reload");
    if (reload) {  // the address already says ?loop=N (replaceState): a link there would only scroll
      reload.addEventListener("click", function (event) {
        event.preventDefault();
        history.replaceState(null, "", url + "?loop=" + at + "#attention");
        location.reload();
      });
    }
    var timer = null;
    var ownPage = new URL(url, location.href).pathname === location.pathname;

    function target(name) {
      return { first: 1, prev: at - 1, next: at + 1, last: total }[name];
    }
    function keepInView(row) {  // inside the table's own scroll box, never the page
      var box = row.closest(".trace-scroll");
      if (!box) return;
      var r = row.getBoundingClientRect(), b = box.getBoundingClientRect();
      if (r.top < b.top + 30) box.scrollTop -= (b.top + 30 - r.top);
      else if (r.bottom > b.bottom) box.scrollTop += (r.bottom - b.bottom);
    }
    function show(n) {
      at = Math.max(1, Math.min(total, n));
      rows.forEach(function (row, i) {
        row.classList.toggle("ahead", i + 1 > at);
        row.classList.toggle("current", i + 1 === at);
      });
      var row = rows[at - 1];
      var predicted = row.cells[1].querySelector("strong").textContent;
      var expected = row.cells[2].textContent.trim();
      var right = row.cells[3].classList.contains("ok");
      nodes.forEach(function (node) { node.classList.toggle("current", node.getAttribute("data-symbol") === predicted); });
      if (mark) {
        var x = parseFloat(mark.getAttribute("data-x0")) + parseFloat(mark.getAttribute("data-dx")) * (at - 1);
        mark.setAttribute("x1", x.toFixed(1));
        mark.setAttribute("x2", x.toFixed(1));
      }
      range.value = at;
      now.querySelector(".player-at").textContent = at;
      now.querySelector(".player-detail").textContent =
        "predicted " + predicted + ", expected " + expected + " — " + (right ? "right" : "wrong");
      now.setAttribute("aria-live", timer ? "off" : "polite");  // playing: no announcement per loop
      links.forEach(function (a) {
        var name = a.getAttribute("data-to");
        a.href = url + "?loop=" + Math.max(1, Math.min(total, target(name))) + "#player";
        var off = (name === "first" || name === "prev") ? at === 1 : at === total;
        if (off) a.setAttribute("aria-disabled", "true"); else a.removeAttribute("aria-disabled");
      });
      if (attention) {  // stepping in place leaves it on its own loop: say so, and link to the current one
        var stale = parseInt(attention.getAttribute("data-loop"), 10) !== at;
        attention.classList.toggle("stale", stale);
        var note = attention.querySelector(".attention-stale");
        if (note) {
          note.hidden = !stale;
          note.querySelector("a").href = url + "?loop=" + at + "#attention";
        }
      }
      keepInView(row);
      if (ownPage) history.replaceState(null, "", url + "?loop=" + at);
      if (group && !following) {  // the players of one link step together (two traces compared)
        document.dispatchEvent(new CustomEvent("glassbox:player-step", { detail: { group: group, at: at, from: nav } }));
      }
    }
    var group = nav.getAttribute("data-link");
    var following = false;
    if (group) {
      document.addEventListener("glassbox:player-step", function (event) {
        var d = event.detail;
        if (d.group !== group || d.from === nav) return;
        following = true;
        try { stop(); show(d.at); } finally { following = false; }
      });
    }
    function stop() {
      if (!timer) return;
      clearInterval(timer);
      timer = null;
      toggle.setAttribute("aria-pressed", "false");
      toggle.querySelector(".player-toggle-label").textContent = "Play";
      now.setAttribute("aria-live", "polite");
    }
    function start() {
      stop();
      if (at >= total) show(1);
      toggle.setAttribute("aria-pressed", "true");
      toggle.querySelector(".player-toggle-label").textContent = "Pause";
      timer = setInterval(function () {
        if (at >= total) { stop(); return; }
        show(at + 1);
      }, 1000 / (parseFloat(speed.value) || 4));
      now.setAttribute("aria-live", "off");
    }

    links.forEach(function (a) {
      a.addEventListener("click", function (event) {
        event.preventDefault();
        stop();
        show(target(a.getAttribute("data-to")));
      });
    });
    range.addEventListener("input", function () { stop(); show(parseInt(range.value, 10)); });
    nav.querySelector(".player-jump").addEventListener("submit", function (event) {
      event.preventDefault();
      stop();
      show(parseInt(range.value, 10));
    });
    nav.addEventListener("keydown", function (event) {
      var t = event.target;
      if (t === range || t.tagName === "SELECT" || event.altKey || event.ctrlKey || event.metaKey) return;
      var to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 1, End: total }[event.key];
      if (to === undefined) return;
      event.preventDefault();
      stop();
      show(to);
    });
    play.hidden = false;
    toggle.addEventListener("click", function () { if (timer) stop(); else start(); });
    speed.addEventListener("change", function () { if (timer) start(); });
  }
  // Run: the results are brought into view (on a phone they are below the 26-row editor). Heard on the
  // new results: the form that asked is replaced too (the editor comes back without stale errors), and
  // an event on a detached element reaches nobody.
  document.addEventListener("htmx:afterSwap", function (event) {
    var config = event.detail && event.detail.requestConfig;
    var from = config && config.elt;
    var results = event.target;
    if (!from || !from.hasAttribute || !from.hasAttribute("data-show-results")) return;
    if (!results || results.id !== "results" || !results.hasAttribute("aria-busy")) return;  // a run started
    results.scrollIntoView({ block: "start" });
  });

  // A streaming reply's "Show tokens": flip its view at once; htmx tells the server, which remembers it
  // for the finished reply (without JavaScript the form posts and the page comes back the same way).
  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = event.detail && event.detail.elt;
    if (!form || !form.matches || !form.matches("form[data-live-tokens]")) return;
    var item = form.closest("li.message");
    var on = item.classList.toggle("show-tokens");
    form.querySelector("input[name=view]").value = on ? "text" : "tokens";
    var button = form.querySelector("button");
    button.classList.toggle("on", on);
    button.textContent = on ? "Hide tokens" : "Show tokens";
  });

  function setupPlayers() { document.querySelectorAll(".player").forEach(setupPlayer); }
  document.addEventListener("DOMContentLoaded", setupPlayers);
  document.addEventListener("htmx:load", setupPlayers);
})();
