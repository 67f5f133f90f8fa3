-- POST /check on one key that is far over its limit (a flood).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"key":"flood_key","scope":"api"}'
