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
-- The lease deadline carries ARGV[3], the claimer's fraction of a ms (see
-- engine/leases.py): the score tells its lease from another claimer's set in the same ms.
-- With KEYS[5] a call can be sent again (see engine/claims.py): Redis runs a call whose
-- caller gave up waiting, and the ids it took would be in flight for nobody until their
-- lease ended. A call that takes ids records "<ARGV[4]> <lease deadline> <id>..." there for
-- ARGV[5] ms (less than the lease); a call that finds its own ARGV[4] recorded takes nothing
-- and returns the recorded ids still in flight under that deadline, not those acked, handed
-- back or claimed by another worker since. It only reads, so a full Redis serves it too.
-- KEYS[1] = ready LIST, KEYS[2] = ready_set SET, KEYS[3] = unack ZSET, KEYS[4] = notify LIST,
-- KEYS[5] = record STRING (optional)
-- ARGV[1] = how many, ARGV[2] = lease (ms), ARGV[3] = the lease's fraction of a ms,
-- ARGV[4] = call token, ARGV[5] = record's life (ms)
-- returns {the lease deadline the ids are in flight under (exactly as ZSCORE gives it
--          back), the claimed ids, oldest first[, 1 if they are a recorded call's: sent
--          again, its ids' lease was set when it was first run]}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
-- %.17g: every digit of the double, so tonumber() of it is the score ZADD sets, exactly
local deadline = string.format('%.17g', now + tonumber(ARGV[2]) + tonumber(ARGV[3]))
local record = KEYS[5] and redis.call('GET', KEYS[5])
if record then
  local fields = string.gmatch(record, '%S+')
  if fields() == ARGV[4] then
    local recorded = fields()
    local lease = tonumber(recorded)
    local again = {}
    for id in fields do
      if tonumber(redis.call('ZSCORE', KEYS[3], id)) == lease then again[#again + 1] = id end
    end
    return {recorded, again, 1}
  end
end
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
if KEYS[5] and #claimed > 0 and tonumber(ARGV[5]) > 0 then
  local value = {ARGV[4], deadline, unpack(claimed)}
  redis.call('SET', KEYS[5], table.concat(value, ' '), 'PX', ARGV[5])
end
return {deadline, claimed}
