// A follower's page (templates/follow/chat.html, issue 31): the presenter's conversation as it happens.
// Every event carries HTML the server rendered (escaped by Jinja): `conversation` replaces the messages,
// `token` adds to the live reply, `player` says what the presenter points at, `done` ends it.
(function () {
  "use strict";
  function start() {
    var root = document.querySelector("[data-follow]");
    if (!root || !window.EventSource) return;
    var live = document.getElementById("follow-live");
    var status = document.getElementById("follow-status");
    var source = new EventSource(root.getAttribute("data-follow"));
    source.addEventListener("conversation", function (e) { live.innerHTML = e.data; });
    source.addEventListener("token", function (e) {
      var texts = live.querySelectorAll(".follow-text");
      if (texts.length) texts[texts.length - 1].insertAdjacentHTML("beforeend", e.data);
    });
    source.addEventListener("player", function (e) { status.innerHTML = e.data; });
    source.addEventListener("done", function (e) {
      source.close();
      status.innerHTML = e.data;
      root.classList.add("follow-ended");
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
