-- progress.lua: store a running incarnation's progress (ctx.set_progress,
-- ctx.update_state) with its task, for AsyncResult(id).state/.info, the admin and the
-- live view to read while it runs.
-- Serves G2 (a superseded incarnation, a zombie, cannot overwrite the progress its
-- successor reports) and G10 (a replay stores the same record again: same answer,
-- same state).
--
-- KEYS[1]  task hash
-- ARGV[1]  fence of the incarnation reporting
-- ARGV[2]  the progress record: canonical JSON {"meta": ..., "state": "<STATE>"}
-- RETURNS  {1, 0}              stored (the task's field 'progress'; kept through
--                              retries and resurrections, gone with the task hash at
--                              commit, DLQ or cancel)
--          {0, current_fence}  refused: the fence moved, or the task is not running
--                              (-1: the task is gone)
local fields = redis.call('HMGET', KEYS[1], 'fence', 'state')
if fields[1] ~= ARGV[1] or fields[2] ~= 'running' then
  return {0, tonumber(fields[1]) or -1}
end
redis.call('HSET', KEYS[1], 'progress', ARGV[2])
return {1, 0}
