-- Add counts to a counters HASH, the second step of a fold on a Cluster (fold_counters
-- took them from a shard whose counters live on another master), or their way back.
-- KEYS[1] = counters HASH
-- ARGV = name1, count1, name2, count2, ... (as fold_counters returned them)
-- returns the counts not added, flat as ARGV: those whose field holds no canonical
--         integer of at most 15 digits (another program's), which fold_counters would
--         have left alone too. Checked before any write: no HINCRBY below can fail, so
--         none is applied without the others (a MULTI would apply the rest).
local function integer(value)
  local digits = value:match('^%-?([1-9]%d*)$')
  return digits and #digits <= 15
end
local names = {}
for i = 1, #ARGV, 2 do names[#names + 1] = ARGV[i] end
if #names == 0 then return {} end
local there = redis.call('HMGET', KEYS[1], unpack(names))
local added, refused = {}, {}
for i = 1, #names do
  local into = refused
  if there[i] == false or there[i] == '0' or integer(there[i]) then into = added end
  into[#into + 1] = names[i]
  into[#into + 1] = ARGV[2 * i]
end
for i = 1, #added, 2 do redis.call('HINCRBY', KEYS[1], added[i], added[i + 1]) end
return refused
