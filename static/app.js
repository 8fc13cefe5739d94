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
  document.addEventListener("htmx:afterSettle", function (event) {
    follow();
    // After a send, the new composer takes the focus back.
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
  document.addEventListener("htmx:afterSettle", function () {
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
