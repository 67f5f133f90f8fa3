// Usage dashboard: reads /v1/usage and /v1/quota with the pasted portal token
// (Authorization header; the token is kept in sessionStorage, never in a URL).
(function () {
  "use strict";
  var STORE = "ratewarden.portalToken";
  var MAX_RANGE = { minute: 172800, hour: 93 * 86400, day: 3700 * 86400 };
  var $ = function (id) { return document.getElementById(id); };
  var tz = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "UTC";
  var plots = [];
  var retryTimer = 0;
  var nf = new Intl.NumberFormat();

  function token() { return sessionStorage.getItem(STORE) || ""; }

  function setStatus(kind, text) {
    var s = $("status");
    s.className = "status" + (kind ? " " + kind : "");
    s.textContent = text || "";
    s.hidden = !text;
  }

  function api(path) {
    return fetch(path, { headers: { "Authorization": "Bearer " + token() }, cache: "no-store" })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (!r.ok) {
            var e = new Error((body.error && body.error.message) || ("HTTP " + r.status));
            e.status = r.status;
            throw e;
          }
          return body;
        });
      }, function () {
        var e = new Error("The usage API cannot be reached. Check your connection and retry.");
        e.status = 0;
        throw e;
      });
  }

  function explain(err) {
    switch (err.status) {
      case 401: return "This token is not accepted (" + err.message + "). It may be mistyped, expired or revoked: ask your provider for a new one.";
      case 403: return "This token may not read that data: " + err.message;
      case 400: return "The request was refused: " + err.message;
      case 503: return "Usage data is temporarily unavailable. Retry in a moment. (" + err.message + ")";
      default: return err.message;
    }
  }

  // Keeps the window consistent with the range (the API caps points per answer).
  function fitWindow() {
    var range = +$("range").value, w = $("window");
    if (range > MAX_RANGE[w.value]) { w.value = range > MAX_RANGE.hour ? "day" : "hour"; }
    Array.prototype.forEach.call(w.options, function (o) { o.disabled = range > MAX_RANGE[o.value]; });
  }

  // Bucket starts from..to in the browser's zone (the tz sent to the API).
  function buckets(from, to, win) {
    var out = [], t = new Date(from.getTime());
    for (var i = 0; t < to && i < 10000; i++) {
      out.push(Math.floor(t.getTime() / 1000));
      if (win === "minute") t = new Date(t.getTime() + 60000);
      else if (win === "hour") t = new Date(t.getTime() + 3600000);
      else t = new Date(t.getFullYear(), t.getMonth(), t.getDate() + 1);
    }
    return out;
  }

  function render(usage) {
    plots.forEach(function (p) { p.destroy(); });
    plots = [];
    var charts = $("charts");
    charts.textContent = "";
    ["requests", "allowed", "rejected", "cost"].forEach(function (k) {
      var el = $("total-" + k);
      el.textContent = nf.format(usage.totals[k]);
      el.setAttribute("data-value", String(usage.totals[k]));
    });
    $("summary").hidden = false;
    $("who").textContent = "key " + usage.key;
    $("who").hidden = false;
    if (!usage.series.length) {
      setStatus("empty", "No traffic in this range. Pick a longer range, or come back after some requests.");
      return;
    }
    setStatus("", "");
    renderRegions(usage.series);
    var xs = buckets(new Date(usage.from), new Date(usage.to), usage.window);
    var index = {};
    xs.forEach(function (x, i) { index[x] = i; });
    var byScope = {};
    usage.series.forEach(function (p) {
      var x = Math.floor(new Date(p.start).getTime() / 1000);
      if (!(x in index)) { index[x] = xs.length; xs.push(x); }
      (byScope[p.scope] = byScope[p.scope] || []).push([x, p]);
    });
    var order = xs.map(function (x, i) { return [x, i]; }).sort(function (a, b) { return a[0] - b[0]; });
    var sortedX = order.map(function (o) { return o[0]; });
    var pos = {};
    sortedX.forEach(function (x, i) { pos[x] = i; });
    Object.keys(byScope).sort().forEach(function (scope) {
      var req = sortedX.map(function () { return 0; }), ok = req.slice(), rej = req.slice();
      byScope[scope].forEach(function (e) { var i = pos[e[0]]; req[i] += e[1].requests; ok[i] += e[1].allowed; rej[i] += e[1].rejected; });
      var box = document.createElement("article");
      box.className = "card chart";
      box.setAttribute("data-scope", scope);
      var h = document.createElement("h3");
      h.textContent = "Scope " + scope;
      // A scope whose policy names a cost unit (tokens, say) shows its
      // cost in that unit: its actual cost, settles included.
      var unit = usage.units && usage.units[scope];
      if (unit) {
        var spent = 0;
        byScope[scope].forEach(function (e) { spent += e[1].cost; });
        var u = document.createElement("span");
        u.className = "unit";
        u.setAttribute("data-unit", unit);
        u.setAttribute("data-value", String(spent));
        u.textContent = " · " + nf.format(spent) + " " + unit;
        h.appendChild(u);
      }
      var plotEl = document.createElement("div");
      plotEl.className = "plot";
      box.appendChild(h); box.appendChild(plotEl);
      charts.appendChild(box);
      var width = Math.max(260, plotEl.clientWidth || charts.clientWidth - 32);
      var p = new uPlot({
        width: width, height: 220,
        scales: { x: { time: true } },
        series: [
          {},
          { label: "Requests", stroke: "#3867d6", width: 2 },
          { label: "Allowed", stroke: "#20a060", width: 2 },
          { label: "Rejected", stroke: "#d63838", width: 2 }
        ],
        axes: [{}, { size: 60 }]
      }, [sortedX, req, ok, rej], plotEl);
      plots.push(p);
    });
  }

  // Usage per region of the deciding limiters (the charts and totals are
  // summed over regions), shown when any usage carries a region: a global
  // key is one limit shared by every region. Usage recorded without a region
  // is the row "(no region)".
  function renderRegions(series) {
    var box = $("regions"), body = $("regions-body");
    var sums = {}, named = false;
    series.forEach(function (p) {
      var r = p.region || "";
      if (r) { named = true; }
      var s = sums[r] = sums[r] || { requests: 0, allowed: 0, rejected: 0, cost: 0 };
      s.requests += p.requests; s.allowed += p.allowed; s.rejected += p.rejected; s.cost += p.cost;
    });
    body.textContent = "";
    box.hidden = !named;
    if (!named) { return; }
    Object.keys(sums).sort(function (a, b) { return (a === "") - (b === "") || (a < b ? -1 : a > b ? 1 : 0); }).forEach(function (r) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-region", r);
      [r || "(no region)", sums[r].requests, sums[r].allowed, sums[r].rejected, sums[r].cost].forEach(function (v, i) {
        var td = document.createElement(i ? "td" : "th");
        td.textContent = i ? nf.format(v) : v;
        if (i) { td.setAttribute("data-value", String(v)); }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }

  // One block per quota counter the key spends (the enforced rule, the
  // window's limit, what the usage record says was used, what the limiter's
  // counter in Redis says is left, when it resets), and a plain notice when
  // Redis and the record disagree.
  function renderQuota(q) {
    var body = $("quota-body"), badge = $("soft-state");
    badge.textContent = q.softLimit.state === "none" ? "no soft limit" : (q.softLimit.state === "warning" ? "soft limit reached" : "below soft limit");
    badge.className = "badge " + q.softLimit.state;
    body.textContent = "";
    var p = function (parent, text, cls) { var e = document.createElement("p"); e.textContent = text; if (cls) { e.className = cls; } parent.appendChild(e); return e; };
    var list = q.quotas || (q.quota ? [q.quota] : []);
    if (!list.length) {
      p(body, "Tier " + (q.tier || "–") + ": no quota, only rate limits.", "hint");
    }
    list.forEach(function (c) {
      var box = document.createElement("section");
      box.className = "counter";
      box.setAttribute("data-quota", c.quotaId);
      body.appendChild(box);
      var h = document.createElement("h3");
      h.textContent = (c.source === "tier" ? "Tier " + c.rule : "Rule " + c.rule) + " · " + c.period + "ly quota" + (c.dryRun ? " (dry run)" : "");
      box.appendChild(h);
      var pct = Math.min(100, c.percentUsed);
      var meter = document.createElement("div");
      meter.className = "meter" + (pct >= 100 ? " full" : (q.softLimit.percent && pct >= q.softLimit.percent ? " warning" : ""));
      var fill = document.createElement("span");
      fill.style.width = pct.toFixed(1) + "%";
      meter.appendChild(fill);
      box.appendChild(meter);
      p(box, nf.format(c.used) + " of " + nf.format(c.limit) + " tokens this " + c.period + " (" + c.percentUsed.toFixed(1) + "%)");
      var left = c.redis ? nf.format(c.redis.remaining) + " left according to the limiter" : nf.format(c.remaining) + " remaining";
      p(box, left + " · resets " + new Date(c.resetsAt).toLocaleString(), "hint enforced");
      if (c.scopes && c.scopes.length) {
        p(box, "Counts " + c.scopes.join(", "), "hint");
      }
      if (c.consistency && (c.consistency.state === "redis_behind" || c.consistency.state === "redis_ahead")) {
        p(box, c.consistency.message, "notice " + c.consistency.state).setAttribute("role", "status");
      }
    });
    if (q.softLimit.percent) {
      p(body, "Soft limit at " + q.softLimit.percent + "% · " + nf.format(q.softLimit.warningsLastHour) + " warned decisions in the last hour", "hint");
    }
  }

  // "YYYY-MM" of the month n months from the current one, in the
  // browser's zone (the tz sent to the API).
  function month(n) {
    var d = new Date(), m = new Date(d.getFullYear(), d.getMonth() + n, 1);
    return m.getFullYear() + "-" + String(m.getMonth() + 1).padStart(2, "0");
  }

  // One statement: its state, totals, and a line per meter, correction and
  // adjustment (corrections and adjustments are lines of their own).
  function renderStatement(el, label, st) {
    el.textContent = "";
    el.setAttribute("data-period", st.period);
    el.setAttribute("data-state", st.state);
    var h = document.createElement("h3");
    h.textContent = label + " · " + st.period + " · " + st.state;
    el.appendChild(h);
    var dl = document.createElement("p");
    dl.className = "totals";
    [["requests", "requests"], ["cost", "cost units"]].forEach(function (k, i) {
      var b = document.createElement("strong");
      b.setAttribute("data-total", k[0]);
      b.setAttribute("data-value", String(st.totals[k[0]]));
      b.textContent = nf.format(st.totals[k[0]]);
      dl.appendChild(b);
      dl.appendChild(document.createTextNode(" " + k[1] + (i ? "" : " · ")));
    });
    el.appendChild(dl);
    var table = document.createElement("table"), body = document.createElement("tbody");
    var head = document.createElement("thead");
    head.innerHTML = "<tr><th scope=\"col\">Line</th><th scope=\"col\">Requests</th><th scope=\"col\">Cost</th></tr>";
    table.appendChild(head);
    table.appendChild(body);
    var row = function (kind, text, req, cost) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-line", kind);
      [text, req, cost].forEach(function (v, i) {
        var td = document.createElement(i ? "td" : "th");
        td.textContent = i ? nf.format(v) : v;
        if (i) { td.setAttribute("data-value", String(v)); }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    };
    st.meters.forEach(function (m) { row("meter", "Scope " + m.scope + (m.unit ? " (" + m.unit + ")" : ""), m.requests, m.cost); });
    st.corrections.forEach(function (c) { row("correction", "Correction " + c.id + (c.reason ? ": " + c.reason : ""), c.requests, c.cost); });
    st.adjustments.forEach(function (a) { row("adjustment", "Adjustment for " + a.period, a.requests, a.cost); });
    if (!body.children.length) { row("none", "No usage", 0, 0); }
    el.appendChild(table);
  }

  function loadStatements() {
    var q = function (p) { return api("/v1/statement?period=" + p + "&tz=" + encodeURIComponent(tz)); };
    return Promise.all([q(month(0)), q(month(-1))]).then(function (sts) {
      $("billing-status").textContent = "";
      renderStatement($("period-current"), "This month", sts[0]);
      renderStatement($("period-previous"), "Last month", sts[1]);
      $("billing").hidden = false;
    }, function (err) {
      $("billing").hidden = false;
      $("billing-status").textContent = "Statements unavailable: " + explain(err);
    });
  }

  function load() {
    clearTimeout(retryTimer);
    if (!token()) { return; }
    fitWindow();
    var to = new Date(), from = new Date(to.getTime() - (+$("range").value) * 1000);
    var qs = "from=" + encodeURIComponent(from.toISOString().replace(/\.\d+Z$/, "Z")) +
      "&to=" + encodeURIComponent(to.toISOString().replace(/\.\d+Z$/, "Z")) +
      "&window=" + encodeURIComponent($("window").value) + "&group_by=scope,region&tz=" + encodeURIComponent(tz);
    $("controls").hidden = false;
    $("forget").hidden = false;
    setStatus("", "Loading…");
    document.body.setAttribute("data-state", "loading");
    var usage = api("/v1/usage?" + qs).then(render);
    var quota = api("/v1/quota").then(renderQuota, function (err) {
      $("quota-body").textContent = "Quota unavailable: " + explain(err);
    });
    Promise.all([usage, quota, loadStatements()]).then(function () {
      document.body.setAttribute("data-state", "ready");
    }, function (err) {
      setStatus("error", explain(err));
      document.body.setAttribute("data-state", "error");
      // The service recovers by itself when its store comes back: try again.
      if (err.status === 503 || err.status === 0) {
        clearTimeout(retryTimer);
        retryTimer = setTimeout(load, 10000);
      }
    });
  }

  $("token-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(STORE, t);
    $("token").value = "";
    load();
  });
  $("forget").addEventListener("click", function () {
    sessionStorage.removeItem(STORE);
    location.reload();
  });
  $("range").addEventListener("change", load);
  $("window").addEventListener("change", load);
  $("refresh").addEventListener("click", load);
  window.addEventListener("resize", function () {
    plots.forEach(function (p) {
      var w = p.root.parentNode.clientWidth;
      if (w > 0) p.setSize({ width: w, height: 220 });
    });
  });
  $("tz").textContent = "Times in " + tz;
  fitWindow();
  if (token()) load();
})();
