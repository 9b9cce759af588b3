-- Record that a worker is alive until now + ARGV[2] (0 removes it), and forget up to
-- 100 workers whose heartbeat expired.
-- KEYS[1] = workers ZSET, KEYS[2] = worker_info HASH
-- ARGV[1] = worker id, ARGV[2] = time to live (ms), ARGV[3] = JSON description
-- returns how many workers are alive
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
if #dead > 0 then
  redis.call('ZREM', KEYS[1], unpack(dead))
  redis.call('HDEL', KEYS[2], unpack(dead))
end
return redis.call('ZCARD', KEYS[1])
