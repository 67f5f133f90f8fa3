// Loaded first: records script errors and Content-Security-Policy
// violations on <html data-page-errors="...">, where tests (and people with
// devtools closed) can see them.
(function () {
  "use strict";
  var seen = [];
  function note(text) {
    seen.push(text);
    document.documentElement.setAttribute("data-page-errors", seen.join(" | "));
  }
  window.addEventListener("error", function (e) { note("error: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) { note("unhandled rejection: " + e.reason); });
  document.addEventListener("securitypolicyviolation", function (e) { note("CSP " + e.violatedDirective + ": " + e.blockedURI); });
})();
