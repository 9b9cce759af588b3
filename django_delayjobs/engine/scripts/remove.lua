-- Remove ids that have not been claimed yet (cancel). In-flight and buried ids stay.
-- A ready id leaves ready_set only, in O(1): its entry in the ready LIST stays behind as
-- a tombstone that claim pops and skips (LREM would scan the whole list).
-- KEYS[1] = pending ZSET, KEYS[2] = ready_set SET, KEYS[3] = counters HASH ('removed'),
-- KEYS[4] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were removed
local removed = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 or redis.call('SREM', KEYS[2], ARGV[i]) == 1 then
    removed = removed + 1
    redis.call('HDEL', KEYS[4], ARGV[i])
  end
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if removed > 0 then redis.pcall('HINCRBY', KEYS[3], 'removed', removed) end
return removed
