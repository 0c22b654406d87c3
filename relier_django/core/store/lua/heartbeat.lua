-- heartbeat.lua: refresh the deadlines of a batch of tasks one process holds, and
-- validate each: a refresh only succeeds while the task still has the caller's fence
-- and is in the state the caller expects.
-- Serves G1 (a live task's deadline keeps moving; a dead holder's stops), G2 (a zombie
-- learns it is stale at its next refresh and cancels itself). One round trip per
-- process per interval, whatever the number of tasks.
--
-- Two holders use it: a pool process for the tasks it runs (state 'running'), and a
-- worker's main process for the messages it has received but not started yet
-- (prefetched/reserved, state 'queued'), so a dead worker's backlog comes back too.
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task
-- ARGV[1]      heartbeat TTL, ms
-- ARGV[2]      the state the holder expects: 'running' or 'queued'
-- ARGV[1+2i]   task id of the i-th task
-- ARGV[2+2i]   fence the caller holds for the i-th task
-- ARGV[2#KEYS+1]  the holder's worker id: a reserved task ('queued') not yet marked
--              with it is marked once (field 'worker'), so that the live view tells
--              reserved from queued and a resurrection of it counts as 'heartbeat'
-- RETURNS      the positions i (1-based) whose refresh failed: fence moved, state
--              changed (e.g. a reserved task started) or task gone
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lost = {}
for i = 2, #KEYS do
  local id, fence = ARGV[2 * i - 1], ARGV[2 * i]
  local fields = redis.call('HMGET', KEYS[i], 'fence', 'state', 'worker')
  if fields[1] == fence and fields[2] == ARGV[2] then
    redis.call('ZADD', KEYS[1], deadline, id)
    if fields[2] == 'queued' and (not fields[3] or fields[3] == '') and ARGV[2 * #KEYS + 1] then
      redis.call('HSET', KEYS[i], 'worker', ARGV[2 * #KEYS + 1])
    end
  else
    lost[#lost + 1] = i - 1
  end
end
return lost
