-- orphans.lua: hand off the tasks of holders found dead (their liveness connection left
-- CLIENT LIST), so that the scanner resurrects them now instead of after a TTL.
-- Serves G3 (a dead worker's tasks come back within a check of its death) and G2 (a
-- handed-off incarnation can neither refresh, start nor commit: each needs another
-- state). The caller read each task's holder just before: a task whose holder or
-- state moved since (started by another process, finished, superseded) is left alone.
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task
-- ARGV[3i-2]   task id of the i-th task
-- ARGV[3i-1]   the worker id found dead that holds it (the hash's 'worker')
-- ARGV[3i]     when its connection was last listed, ms (Redis clock): its last sign
--              of life, written as the task's deadline, from which resurrect.lua dates
--              the recovery (cause 'process_death'); a running task's 1 ms earlier, so
--              that a pass (it takes the expiry index in deadline order) sends the
--              interrupted work before the backlog the dead worker had prefetched
-- RETURNS      how many tasks are handed off. A task already handed off for its dead
--              holder counts as handed off and is left as it is, so a replay of this
--              call after a lost reply answers the same.
local handed = 0
for i = 2, #KEYS do
  local id, holder, seen = ARGV[3 * i - 5], ARGV[3 * i - 4], ARGV[3 * i - 3]
  local f = redis.call('HMGET', KEYS[i], 'state', 'worker', 'ho_cause')
  if f[2] == holder and (f[1] == 'running' or f[1] == 'queued') then
    redis.call('HSET', KEYS[i], 'state', 'handoff', 'ho_cause', 'process_death')
    redis.call('ZADD', KEYS[1], f[1] == 'running' and tonumber(seen) - 1 or seen, id)
    handed = handed + 1
  elseif f[2] == holder and f[1] == 'handoff' and f[3] == 'process_death' then
    handed = handed + 1
  end
end
return handed
