-- Delete buried ids for good.
-- KEYS[1] = garbage ZSET, KEYS[2] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were in garbage
local n = 0
for i = 1, #ARGV do
  -- the priority of those in garbage only: one given that waits again keeps its own
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
