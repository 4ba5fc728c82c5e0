
// The status page's one script (optional: without it the page refreshes
// by its <noscript> meta tag and the trace is a download link).
(function () {
  "use strict";
  var secs = Number(document.body.getAttribute("data-refresh")) || 0;
  var reload = secs > 0 ? setTimeout(function () { location.reload(); }, secs * 1000) : 0;
  var button = document.getElementById("open-perfetto");
  var note = document.getElementById("perfetto-note");
  if (!button || !note) {
    return;
  }
  button.hidden = false;
  // Perfetto's documented handshake: open the UI, PING it until it
  // answers PONG, then post the trace (perfetto.dev/docs/visualization/
  // deep-linking-to-perfetto-ui).
  button.addEventListener("click", function () {
    var origin = "https://ui.perfetto.dev";
    clearTimeout(reload); // a reload would cut the handshake
    var win = window.open(origin); // in the click itself, or it is blocked
    if (!win) {
      note.textContent = "The browser blocked the Perfetto window: download the trace instead.";
      return;
    }
    note.textContent = "Fetching the trace\u2026";
    fetch("debug/trace", { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) {
        throw new Error("GET debug/trace answered " + r.status);
      }
      return r.arrayBuffer();
    }).then(function (buffer) {
      note.textContent = "Waiting for Perfetto\u2026";
      var tries = 0;
      var ping = setInterval(function () {
        if (++tries > 600) { // 30 s
          clearInterval(ping);
          window.removeEventListener("message", onMessage);
          note.textContent = "Perfetto did not answer: download the trace instead.";
          return;
        }
        win.postMessage("PING", origin);
      }, 50);
      function onMessage(e) {
        if (e.origin !== origin || e.data !== "PONG") {
          return;
        }
        clearInterval(ping);
        window.removeEventListener("message", onMessage);
        win.postMessage({ perfetto: { buffer: buffer, title: "stagehost " + location.host, url: location.href } }, origin);
        note.textContent = "Sent to Perfetto. This page stopped refreshing; reload it to resume.";
      }
      window.addEventListener("message", onMessage);
    }).catch(function (err) {
      note.textContent = String(err);
    });
  });
})();
