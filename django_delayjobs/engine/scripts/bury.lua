-- Move in-flight ids to garbage, scored by the time they died. Others are ignored.
-- KEYS[1] = unack ZSET, KEYS[2] = garbage ZSET, KEYS[3] = counters HASH
-- ARGV = id1, id2, ...
-- returns how many ids were buried
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], now, ARGV[i])
    n = n + 1
  end
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if n > 0 then redis.pcall('HINCRBY', KEYS[3], 'buried', n) end
return n
