-- resurrected.lua: after the broker accepted a batch of resurrected incarnations, count
-- each; its lease deadline becomes a queued grace. One call per batch.
-- The stored envelope is rewritten only when the caller passes one: every reader takes
-- the fence and the resurrection count from the task hash, so an unsigned copy stays
-- as pushed (or as last retried); a signed one is re-stored, signed with the newest
-- key, so a key rotation never strands a task whose stored copy only an old key verifies.
-- Serves G1: until this runs, the lease from resurrect.lua keeps each task covered,
-- so a scanner that dies between the two leaves tasks that a later pass redoes.
--
-- KEYS[1]        expiry index
-- KEYS[2i]       task hash of the i-th task    KEYS[2i+1]  its history list
-- KEYS[#KEYS-1]  metrics counters   KEYS[#KEYS]  metrics windows ('' when metrics are off)
-- ARGV[1]        queued grace, ms (as in push.lua)
-- ARGV[4i-2]     task id of the i-th task
-- ARGV[4i-1]     fence of its dispatched incarnation
-- ARGV[4i]       its envelope to store, canonical JSON, or '' to keep the stored one
-- ARGV[4i+1]     history event: JSON object without its opening brace (see start.lua)
-- RETURNS        one integer per task, in order: 1 recorded; 0 the fence moved on
--                meanwhile (nothing written for that task)
-- Counts: 'res:<cause>' (the cause resurrect.lua wrote) once per resurrection, and
-- 'death:<how>' (how the holder died: resurrect.lua's 'res_death') when known; 'rc_sent'
-- and 'q_ms' date the send, for start.lua's recovery and queue-wait figures.
-- Each resurrection is counted once: the task hash keeps the fence it was counted for
-- ('res_fence'), so a replay of this call after a lost reply answers 1 again and
-- writes nothing (no second count, history event or grace).
-- A task hash whose count is not an integer fails the call; the tasks before it in the
-- batch stay recorded whole (queued grace included), as if each had its own call.
--
-- Cost: a task costs five calls (HMGET; one HSET of the count and its fence, with the
-- envelope when one is passed; the history RPUSH; the 'res:<cause>' and 'death:<how>'
-- counts); the queued
-- graces are written in one ZADD.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace_until = now_ms + tonumber(ARGV[1])
local at_ms = '{"at_ms":' .. now_ms .. ','
local metrics = KEYS[#KEYS - 1]

-- @include _metrics
-- A count as HINCRBY would take it (missing is 0), small enough for Lua to be exact.
local function count_of(raw)
  if not raw then
    return 0
  end
  if raw == '0' or (#raw <= 15 and raw:find('^%-?[1-9]%d*$')) then
    return tonumber(raw)
  end
  error('res is not an integer: ' .. raw)
end

local graces = {}  -- score, id pairs, written in one ZADD after the batch

local function recorded(id, fence, env, event, hash, history)
  local f = redis.call('HMGET', hash, 'fence', 'state', 'res', 'res_fence', 'res_cause',
    'res_death')
  if f[1] ~= fence then
    return 0
  end
  if f[4] == fence then
    return 1
  end
  local res = count_of(f[3]) + 1  -- checked before anything is written
  if env ~= '' then
    redis.call('HSET', hash, 'res', res, 'res_fence', fence, 'rc_sent', now_ms, 'q_ms', now_ms,
      'env', env)
  else
    redis.call('HSET', hash, 'res', res, 'res_fence', fence, 'rc_sent', now_ms, 'q_ms', now_ms)
  end
  metric_count(metrics, 'res:' .. (f[5] or 'unknown'))
  if f[6] and f[6] ~= '' then
    metric_count(metrics, 'death:' .. f[6])
  end
  -- The new incarnation may already have started (its heartbeat owns the deadline then).
  if f[2] == 'queued' then
    graces[#graces + 1] = grace_until
    graces[#graces + 1] = id
  end
  redis.call('RPUSH', history, at_ms .. event)
  return 1
end

local replies = {}
local done, err = pcall(function()
  for i = 1, (#ARGV - 1) / 4 do
    local a = 4 * i - 2
    replies[i] = recorded(ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
      KEYS[2 * i], KEYS[2 * i + 1])
  end
end)
-- Also when a task failed: those recorded before it get their grace all the same.
-- In slices: unpack's results live on Lua's C stack, which has a bound.
for at = 1, #graces, 1000 do
  redis.call('ZADD', KEYS[1], unpack(graces, at, math.min(at + 999, #graces)))
end
if not done then
  error(err, 0)
end
return replies
