-- Hand in-flight ids back to pending with a retry time. Ids not in flight are ignored.
-- KEYS[1] = unack ZSET, KEYS[2] = pending ZSET, KEYS[3] = wake LIST, KEYS[4] = counters HASH
-- ARGV = id1, due1_ms, id2, due2_ms, ...
-- returns how many ids went back to pending
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local earliest = tonumber(head[2])
local n, wake = 0, false
for i = 1, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    local due = tonumber(ARGV[i + 1])
    redis.call('ZADD', KEYS[2], due, ARGV[i])
    n = n + 1
    if earliest == nil or due < earliest then
      earliest = due
      wake = true
    end
  end
end
if wake then
  redis.call('LPUSH', KEYS[3], 1)
  redis.call('LTRIM', KEYS[3], 0, 0)
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if n > 0 then redis.pcall('HINCRBY', KEYS[4], 'nacked', n) end
return n
