-- POST /check over 10,000 keys, uniformly at random (the allowed path when
-- the keys' limit is high).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local bodies = {}
for i = 1, 10000 do
  bodies[i] = '{"key":"acct_' .. i .. '","scope":"api"}'
end
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
request = function()
  return wrk.format(nil, nil, nil, bodies[math.random(10000)])
end
