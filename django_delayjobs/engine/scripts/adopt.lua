-- Put ids Redis holds nowhere in flight with a lease: the running jobs of a Redis that
-- lost its data (a restart, a failover to a replica that lagged). A worker still running
-- one extends that lease, so it is not delivered to a second worker meanwhile; once the
-- lease ends (its worker died too), recover_expired hands it to another. An id pending,
-- ready or in flight is left alone. An id in garbage is taken out of it too: the row says
-- the job runs, so that copy is stale (a snapshot taken while the job was dead, restored
-- after it was retried); the caller buries again an id whose job has died since.
-- KEYS[1] = pending ZSET, KEYS[2] = ready_set SET, KEYS[3] = unack ZSET,
-- KEYS[4] = garbage ZSET
-- ARGV[1] = lease (ms), ARGV[2..] = ids
-- returns {1 if the queue held no ids before this call else 0, the ids put in flight}
local was_empty = redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 and 1 or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local adopted = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local held = redis.call('ZSCORE', KEYS[1], id) or redis.call('SISMEMBER', KEYS[2], id) == 1
    or redis.call('ZSCORE', KEYS[3], id)
  if not held then
    redis.call('ZADD', KEYS[3], deadline, id)  -- first: on a full Redis, refused whole
    redis.call('ZREM', KEYS[4], id)
    adopted[#adopted + 1] = id
  end
end
return {was_empty, adopted}
