// The operator page (GET /limits) refreshes its live part every few
// seconds without reloading: it fetches GET /limits/live, the same part
// rendered by the server, and puts it in place. When the token is no
// longer accepted it reloads, which shows the sign-in form.
(function () {
  'use strict';
  var live = document.getElementById('live');
  if (!live) {
    return;
  }
  var every = 3000;
  function refresh() {
    fetch('/limits/live', { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        if (r.status === 401 || r.status === 403) {
          window.location.reload();
          return null;
        }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          live.innerHTML = html;
        }
      })
      .catch(function () { /* the next refresh tries again */ })
      .finally(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
