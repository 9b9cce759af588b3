-- Look for ids in a shard of an older shard count of their queue: an add or an adopt in
-- their shard under the current count must never leave an id held by two shards at once
-- (each copy would be delivered, the second to a worker while the first runs the job).
-- With ARGV[1] = 1, the ids waiting here (pending or ready) are taken out: the caller has
-- just added them to their current shard. Ids in flight or in garbage are served here.
-- KEYS[1] = pending ZSET, KEYS[2] = ready_set SET, KEYS[3] = unack ZSET,
-- KEYS[4] = garbage ZSET, KEYS[5] = counters HASH ('removed' counts the ids taken out),
-- KEYS[6] = priority HASH
-- ARGV[1] = 1 to take the waiting ids out, else 0; ARGV[2..] = ids
-- returns {the ids waiting here (taken out, with ARGV[1] = 1), the ids in flight or in
-- garbage here}
local take = ARGV[1] == '1'
local waiting, busy = {}, {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('SISMEMBER', KEYS[2], id) == 1 then
    waiting[#waiting + 1] = id
    if take then
      redis.call('ZREM', KEYS[1], id)
      redis.call('SREM', KEYS[2], id)  -- its entry in ready stays, a tombstone claim skips
      redis.call('HDEL', KEYS[6], id)
    end
  elseif redis.call('ZSCORE', KEYS[3], id) or redis.call('ZSCORE', KEYS[4], id) then
    busy[#busy + 1] = id
  end
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if take and #waiting > 0 then redis.pcall('HINCRBY', KEYS[5], 'removed', #waiting) end
return {waiting, busy}
