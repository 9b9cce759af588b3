-- Read the state of one queue in one consistent snapshot. Every call is O(log N).
-- KEYS[1] = pending ZSET, KEYS[2] = ready_set SET, KEYS[3] = unack ZSET,
-- KEYS[4] = garbage ZSET, KEYS[5] = workers ZSET, KEYS[6] = counters HASH
-- returns {now, pending, overdue, ready, in_flight, expired_leases, garbage,
--          live_workers, next_due or -1, oldest_lease or -1, counters (flat HGETALL)};
--          ready counts the live ids (ready_set), not the tombstones left in the LIST
local t = redis.call('TIME')
local exact = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- due times hold us
local now = math.floor(exact)  -- leases and heartbeats are whole ms
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local lease = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {
  now,
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCOUNT', KEYS[1], '-inf', exact),
  redis.call('SCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]),
  redis.call('ZCOUNT', KEYS[3], '-inf', string.format('(%d', now + 1)),  -- as recover_expired
  redis.call('ZCARD', KEYS[4]),
  redis.call('ZCOUNT', KEYS[5], now + 1, '+inf'),
  head[2] or -1,
  lease[2] or -1,
  redis.call('HGETALL', KEYS[6]),
}
