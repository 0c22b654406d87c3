-- handoff.lua: a stopping worker gives tasks up so they restart elsewhere now, without
-- waiting for their heartbeat TTL (graceful SIGTERM drain).
-- Serves G3 (hand-off is immediate) and G2 (a handed-off incarnation can neither
-- refresh, start nor commit any more: every one of those requires another state).
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task (i = 1..n)
-- KEYS[1+n+i]  with a death (ARGV[2n+3]): the i-th task's history list
-- ARGV[1]      the state the caller holds the tasks in: 'queued' (reserved) or 'running'
-- ARGV[2i]     task id of the i-th task
-- ARGV[2i+1]   fence the caller holds for the i-th task
-- ARGV[2n+2]   why: 'drain' (a stopping worker) or 'pool_death' (its pool process
--              died); resurrect.lua counts the resurrection under it
-- ARGV[2n+3]   optional: how the pool process died, as its main process saw it
--              ('signal:SIGKILL', 'exit:3', 'oom'), kept as 'death' for resurrect.lua
--              (the history, the DLQ entry, task_resurrected). The scanner may have
--              handed the task off first for the same death (the pool process's
--              liveness connection closed): at this fence and not yet resurrected, it
--              still takes the death; already resurrected (a newer fence), the death
--              is added to the history as a 'died' entry, once per fence ('died_fence')
-- RETURNS      how many tasks were handed off (the others had moved on: started,
--              finished, superseded). A task already handed off at the caller's fence
--              counts as handed off and is left as it is (but for its death), so a
--              replay of this call after a lost reply answers and writes the same.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = math.floor((#ARGV - 2) / 2)
local cause, death = ARGV[2 * n + 2], ARGV[2 * n + 3] or ''
local handed = 0
for i = 1, n do
  local hash, id, fence = KEYS[1 + i], ARGV[2 * i], ARGV[2 * i + 1]
  local fields = redis.call('HMGET', hash, 'fence', 'state', 'died_fence')
  if fields[1] == fence and fields[2] == ARGV[1] then
    -- 'ho_from': a run handed off by a draining worker may still be running its body,
    -- which cancel.lua tells its caller.
    redis.call('HSET', hash, 'state', 'handoff', 'ho_cause', cause, 'ho_from', ARGV[1],
      'death', death)
    redis.call('ZADD', KEYS[1], now_ms, id)
    handed = handed + 1
  elseif fields[1] == fence and fields[2] == 'handoff' then
    if death ~= '' then
      redis.call('HSET', hash, 'death', death)
    end
    handed = handed + 1
  elseif death ~= '' and fields[1] and tonumber(fields[1]) and tonumber(fence)
      and tonumber(fields[1]) > tonumber(fence) and fields[3] ~= fence then
    redis.call('HSET', hash, 'died_fence', fence)
    redis.call('RPUSH', KEYS[1 + n + i], '{"at_ms":' .. now_ms ..
      ',"cause":' .. cjson.encode(death) .. ',"event":"died","fence":' .. fence .. '}')
  end
end
return handed
