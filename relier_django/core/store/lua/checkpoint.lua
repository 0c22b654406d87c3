-- checkpoint.lua: store a running incarnation's checkpoint (ctx.set_partial) with its task.
-- Serves G2 (a superseded incarnation cannot overwrite the checkpoint its successor
-- resumes from) and G5 (the checkpoint goes with the task into the DLQ and back out
-- on release, see dead_letter.lua and release.lua).
--
-- KEYS[1]  task hash
-- ARGV[1]  fence of the incarnation saving
-- ARGV[2]  the checkpoint record: JSON, {"inline": state} or {"file": path, "sha256": hex}
-- RETURNS  {1, 0}              stored (the task's field 'partial')
--          {0, current_fence}  refused: the fence moved (-1: the task is gone)
local fields = redis.call('HMGET', KEYS[1], 'fence', 'state')
if fields[1] ~= ARGV[1] or fields[2] ~= 'running' then
  return {0, tonumber(fields[1]) or -1}
end
redis.call('HSET', KEYS[1], 'partial', ARGV[2])
return {1, 0}
