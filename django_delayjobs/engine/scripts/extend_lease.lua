-- Push the lease deadline of ids still in flight under the lease their holder gave (see
-- engine/leases.py). An id no longer in unack is not re-added: its lease was lost
-- (recovered and maybe claimed by another worker). Nor is one in unack under another
-- lease: it was lost, then claimed again by another worker, whose lease it is now.
-- KEYS[1] = unack ZSET
-- ARGV[1] = lease (ms), ARGV[2] = the new leases' fraction of a ms,
-- ARGV[3..] = pairs of an id and the lease deadline its holder holds (as a claim or the
-- last extension gave it back), or "" for an id whose lease is kept whoever holds it
-- returns {id, its new lease deadline (exactly as ZSCORE gives it back), ...} for the ids
-- whose lease was extended
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- %.17g: every digit of the double (see claim.lua)
local deadline = string.format('%.17g', now + tonumber(ARGV[1]) + tonumber(ARGV[2]))
local held = {}
for i = 3, #ARGV, 2 do
  local lease = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if lease and (ARGV[i + 1] == '' or tonumber(lease) == tonumber(ARGV[i + 1])) then
    redis.call('ZADD', KEYS[1], deadline, ARGV[i])
    held[#held + 1] = ARGV[i]
    held[#held + 1] = deadline
  end
end
return held
