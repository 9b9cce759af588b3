-- Hand in-flight ids back to pending with a retry time: only ids in flight under a lease
-- of the caller's holder (one that ends in its fraction of a ms, see engine/leases.py), or
-- under a lease no holder set (a whole ms: adopt's, for a running job Redis lost, kept by
-- its worker's extension whoever holds it). An id in flight under another holder's lease
-- was lost by the caller and claimed again by another worker, which may run it now: it is
-- left there. Ids not in flight are ignored.
-- KEYS[1] = unack ZSET, KEYS[2] = pending ZSET, KEYS[3] = wake LIST, KEYS[4] = counters HASH
-- ARGV[1] = the holder's fraction of a ms (every lease it sets),
-- ARGV[2..] = id1, due1_ms, id2, due2_ms, ...
-- returns how many ids went back to pending
local fraction = tonumber(ARGV[1])
-- Whether a lease is the holder's or no holder's (as extend_lease.lua's holders, which
-- see). A whole ms plus the fraction never ends in 0: no holder's fraction is 0.
local function movable(lease)
  local mine = math.fmod(lease, 1)
  return mine == 0 or mine == math.fmod(math.floor(lease) + fraction, 1)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local earliest = tonumber(head[2])
local n, wake = 0, false
for i = 2, #ARGV, 2 do
  local lease = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if lease and movable(lease) then
    redis.call('ZREM', KEYS[1], ARGV[i])
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
