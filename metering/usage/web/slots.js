// Concurrency slots of the key (GET /v1/slots): per scope, the peak in
// flight over the range and per bucket, slots taken, refused, shed and
// released, and the sheds per priority class. It follows the usage page:
// each time app.js starts a load (body data-state="loading") it reads the
// same range, window and zone, with the same token.
(function () {
  "use strict";
  var STORE = "ratewarden.portalToken";
  var $ = function (id) { return document.getElementById(id); };
  var tz = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "UTC";
  var nf = new Intl.NumberFormat();
  var plot = null;
  var seq = 0;

  function cell(tr, tag, text, value) {
    var td = document.createElement(tag);
    td.textContent = text;
    if (value !== undefined) { td.setAttribute("data-value", String(value)); }
    tr.appendChild(td);
  }

  function render(a) {
    var box = $("slots"), body = $("slots-body"), shed = $("slots-shed-body"), chart = $("slots-chart");
    body.textContent = ""; shed.textContent = ""; chart.textContent = "";
    if (plot) { plot.destroy(); plot = null; }
    if (!a.series.length) {
      box.hidden = true;
      box.setAttribute("data-state", "empty");
      return;
    }
    // Per slot set (scope, and region when recorded): counts add up over
    // buckets, the peak is the highest bucket's.
    var sets = {}, classes = {}, xs = {}, names = [];
    a.series.forEach(function (p) {
      var name = p.scope + (p.region ? " · " + p.region : "");
      var s = sets[name];
      if (!s) { s = sets[name] = { peak: 0, taken: 0, refused: 0, shed: 0, released: 0, at: {} }; names.push(name); }
      s.peak = Math.max(s.peak, p.peakInFlight);
      s.taken += p.taken; s.refused += p.refused; s.shed += p.shed; s.released += p.released;
      var x = Math.floor(new Date(p.start).getTime() / 1000);
      xs[x] = true;
      s.at[x] = p.peakInFlight;
      Object.keys(p.shedByPriority || {}).forEach(function (c) { classes[c] = (classes[c] || 0) + p.shedByPriority[c]; });
    });
    names.sort().forEach(function (name) {
      var s = sets[name], tr = document.createElement("tr");
      tr.setAttribute("data-scope", name);
      cell(tr, "th", name);
      [["peak", s.peak], ["taken", s.taken], ["refused", s.refused], ["shed", s.shed], ["released", s.released]].forEach(function (kv) {
        cell(tr, "td", nf.format(kv[1]), kv[1]);
        tr.lastChild.setAttribute("data-slot", kv[0]);
      });
      body.appendChild(tr);
    });
    var cls = Object.keys(classes).sort();
    box.querySelector(".shed").hidden = !cls.length;
    cls.forEach(function (c) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-priority", c);
      cell(tr, "th", c);
      cell(tr, "td", nf.format(classes[c]), classes[c]);
      shed.appendChild(tr);
    });
    var peak = $("slots-peak");
    peak.textContent = nf.format(a.totals.peakInFlight);
    peak.setAttribute("data-value", String(a.totals.peakInFlight));
    box.hidden = false;
    box.setAttribute("data-state", "ready");
    if (typeof uPlot === "undefined") { return; }
    var x = Object.keys(xs).map(Number).sort(function (p, q) { return p - q; });
    var series = [{}], data = [x];
    names.forEach(function (name, i) {
      series.push({ label: "Peak in flight · " + name, stroke: ["#3867d6", "#20a060", "#d63838", "#c27c00"][i % 4], width: 2 });
      data.push(x.map(function (t) { return sets[name].at[t] === undefined ? null : sets[name].at[t]; }));
    });
    var width = Math.max(260, chart.clientWidth || box.clientWidth - 32);
    plot = new uPlot({ width: width, height: 200, scales: { x: { time: true } }, series: series, axes: [{}, { size: 50 }] }, data, chart);
  }

  function load() {
    var token = sessionStorage.getItem(STORE) || "";
    if (!token) { return; }
    var mine = ++seq;
    var to = new Date(), from = new Date(to.getTime() - (+$("range").value) * 1000);
    var iso = function (d) { return d.toISOString().replace(/\.\d+Z$/, "Z"); };
    var qs = "from=" + encodeURIComponent(iso(from)) + "&to=" + encodeURIComponent(iso(to)) +
      "&window=" + encodeURIComponent($("window").value) + "&tz=" + encodeURIComponent(tz);
    $("slots").setAttribute("data-state", "loading");
    fetch("/v1/slots?" + qs, { headers: { "Authorization": "Bearer " + token }, cache: "no-store" })
      .then(function (r) {
        return r.json().then(function (b) {
          if (!r.ok) { throw new Error((b.error && b.error.message) || ("HTTP " + r.status)); }
          return b;
        });
      })
      .then(function (a) { if (mine === seq) { $("slots-status").textContent = ""; render(a); } },
        function (err) {
          if (mine !== seq) { return; }
          $("slots").hidden = false;
          $("slots").setAttribute("data-state", "error");
          $("slots-status").textContent = "Concurrency unavailable: " + err.message;
        });
  }

  new MutationObserver(function () {
    if (document.body.getAttribute("data-state") === "loading") { load(); }
  }).observe(document.body, { attributes: true, attributeFilter: ["data-state"] });
})();
