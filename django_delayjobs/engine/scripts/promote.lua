-- Move due ids from pending to the tail of ready, at most ARGV[1] of them: the ids of one
-- call in priority order (highest first), ids of equal priority in due-time order.
-- KEYS[1] = pending ZSET, KEYS[2] = ready LIST, KEYS[3] = ready_set SET,
-- KEYS[4] = notify LIST, KEYS[5] = priority HASH
-- ARGV[1] = batch size
-- returns {moved, server now (whole ms), and when pending is not empty: the next due time
-- (ms) and how long until then (us: a caller that sleeps that long wakes on time)}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- exact: due times hold us
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  if #ids > 1 and redis.call('HLEN', KEYS[5]) > 0 then
    local priorities = redis.call('HMGET', KEYS[5], unpack(ids))
    local order = {}
    for i = 1, #ids do order[i] = {-(tonumber(priorities[i]) or 0), i, ids[i]} end
    table.sort(order, function(a, b)
      if a[1] ~= b[1] then return a[1] < b[1] end
      return a[2] < b[2]
    end)
    for i = 1, #order do ids[i] = order[i][3] end
  end
  redis.call('RPUSH', KEYS[2], unpack(ids))
  redis.call('SADD', KEYS[3], unpack(ids))
  for _ = 1, math.min(#ids, 64) do redis.call('LPUSH', KEYS[4], 1) end
  redis.call('LTRIM', KEYS[4], 0, 63)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not head[2] then return {#ids, math.floor(now)} end
-- At most 2^53 us (285 years): a score no add writes (inf, 1e20: another program's) would
-- overflow the 64-bit integer reply into a negative wait, and the promoter would spin.
local until_us = math.min(math.ceil((tonumber(head[2]) - now) * 1000), 2^53)
return {#ids, math.floor(now), head[2], math.max(0, until_us)}
