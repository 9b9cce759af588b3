-- Take up to ARGV[1] ids from the head of ready into unack with a lease deadline.
-- KEYS[1] = ready LIST, KEYS[2] = unack ZSET
-- ARGV[1] = how many, ARGV[2] = lease (ms)
-- returns the claimed ids, oldest first
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
if not ids then return {} end
local deadline = now + tonumber(ARGV[2])
for i = 1, #ids do redis.call('ZADD', KEYS[2], deadline, ids[i]) end
return ids
