// Replay at a pace (templates/chat/_replay.html, issue 31): the reply is written again in place from its
// stored tokens, as the live stream wrote it; Stop closes the stream and puts the reply back. Without this
// file the form opens the replay on a page of its own.
(function () {
  "use strict";
  if (window.glassboxPresent) return;  // htmx runs this file again when it swaps the conversation
  window.glassboxPresent = true;

  var running = null;  // {source, item, saved, form}

  // While a conversation is presented, a replay's end goes to the followers (its start, the server says).
  function tell(state) {
    var present = document.querySelector("[data-presenting-chat]");
    var token = document.querySelector("input[name=csrf_token]");
    if (!present) return;
    fetch(present.getAttribute("data-presenting-chat"), {
      method: "POST", body: new URLSearchParams(state), credentials: "same-origin",
      headers: {"X-CSRF-Token": token ? token.value : ""}
    }).catch(function () {});
  }

  function finish(restore) {
    if (!running) return;
    var r = running;
    running = null;
    r.source.close();
    tell({view: "", message: "", ended: r.id});  // the server forgets it only if it is still the replay shown
    if (restore && r.item.isConnected) {
      // putting the reply back replaces the focused Stop button: the focus goes to Replay, not to <body>
      var hadFocus = r.item.contains(document.activeElement);
      r.item.innerHTML = r.saved;
      if (window.htmx) window.htmx.process(r.item);
      var again = hadFocus && r.item.querySelector("form[data-replay] button[type=submit]");
      if (again) again.focus({preventScroll: true});
    }
  }

  document.addEventListener("submit", function (event) {
    var form = event.target.closest && event.target.closest("form[data-replay]");
    if (!form || !window.EventSource) return;
    event.preventDefault();
    finish(true);
    var item = document.getElementById(form.getAttribute("data-replay"));
    if (!item) return;
    var pace = form.querySelector("select[name=pace]").value;
    var saved = item.innerHTML;
    var bubble = item.querySelector(".bubble");
    bubble.innerHTML = '<p class="text token-view replaying"></p>';
    var text = bubble.querySelector(".text");
    // the server tells a presented conversation's followers, who replay it on the same clock (issue 51)
    var id = String(Math.floor(Math.random() * 1e15));
    var source = new EventSource(form.action + "?pace=" + encodeURIComponent(pace) + "&replay=" + id);
    running = {source: source, item: item, saved: saved, form: form, id: id};
    var stop = item.querySelector(".replay-stop");
    if (stop) stop.hidden = false;
    item.classList.add("show-tokens", "replaying");
    source.addEventListener("token", function (e) { text.insertAdjacentHTML("beforeend", e.data); });
    source.addEventListener("done", function () {
      finish(true);
      item.classList.remove("replaying");
    });
    source.onerror = function () { finish(true); item.classList.remove("replaying"); };
  });

  document.addEventListener("click", function (event) {
    var stop = event.target.closest && event.target.closest(".replay-stop");
    if (!stop || !running) return;
    var item = running.item;
    finish(true);
    item.classList.remove("replaying");
  });

  // The live Loop-lab table follows its newest row while a run streams in, unless the reader scrolled
  // up to look at an earlier one (then it stays where they are).
  new MutationObserver(function (changes) {
    changes.forEach(function (change) {
      var body = change.target;
      if (!change.addedNodes.length || !body.matches || !body.matches("tbody[sse-swap=rows]")) return;
      var scroll = body.closest(".trace-scroll");
      if (scroll && scroll.dataset.followed !== "no") scroll.scrollTop = scroll.scrollHeight;
    });
  }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener("scroll", function (event) {
    var scroll = event.target;
    if (!scroll.classList || !scroll.classList.contains("trace-scroll")) return;
    scroll.dataset.followed = scroll.scrollHeight - scroll.scrollTop - scroll.clientHeight < 40 ? "yes" : "no";
  }, true);

  // While the Loop lab is presented, its player's loop goes to the followers (a small POST per step).
  var lastSent = "";
  function report() {
    var present = document.querySelector("[data-presenting]");
    var player = document.querySelector(".player");
    if (!present || !player) return;
    var at = player.querySelector(".player-at");
    var trace = (player.getAttribute("data-url") || "").split("/").pop();
    var body = "trace=" + encodeURIComponent(trace) + "&loop=" + encodeURIComponent(at ? at.textContent.trim() : "");
    if (body === lastSent) return;
    lastSent = body;
    var token = document.querySelector("input[name=csrf_token]");
    fetch(present.getAttribute("data-presenting"), {
      method: "POST", body: body, credentials: "same-origin",
      headers: {"Content-Type": "application/x-www-form-urlencoded", "X-CSRF-Token": token ? token.value : ""}
    }).catch(function () {});
  }
  new MutationObserver(report).observe(document.body, {childList: true, subtree: true, characterData: true});
  report();
})();
