-- cancel.lua: cancel a task: remove it if it has not started, fence off its running
-- incarnation if it has, and record the outcome 'cancelled' for its receipts.
-- Serves G11 (a scheduled task can be taken back before it is due) and G2 (a cancelled
-- incarnation can neither refresh its heartbeat, start nor commit: every one of those
-- needs the task hash, which goes here; an async task is cancelled at its next
-- heartbeat, a plain def one learns it from ctx.is_current()).
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  schedule index   KEYS[5]  result key
-- KEYS[6]  metrics counters   KEYS[7]  metrics windows ('' each when metrics are off)
-- KEYS[8]  idempotency key (only when the task holds one, as its hash names it)
-- ARGV[1]  task id
-- ARGV[2]  the outcome record to keep when it had not started, JSON ({"status":
--          "cancelled", "by": <request token>, "running": false})
-- ARGV[3]  how long it is kept, ms (RESULT_TTL_S)
-- ARGV[4]  the record to keep when it was running ("running": true)
-- RETURNS  1 cancelled before it started (scheduled or queued)
--          2 cancelled while running: that incarnation is fenced off
--          0 nothing to cancel: finished (its outcome stands), or unknown
--          A replay of this call after a lost reply finds its own record (the token
--          in it) and answers as the first call did.
-- Counts: 'cancelled' once per task cancelled (a replay answers before counting).
-- @include _metrics
local id = ARGV[1]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  local kept = redis.call('GET', KEYS[5])
  if kept == ARGV[2] then
    return 1
  elseif kept == ARGV[4] then
    return 2
  end
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('SET', KEYS[5], state == 'running' and ARGV[4] or ARGV[2], 'PX', tonumber(ARGV[3]))
if KEYS[8] and redis.call('GET', KEYS[8]) == id then
  redis.call('DEL', KEYS[8])
end
metric_count(KEYS[6], 'cancelled')
return state == 'running' and 2 or 1
