-- Put in-flight ids whose lease ran out back at the head of ready (their worker
-- died or stalled), at most ARGV[1] of them.
-- KEYS[1] = unack ZSET, KEYS[2] = ready LIST, KEYS[3] = ready_set SET, KEYS[4] = notify LIST,
-- KEYS[5] = counters HASH
-- ARGV[1] = batch size
-- returns the recovered ids
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A lease ends in the ms of its deadline, whatever its fraction (see engine/leases.py).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now + 1), 'LIMIT', 0,
  tonumber(ARGV[1]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[2], ids[i]) end
  redis.call('SADD', KEYS[3], unpack(ids))
  for _ = 1, math.min(#ids, 64) do redis.call('LPUSH', KEYS[4], 1) end
  redis.call('LTRIM', KEYS[4], 0, 63)
  -- pcall: a count field of another program's (no integer) must not fail the move above
  redis.pcall('HINCRBY', KEYS[5], 'recovered', #ids)
end
return ids
