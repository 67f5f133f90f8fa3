// Support page: find a key, inspect it, reset it with a reason
// (docs/support.md). Calls /v1/admin/keys/{search,inspect,reset} with the
// pasted operator token (Authorization header; sessionStorage only).
(function () {
  "use strict";
  var STORE = "ratewarden.operatorToken";
  var $ = function (id) { return document.getElementById(id); };
  var current = null; // {key, scope} inspected

  function token() { return sessionStorage.getItem(STORE) || ""; }

  function setState(s) { document.body.setAttribute("data-state", s); }

  function setStatus(kind, text) {
    var s = $("status");
    s.className = "status" + (kind ? " " + kind : "");
    s.textContent = text || "";
    s.hidden = !text;
  }

  function api(method, path, body) {
    var init = { method: method, headers: { "Authorization": "Bearer " + token() }, cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (b) {
        if (!r.ok) {
          var e = new Error((b.error && b.error.message) || ("HTTP " + r.status));
          e.status = r.status;
          e.code = b.error && b.error.code;
          e.body = b;
          throw e;
        }
        return b;
      });
    }, function () {
      var e = new Error("The usage API cannot be reached. Check your connection and retry.");
      e.status = 0;
      throw e;
    });
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function fmt(n) {
    if (typeof n !== "number") return String(n);
    return n !== 0 && Math.abs(n) < 0.1 ? n.toPrecision(3) : (Math.round(n * 1000) / 1000).toString();
  }

  // part adds one part: its name, where it lives, then its content or why
  // it could not be read.
  function part(name, p, fill) {
    var d = el("div", { "class": "part", "data-part": name });
    d.appendChild(el("h3", {}, name));
    if (p && p.where) d.appendChild(el("div", { "class": "where" }, p.where));
    if (p && p.error) {
      d.setAttribute("data-unread", "true");
      d.appendChild(el("p", { "class": "unread" }, "not read: " + p.error));
    } else if (fill) {
      fill(d);
    }
    $("parts").appendChild(d);
  }

  function table(d, id, head, rows) {
    var t = el("table", id ? { id: id } : {});
    var tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", { scope: "col" }, h)); });
    var th = el("thead"); th.appendChild(tr); t.appendChild(th);
    var tb = el("tbody");
    rows.forEach(function (r) {
      var row = el("tr", r.attrs || {});
      r.cells.forEach(function (c) { row.appendChild(el("td", {}, c)); });
      tb.appendChild(row);
    });
    t.appendChild(tb);
    d.appendChild(t);
    if (!rows.length) d.appendChild(el("p", { "class": "hint" }, "none"));
  }

  function bucketText(b) {
    if (!b.present) return "no bucket in the store: the key is full (" + b.capacity + " tokens)";
    return fmt(b.tokens) + " of " + b.capacity + " tokens (rate " + fmt(b.rate) + "/s), full at " + b.fullAt + ", ttl " + b.ttlMs + " ms";
  }

  function render(rep) {
    $("inspect-title").textContent = "key " + rep.key + ", scope " + rep.scope;
    $("inspect-at").textContent = rep.at;
    $("parts").textContent = "";
    part("rule", rep.rule, function (d) {
      var r = rep.rule;
      d.appendChild(el("p", { "data-field": "rule" }, r.policy + " (tier " + r.tier + ") rate " + fmt(r.limit.Rate) + "/s burst " + r.limit.Burst + ", cost " + r.cost + (r.global ? ", global" : "") + (r.dryRun ? ", dry run" : "")));
      if (r.override) {
        var o = r.override;
        d.appendChild(el("p", { "data-field": "override" }, "override of " + o.key + (o.scope ? " (scope " + o.scope + ")" : "") + ", policy log revision " + o.revision +
          (o.author ? ", by " + o.author : "") + (o.reason ? ": " + o.reason : "")));
      }
      if (r.explain) d.appendChild(el("pre", {}, r.explain));
    });
    part("bucket", rep.bucket, function (d) { d.appendChild(el("p", { "data-field": "bucket" }, bucketText(rep.bucket))); });
    if (rep.quota) part("quota", rep.quota, function (d) {
      var q = rep.quota;
      d.appendChild(el("p", { "data-field": "quota" }, q.used + " of " + q.limit + " used, " + q.left + " left (" + q.period + "), resets " + q.resetAt));
    });
    part("debt", rep.debt, function (d) { d.appendChild(el("p", { "data-field": "debt" }, rep.debt.tokens > 0 ? fmt(rep.debt.tokens) + " tokens of debt" : "none")); });
    part("reservations", rep.reservations, function (d) {
      var r = rep.reservations;
      if (r.open) table(d, "", ["id", "tokens", "expires"], r.open.map(function (o) { return { cells: [o.id, o.tokens, o.expiresAt] }; }));
      if (r.note) d.appendChild(el("p", { "class": "hint" }, r.note));
    });
    if (rep.split) part("split", rep.split, function (d) {
      table(d, "", ["sub-key", "tokens"], (rep.split.buckets || []).map(function (b) { return { cells: [b.redisKey, bucketText(b)] }; }));
    });
    if (rep.global) part("global", rep.global, function (d) {
      var g = rep.global;
      d.appendChild(el("p", { "data-field": "global-bucket" }, g.bucket ? "global bucket: " + bucketText(g.bucket) : "global bucket not read: " + (g.bucketError || "no limiter read it")));
      if (g.bucketWhere) d.appendChild(el("div", { "class": "where" }, g.bucketWhere));
      table(d, "", ["region", "pool", "read by"], (g.pools || []).map(function (p) {
        return { attrs: { "data-region": p.region }, cells: [p.region, p.error ? "not read: " + p.error : !p.present ? "no pool" :
          fmt(p.tokens) + " tokens" + (p.debt > 0 ? ", in debt by " + fmt(p.debt) : "") + ", spent " + fmt(p.spent) + (p.owed > 0 ? ", owed " + fmt(p.owed) : ""), (p.from || "") + " " + (p.redisKey || "")] };
      }));
    });
    part("limiters", {}, function (d) {
      table(d, "limiters", ["limiter", "revision", "local view", "lease"], rep.limiters.map(function (l) {
        if (l.error) return { attrs: { "data-unread": "true" }, cells: [l.url, "", "not read: " + l.error, ""] };
        var v = l.view;
        return { cells: [l.instance + " " + l.url, l.policy ? l.policy.revision : "",
          v.held ? ("store said " + fmt(v.storeTokens) + " tokens (known " + v.storeKnown + ", trusted " + v.trusted + "), local bucket " + fmt(v.localTokens)) : "not held",
          l.lease ? l.lease.tokens + " tokens" + (l.lease.hot ? " (hot)" : "") : ""] };
      }));
    });
    part("decisions", rep.decisions, function (d) {
      table(d, "decisions", ["time", "source", "allowed", "remaining", "policy", "revision", "region", "instance", "trace"], rep.decisions.rows.map(function (x) {
        return { cells: [x.time, x.kind === "decision" ? x.source : x.kind, x.allowed, x.remaining, x.policy, x.policyRevision || "", x.region, x.instance, x.traceId || ""] };
      }));
    });
    part("webhooks", rep.webhooks, function (d) {
      table(d, "", ["time", "scope", "url", "status", "outcome"], rep.webhooks.rows.map(function (x) { return { cells: [x.time, x.scope, x.url, x.statusCode, x.outcome] }; }));
    });
    part("resets", { where: "the key's audit list in the store", error: rep.resetsError }, function (d) {
      table(d, "resets", ["time", "author", "what", "result", "reason"], rep.resets.map(function (a) {
        var what = a.op + (a.grant ? " " + a.grant : "");
        if (a.before && a.after) what += ": tokens " + fmt(a.before.tokens) + " → " + fmt(a.after.tokens);
        return { attrs: { "data-result": a.result, "data-author": a.author, "data-reason": a.reason },
          cells: [a.time, a.author, what, a.result + (a.code ? " (" + a.code + ")" : ""), a.reason] };
      }));
    });
    $("inspect").hidden = false;
    $("reset-form").hidden = false;
    setState("inspected");
  }

  function inspect(key, scope) {
    current = { key: key, scope: scope };
    setStatus("", "Reading " + key + " / " + scope + " …");
    return api("GET", "/v1/admin/keys/inspect?" + new URLSearchParams({ key: key, scope: scope })).then(function (rep) {
      setStatus("", "");
      render(rep);
    }, function (e) { setStatus("error", e.message); });
  }

  function search() {
    var q = $("q").value.trim();
    if (!q) return;
    setStatus("", "Searching …");
    api("GET", "/v1/admin/keys/search?" + new URLSearchParams({ q: q })).then(function (b) {
      var ul = $("results");
      ul.textContent = "";
      b.keys.forEach(function (k) {
        var li = el("li");
        var btn = el("button", { type: "button", "data-key": k.key, "data-scope": k.scope },
          k.key + " / " + k.scope + " — " + k.requests + " requests, " + k.rejected + " rejected, last " + k.last);
        btn.addEventListener("click", function () { inspect(k.key, k.scope); });
        li.appendChild(btn);
        ul.appendChild(li);
      });
      setStatus(b.keys.length ? "" : "empty", b.keys.length ? "" : "No key beginning with " + q + " made a decision in the last day.");
      setState("searched");
    }, function (e) {
      if (e.status === 401) signOut("This token is not accepted: " + e.message);
      else setStatus("error", e.message);
    });
  }

  function reset() {
    if (!current) return;
    var out = $("reset-status");
    var body = { key: current.key, scope: current.scope, op: $("op").value, reason: $("reason").value };
    if (body.op === "grant") body.grant = parseInt($("grant").value, 10) || 0;
    out.className = "hint";
    out.textContent = "Sending …";
    api("POST", "/v1/admin/keys/reset", body).then(function (b) {
      out.className = "hint applied";
      out.setAttribute("data-result", "applied");
      out.textContent = "Applied " + body.op + " by " + (b.record && b.record.author ? b.record.author : "you") + ".";
      $("reason").value = "";
      return inspect(current.key, current.scope);
    }, function (e) {
      out.className = "hint refused";
      out.setAttribute("data-result", "refused");
      out.setAttribute("data-code", e.code || "");
      out.textContent = "Refused" + (e.code ? " (" + e.code + ")" : "") + ": " + e.message;
      return inspect(current.key, current.scope); // a refusal is audited too
    });
  }

  function signOut(msg) {
    sessionStorage.removeItem(STORE);
    $("search-form").hidden = true;
    $("inspect").hidden = true;
    $("reset-form").hidden = true;
    $("forget").hidden = true;
    setState("signed-out");
    setStatus(msg ? "error" : "", msg || "");
  }

  function signedIn() {
    $("search-form").hidden = false;
    $("forget").hidden = false;
    setState("ready");
  }

  $("token-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    sessionStorage.setItem(STORE, $("token").value.trim());
    $("token").value = "";
    signedIn();
  });
  $("forget").addEventListener("click", function () { signOut(""); });
  $("search-form").addEventListener("submit", function (ev) { ev.preventDefault(); search(); });
  $("reset-form").addEventListener("submit", function (ev) { ev.preventDefault(); reset(); });
  $("op").addEventListener("change", function () { $("grant").disabled = $("op").value !== "grant"; });
  if (token()) signedIn();
})();
