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
-- ARGV[1]        queued grace, ms (as in push.lua)
-- ARGV[4i-2]     task id of the i-th task
-- ARGV[4i-1]     fence of its dispatched incarnation
-- ARGV[4i]       its envelope to store, canonical JSON, or '' to keep the stored one
-- ARGV[4i+1]     history event: JSON object without its opening brace (see start.lua)
-- RETURNS        one integer per task, in order: 1 recorded; 0 the fence moved on
--                meanwhile (nothing written for that task)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace_until = now_ms + tonumber(ARGV[1])

local function recorded(id, fence, env, event, hash, history)
  local f = redis.call('HMGET', hash, 'fence', 'state')
  if f[1] ~= fence then
    return 0
  end
  redis.call('HINCRBY', hash, 'res', 1)
  if env ~= '' then
    redis.call('HSET', hash, 'env', env)
  end
  -- The new incarnation may already have started (its heartbeat owns the deadline then).
  if f[2] == 'queued' then
    redis.call('ZADD', KEYS[1], grace_until, id)
  end
  redis.call('RPUSH', history, '{"at_ms":' .. now_ms .. ',' .. event)
  return 1
end

local replies = {}
for i = 1, (#ARGV - 1) / 4 do
  local a = 4 * i - 2
  replies[i] = recorded(ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    KEYS[2 * i], KEYS[2 * i + 1])
end
return replies
