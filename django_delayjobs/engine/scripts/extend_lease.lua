-- Push the lease deadline of ids still in flight. Ids no longer in unack are not
-- re-added: their lease was lost (recovered and maybe claimed by another worker).
-- KEYS[1] = unack ZSET
-- ARGV[1] = lease (ms), ARGV[2..] = ids
-- returns the ids whose lease was extended
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local held = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], deadline, ARGV[i])
    held[#held + 1] = ARGV[i]
  end
end
return held
