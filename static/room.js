// Issue 31: what a presenter's room needs on top of htmx. No build step; the pages work without it.
(function () {
  "use strict";

  // -- The Loop lab's state survives reload, the theme button and a visit elsewhere (item 4) ------------
  // This tab's last table (start, steps, model, the rules in order) and the lab page it was on, kept in
  // sessionStorage; and in localStorage too, so a new tab (the Loop lab opened beside Chat) starts from the
  // last table edited in any tab, while each tab then keeps its own. Without JavaScript the form posts carry
  // the table, and a run redirects to its trace.
  var KEY = "glassbox.loops.editor";

  function editorValues(form) {
    var params = new URLSearchParams();
    ["start", "steps", "model"].forEach(function (name) {
      var field = form.elements.namedItem(name);
      if (field && field.value !== undefined) params.append(name, field.value);
    });
    form.querySelectorAll("input[name=src]").forEach(function (src) {
      var dst = src.closest(".rule").querySelector("select[name=dst]");
      params.append("src", src.value);
      params.append("dst", dst ? dst.value : "");
    });
    return params.toString();
  }
  function stored() {
    try {
      return JSON.parse(sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "null");
    } catch (e) { return null; }
  }
  function store(form) {
    try {
      var state = JSON.stringify({ path: location.pathname, form: editorValues(form) });
      sessionStorage.setItem(KEY, state);
      localStorage.setItem(KEY, state);
    } catch (e) { /* storage off: the page still works, it only forgets */ }
    pointNav();
  }
  // The Loop lab's link in the top bar goes back to the lab page this tab was last on (a run's trace).
  function pointNav() {
    var saved = stored();
    var link = document.querySelector(".topbar nav a[data-lab]");
    if (!link || !saved || !saved.path) return;
    var home = new URL(link.getAttribute("data-lab"), location.href).pathname;
    if (saved.path.indexOf(home) === 0) link.href = saved.path;
  }
  function restore(form) {
    var saved = stored();
    if (!saved || saved.path !== location.pathname || saved.form === editorValues(form)) return false;
    var values = {};
    new URLSearchParams(saved.form).forEach(function (value, name) {
      (values[name] = values[name] || []).push(value);
    });
    ["start", "steps", "model"].forEach(function (name) { if (values[name]) values[name] = values[name][0]; });
    var csrf = form.querySelector("input[name=csrf_token]");
    if (csrf) values.csrf_token = csrf.value;
    values.action = "";
    htmx.ajax("POST", form.getAttribute("data-editor-url"), { target: "#editor", swap: "outerHTML", values: values });
    return true;
  }
  // A live run that is now saved: its trace's page becomes the address (Back returns to the lab).
  function adoptAddress() {
    var results = document.querySelector("#results[data-address]");
    if (!results) return;
    var address = results.getAttribute("data-address");
    results.removeAttribute("data-address");
    if (new URL(address, location.href).pathname !== location.pathname) history.pushState(null, "", address);
    var form = document.getElementById("editor");
    if (form) store(form);
  }

  document.addEventListener("DOMContentLoaded", function () {
    pointNav();
    var form = document.getElementById("editor");
    if (form && !restore(form)) store(form);
  });
  document.addEventListener("change", function (event) {
    var form = event.target.closest && event.target.closest("#editor");
    if (form) store(form);
  });
  document.addEventListener("input", function (event) {
    var form = event.target.closest && event.target.closest("#editor");
    if (form) store(form);
  });
  document.addEventListener("htmx:afterSettle", function () {
    adoptAddress();
    var form = document.getElementById("editor");
    if (form) store(form);
  });
  document.addEventListener("htmx:sseMessage", adoptAddress);

  // The theme button returns to this page as it is now (an address changed since it was drawn).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches(".theme-form, .present-form")) return;
    var next = form.querySelector("input[name=next]");
    if (next) next.value = location.pathname + location.search;
  });
})();

// Issue 31, item 6: on a phone the conversation list starts folded (it is open without JavaScript).
(function () {
  "use strict";
  var narrow = window.matchMedia("(max-width: 50rem)");
  function fold(root) {
    if (!narrow.matches) return;
    (root || document).querySelectorAll("#conversations details.conversation-list[open]").forEach(function (d) {
      if (!d.hasAttribute("data-folded")) { d.open = false; d.setAttribute("data-folded", ""); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { fold(); });
  document.addEventListener("htmx:load", function () { fold(); });
})();
