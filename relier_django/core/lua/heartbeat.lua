-- heartbeat.lua: refresh the deadlines of all of one process's running tasks, and
-- validate each: a refresh only succeeds while the task still has the caller's fence.
-- Serves G1 (a live task's deadline keeps moving) and G2 (a zombie learns it is stale
-- at its next refresh and cancels itself). One round trip per process per interval.
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task
-- ARGV[1]      heartbeat TTL, ms
-- ARGV[2i]     task id of the i-th task
-- ARGV[2i+1]   fence the caller holds for the i-th task
-- RETURNS      the positions i (1-based) whose refresh failed: fence moved or task gone
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lost = {}
for i = 2, #KEYS do
  local id, fence = ARGV[2 * (i - 1)], ARGV[2 * (i - 1) + 1]
  local fields = redis.call('HMGET', KEYS[i], 'fence', 'state')
  if fields[1] == fence and fields[2] == 'running' then
    redis.call('ZADD', KEYS[1], deadline, id)
  else
    lost[#lost + 1] = i - 1
  end
end
return lost
