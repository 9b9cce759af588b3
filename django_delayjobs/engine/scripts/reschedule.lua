-- Give a pending id a new due time. An id that was already promoted, claimed or
-- buried is not touched: a job that fired is never resurrected.
-- KEYS[1] = pending ZSET, KEYS[2] = ready LIST, KEYS[3] = ready_set SET,
-- KEYS[4] = wake LIST, KEYS[5] = notify LIST
-- ARGV[1] = id, ARGV[2] = new due time (ms)
-- returns 1 if the id was pending and now has the new due time, else 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- exact: due times hold us
local id, due = ARGV[1], tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], id) then return 0 end
if due <= now then
  redis.call('ZREM', KEYS[1], id)
  redis.call('RPUSH', KEYS[2], id)
  redis.call('SADD', KEYS[3], id)
  redis.call('LPUSH', KEYS[5], 1)
  redis.call('LTRIM', KEYS[5], 0, 63)
  return 1
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], due, id)
if due < tonumber(head[2]) then
  redis.call('LPUSH', KEYS[4], 1)
  redis.call('LTRIM', KEYS[4], 0, 0)
end
return 1
