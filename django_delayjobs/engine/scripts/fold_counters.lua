-- Take the counts of a shard that is about to be forgotten (an emptied shard of an older
-- shard count), at once: a second caller finds nothing left to take, so two promoters
-- forgetting the same shard move its counts once. Given a second key (on one Redis only:
-- on a Cluster the two shards may be on two masters), add them there in the same step.
-- KEYS[1] = counters HASH (of the shard forgotten)
-- KEYS[2] = counters HASH (optional: of a shard of the current count)
-- returns the counts taken, flat: name1, count1, name2, count2, ... A count that is 0, or
--         not a canonical integer of at most 15 digits (another program's), is left alone,
--         and so is one whose field in KEYS[2] holds no such integer: no HINCRBY below can
--         fail half-way. A counters HASH holds a handful of fields: the work is bounded.
local function integer(value)
  local digits = value:match('^%-?([1-9]%d*)$')
  return digits and #digits <= 15
end
local into = {}  -- the fields of KEYS[2] (a handful, as here)
if KEYS[2] then
  local flat = redis.call('HGETALL', KEYS[2])
  for i = 1, #flat, 2 do into[flat[i]] = flat[i + 1] end
end
local found = redis.call('HGETALL', KEYS[1])
local taken = {}
for i = 1, #found, 2 do
  local name, count = found[i], found[i + 1]
  if integer(count) then
    local there = into[name]
    if there == nil or there == '0' or integer(there) then
      taken[#taken + 1] = name
      taken[#taken + 1] = count
    end
  end
end
for i = 1, #taken, 2 do
  if KEYS[2] then redis.call('HINCRBY', KEYS[2], taken[i], taken[i + 1]) end
  redis.call('HDEL', KEYS[1], taken[i])
end
return taken
