-- Give buried ids another life: back to ready if due now, else to pending.
-- KEYS[1] = garbage ZSET, KEYS[2] = pending ZSET, KEYS[3] = ready LIST,
-- KEYS[4] = ready_set SET, KEYS[5] = wake LIST, KEYS[6] = notify LIST
-- ARGV[1] = due time (ms), ARGV[2] = buried before (ms; '' for any), ARGV[3..] = ids
-- An id is taken out only if its garbage score (the time it died, see bury.lua) is below
-- ARGV[2]: the reconcile sweep passes the time it read the rows, so that the id of a job
-- that died after its row was read waiting stays in garbage.
-- returns the ids that left garbage
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- exact: due times hold us
local due = tonumber(ARGV[1])
local before = tonumber(ARGV[2])
local moved = {}
for i = 3, #ARGV do
  local died = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if died and (before == nil or tonumber(died) < before) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    if due <= now then
      redis.call('RPUSH', KEYS[3], ARGV[i])
      redis.call('SADD', KEYS[4], ARGV[i])
    else
      redis.call('ZADD', KEYS[2], due, ARGV[i])
    end
    moved[#moved + 1] = ARGV[i]
  end
end
local n = #moved
if n > 0 then
  if due <= now then
    for _ = 1, math.min(n, 64) do redis.call('LPUSH', KEYS[6], 1) end
    redis.call('LTRIM', KEYS[6], 0, 63)
  else
    redis.call('LPUSH', KEYS[5], 1)
    redis.call('LTRIM', KEYS[5], 0, 0)
  end
end
return moved
