-- handoff.lua: a stopping worker gives tasks up so they restart elsewhere now, without
-- waiting for their heartbeat TTL (graceful SIGTERM drain).
-- Serves G3 (hand-off is immediate) and G2 (a handed-off incarnation can neither
-- refresh, start nor commit any more: every one of those requires another state).
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task
-- ARGV[1]      the state the caller holds the tasks in: 'queued' (reserved) or 'running'
-- ARGV[2i]     task id of the i-th task
-- ARGV[2i+1]   fence the caller holds for the i-th task
-- ARGV[2#KEYS]  why: 'drain' (a stopping worker) or 'pool_death' (its pool process
--              died); resurrect.lua counts the resurrection under it
-- ARGV[2#KEYS+1]  optional: how the pool process died, as its main process saw it
--              ('signal:SIGKILL', 'exit:3', 'oom'), kept as 'death' for the history,
--              the DLQ entry and task_resurrected; '' or absent when unknown. A task
--              the scanner handed off first at this fence (its liveness connection
--              closed: the same death) still takes it, if not resurrected yet
-- RETURNS      how many tasks were handed off (the others had moved on: started,
--              finished, superseded). A task already handed off at the caller's fence
--              counts as handed off and is left as it is, so a replay of this call
--              after a lost reply answers the same.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local handed = 0
for i = 2, #KEYS do
  local id, fence = ARGV[2 * (i - 1)], ARGV[2 * (i - 1) + 1]
  local fields = redis.call('HMGET', KEYS[i], 'fence', 'state')
  if fields[1] == fence and fields[2] == ARGV[1] then
    -- 'ho_from': a run handed off by a draining worker may still be running its body,
    -- which cancel.lua tells its caller.
    redis.call('HSET', KEYS[i], 'state', 'handoff', 'ho_cause', ARGV[2 * #KEYS], 'ho_from', ARGV[1],
      'death', ARGV[2 * #KEYS + 1] or '')
    redis.call('ZADD', KEYS[1], now_ms, id)
    handed = handed + 1
  elseif fields[1] == fence and fields[2] == 'handoff' then
    local death = ARGV[2 * #KEYS + 1]
    if death and death ~= '' then
      redis.call('HSET', KEYS[i], 'death', death)
    end
    handed = handed + 1
  end
end
return handed
