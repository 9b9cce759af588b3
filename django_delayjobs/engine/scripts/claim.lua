-- Take up to ARGV[1] ids from the head of ready into unack with a lease deadline.
-- An entry popped from ready whose id is not in ready_set is a tombstone (the id was
-- removed while ready) and is dropped. Pops never exceed the ids still wanted, so no live
-- id is popped and lost, and stop after ARGV[1] + 1000 entries, so a long run of
-- tombstones costs several calls, not one long block; when that bound stops a call while
-- live ids remain, a notify token is pushed so an idle worker claims again at once.
-- Every id in ready_set has an entry in ready, so once ready is empty what ready_set still
-- holds can never be popped: the ready LIST alone was lost (evicted under an LRU
-- maxmemory-policy, deleted by hand), and add, which trusts ready_set, would never add
-- those ids again. They are claimed straight from ready_set.
-- KEYS[1] = ready LIST, KEYS[2] = ready_set SET, KEYS[3] = unack ZSET, KEYS[4] = notify LIST
-- ARGV[1] = how many, ARGV[2] = lease (ms)
-- returns the claimed ids, oldest first
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local budget = want + 1000
local claimed = {}
while #claimed < want and budget > 0 do
  local n = math.min(want - #claimed, budget)
  local ids = redis.call('LPOP', KEYS[1], n) or redis.call('SRANDMEMBER', KEYS[2], n)
  if #ids == 0 then break end
  budget = budget - #ids
  for i = 1, #ids do
    if redis.call('SREM', KEYS[2], ids[i]) == 1 then
      redis.call('ZADD', KEYS[3], deadline, ids[i])
      claimed[#claimed + 1] = ids[i]
    end
  end
  if #ids < n then break end
end
if #claimed < want and budget <= 0 and redis.call('SCARD', KEYS[2]) > 0 then
  redis.call('LPUSH', KEYS[4], 1)
  redis.call('LTRIM', KEYS[4], 0, 63)
end
return claimed
