-- Add ids with due times. An id due now goes straight to ready; a later one to pending.
-- An id already pending gets the new due time; an id already ready, in flight or in
-- garbage is left alone, so add is safe to repeat (reconcile relies on this). Every check
-- is O(1) or O(log N): ready membership is read from ready_set, never by scanning ready.
-- Ids due now enter ready in priority order (highest first, then as given).
-- KEYS[1] = pending ZSET, KEYS[2] = ready LIST, KEYS[3] = ready_set SET,
-- KEYS[4] = unack ZSET, KEYS[5] = garbage ZSET, KEYS[6] = wake LIST, KEYS[7] = notify LIST,
-- KEYS[8] = counters HASH ('added' counts the ids it did not hold), KEYS[9] = priority HASH
-- ARGV[1] = 1 to move a pending id only to an earlier due time (reconcile: a due time read
-- from the database may be older than the one its own add has brought since; one too
-- early is harmless, the worker defers the job to its row's), else 0
-- ARGV[2..] = id1, due1_ms, priority1, id2, due2_ms, priority2, ...
-- returns {1 if the queue held no ids before this call else 0, the ids it did not hold}
-- Redis deletes a key once it is empty, so an empty queue is one whose keys do not exist.
-- Ready is read from ready_set, not from the ready LIST, which may hold only tombstones:
-- the same notion of empty as stats (and so forget_empty_shards).
local was_empty = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5]) == 0 and 1 or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- exact: due times hold us
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local earliest = tonumber(head[2])
local only_earlier = ARGV[1] == '1'
local added, readied, wake = {}, {}, false
for i = 2, #ARGV, 3 do
  local id, due, priority = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local held = redis.call('SISMEMBER', KEYS[3], id) == 1
    or redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id)
  if not held then
    local was_pending
    if priority ~= 0 then redis.call('HSET', KEYS[9], id, priority) end
    if due <= now then
      was_pending = redis.call('ZSCORE', KEYS[1], id)  -- its ZREM comes last (see below)
      readied[#readied + 1] = {-priority, #readied, id, was_pending}
    else
      local kept = only_earlier and tonumber(redis.call('ZSCORE', KEYS[1], id))
      if kept and kept <= due then
        was_pending = true  -- pending as early or earlier: left as it is
      else
        was_pending = redis.call('ZADD', KEYS[1], due, id) == 0  -- 0: it held the id
        -- a pending id re-added with priority 0 forgets its old one (after the ZADD: see
        -- below)
        if was_pending and priority == 0 then redis.call('HDEL', KEYS[9], id) end
        if earliest == nil or due < earliest then
          earliest = due
          wake = true
        end
      end
    end
    if not was_pending then added[#added + 1] = id end
  end
end
if wake then
  redis.call('LPUSH', KEYS[6], 1)
  redis.call('LTRIM', KEYS[6], 0, 0)
end
if #readied > 0 then
  table.sort(readied, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for _, entry in ipairs(readied) do
    redis.call('RPUSH', KEYS[2], entry[3])
    redis.call('SADD', KEYS[3], entry[3])
  end
  for _ = 1, math.min(#readied, 64) do redis.call('LPUSH', KEYS[7], 1) end
  redis.call('LTRIM', KEYS[7], 0, 63)
  -- Only now the writes that shrink: Redis checks a script against maxmemory at its
  -- first write alone, so a full Redis refuses the whole call and it changes nothing.
  for _, entry in ipairs(readied) do
    if entry[4] then
      redis.call('ZREM', KEYS[1], entry[3])
      if entry[1] == 0 then redis.call('HDEL', KEYS[9], entry[3]) end  -- as above
    end
  end
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if #added > 0 then redis.pcall('HINCRBY', KEYS[8], 'added', #added) end
return {was_empty, added}
