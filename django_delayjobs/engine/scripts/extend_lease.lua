-- Push the lease deadline of ids still in flight under a lease of their holder (see
-- engine/leases.py): the one it gave, or one that ends in its fraction of a ms (an
-- extension whose reply was lost set it). An id no longer in unack is not re-added: its
-- lease was lost (recovered and maybe claimed by another worker). Nor is one in unack
-- under another holder's lease: it was lost, then claimed again by another worker, whose
-- lease it is now.
-- KEYS[1] = unack ZSET
-- ARGV[1] = lease (ms), ARGV[2] = the holder's fraction of a ms (every lease it sets),
-- ARGV[3..] = pairs of an id and the lease deadline its holder holds (as a claim or the
-- last extension gave it back), or "" for an id whose lease is kept whoever holds it
-- returns {id, its new lease deadline (exactly as ZSCORE gives it back), ...} for the ids
-- whose lease was extended
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fraction = tonumber(ARGV[2])
-- %.17g: every digit of the double (see claim.lua)
local deadline = string.format('%.17g', now + tonumber(ARGV[1]) + fraction)
-- Whether a lease ends in the holder's fraction: its whole ms plus the fraction, which
-- rounds as the deadline's sum did (exact below 2^41 ms, until 2039; fmod is exact).
local function holders(lease)
  local whole = math.floor(lease)
  return math.fmod(lease, 1) == math.fmod(whole + fraction, 1)
end
local held = {}
for i = 3, #ARGV, 2 do
  local lease = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if lease and (ARGV[i + 1] == '' or lease == tonumber(ARGV[i + 1]) or holders(lease)) then
    redis.call('ZADD', KEYS[1], deadline, ARGV[i])
    held[#held + 1] = ARGV[i]
    held[#held + 1] = deadline
  end
end
return held
