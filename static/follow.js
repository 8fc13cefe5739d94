// A follower's page (templates/follow/chat.html, follow/loops.html; issue 31): what the presenter does, as it
// happens. Every event carries HTML the server rendered (escaped by Jinja): `conversation` replaces the
// messages, `token` adds to the live reply; `run` replaces the Loop-lab table, `rows` adds a live run's rows
// (the table keeps its newest row in sight); `player` says what the presenter points at; `replay` and
// `replay-token` write a reply again as the presenter replays it; `moved` (a presenting session's presenter
// opened another page) loads the session's page again; `done` ends it.
(function () {
  "use strict";
  function start() {
    var root = document.querySelector("[data-follow]");
    if (!root || !window.EventSource) return;
    var source = new EventSource(root.getAttribute("data-follow"));
    var live = document.getElementById("follow-live");
    var run = document.getElementById("follow-run");
    function markLoop() {
      var at = status.querySelector("[data-loop]");
      if (!run || !at) return;
      var rows = run.querySelectorAll("tbody tr");
      rows.forEach(function (row, i) { row.classList.toggle("current", i + 1 === Number(at.getAttribute("data-loop"))); });
      var row = rows[Number(at.getAttribute("data-loop")) - 1];
      if (row) row.scrollIntoView({block: "nearest"});
    }
    source.addEventListener("run", function (e) { run.innerHTML = e.data; markLoop(); });
    source.addEventListener("rows", function (e) {
      var body = run.querySelector("tbody.follow-rows");
      if (!body) return;
      body.insertAdjacentHTML("beforeend", e.data);
      var scroll = run.querySelector(".trace-scroll");
      if (scroll) scroll.scrollTop = scroll.scrollHeight;
    });
    var status = document.getElementById("follow-status");
    source.addEventListener("conversation", function (e) { live.innerHTML = e.data; });
    // The presenter replays a reply: it is written again, token by token, when the presenter's is
    // (the server sends each token on the presenter's clock); `conversation` puts it back whole.
    source.addEventListener("replay", function (e) {
      var bubble = document.querySelector("#follow-message-" + e.data + " .bubble");
      if (!bubble) return;
      var text = document.createElement("span");
      text.className = "text follow-replay";
      bubble.replaceChildren(text);
    });
    source.addEventListener("replay-token", function (e) {
      var text = live.querySelector(".follow-replay");
      if (text) text.insertAdjacentHTML("beforeend", e.data);
    });
    source.addEventListener("token", function (e) {
      var texts = live.querySelectorAll(".follow-text");
      if (texts.length) texts[texts.length - 1].insertAdjacentHTML("beforeend", e.data);
    });
    // The view the presenter has open: its read-only twin (the server's page) in place, the view's section only.
    var view = document.getElementById("presenter-view");
    function showView() {
      var at = status.querySelector("[data-view]");
      if (!view) return;
      var url = at ? at.getAttribute("data-view") : "";
      if (view.getAttribute("data-shown") === url) return;
      view.setAttribute("data-shown", url);
      if (!url) { view.replaceChildren(); return; }
      fetch(url, {credentials: "same-origin"}).then(function (r) { return r.text(); }).then(function (html) {
        if (view.getAttribute("data-shown") !== url) return;  // the presenter moved on meanwhile
        var shown = new DOMParser().parseFromString(html, "text/html").querySelector("section.glass, .sweep-page");
        view.replaceChildren(shown ? document.importNode(shown, true) : "");
        if (window.htmx) window.htmx.process(view);  // a map still being worked out follows its job's stream
      }).catch(function () {});
    }
    showView();
    source.addEventListener("player", function (e) { status.innerHTML = e.data; markLoop(); showView(); });
    // A presenting session's presenter opened another page: this follower's page becomes that page's.
    source.addEventListener("moved", function (e) { source.close(); window.location.assign(e.data); });
    source.addEventListener("done", function (e) {
      source.close();
      status.innerHTML = e.data;
      root.classList.add("follow-ended");
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
