-- Remove ids that have not been claimed yet (cancel). In-flight and buried ids stay.
-- KEYS[1] = pending ZSET, KEYS[2] = ready LIST
-- ARGV = id1, id2, ...
-- returns how many ids were removed
local removed = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    removed = removed + 1
  else
    removed = removed + redis.call('LREM', KEYS[2], 1, ARGV[i])
  end
end
return removed
