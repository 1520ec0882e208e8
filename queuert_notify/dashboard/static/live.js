// Live pages: the server pushes a page's live region over server-sent events
// (queuert_notify/dashboard/live.py) whenever it changed; this swaps it in.
// The HTML comes from the server's own templates, escaped there; scripts inside it
// would not run (innerHTML never runs them, and the page's CSP allows none inline).
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live-url");
  var region = document.getElementById("live");
  var badge = document.getElementById("live-state");
  if (!url || !region || !window.EventSource) {
    return;
  }
  var source = new EventSource(url);
  function show(text, on) {
    if (badge) {
      badge.textContent = text;
      badge.className = on ? "live-on" : "live-off";
    }
  }
  source.addEventListener("hello", function (event) {
    show(event.data === "notify" ? "live" : "refreshing every 15 s", true);
  });
  source.addEventListener("update", function (event) {
    // Keep open <details> open across an update.
    var open = {};
    region.querySelectorAll("details[data-job-id]").forEach(function (d) {
      open[d.getAttribute("data-job-id")] = d.open;
    });
    region.innerHTML = event.data;
    region.querySelectorAll("details[data-job-id]").forEach(function (d) {
      var id = d.getAttribute("data-job-id");
      if (id in open) {
        d.open = open[id];
      }
    });
    region.setAttribute("data-updates", String(Number(region.getAttribute("data-updates") || 0) + 1));
  });
  source.addEventListener("error", function () {
    show("reconnecting…", false);
  });
})();
