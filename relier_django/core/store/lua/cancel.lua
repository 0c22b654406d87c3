-- cancel.lua: cancel a task: remove it if it has not started, fence off its running
-- incarnation if it has, and record the outcome 'cancelled' for its receipts. A
-- workflow's member whose workflow depends on it (a chain's step with steps after it,
-- a chord's header member) is filed in the DLQ instead, reason 'cancelled', with the
-- rest of its workflow: removed, it would end that workflow without a trace.
-- Serves G11 (a scheduled task can be taken back before it is due), G2 (a cancelled
-- incarnation can neither refresh its heartbeat, start nor commit: every one of those
-- needs the task hash, which goes here; an async task is cancelled at its next
-- heartbeat, a plain def one learns it from ctx.is_current()) and G15 (a cancelled
-- member never ends its workflow silently).
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  schedule index   KEYS[5]  result key
-- KEYS[6]  metrics counters   KEYS[7]  metrics windows ('' each when metrics are off)
-- KEYS[8]  DLQ time index   KEYS[9]  DLQ entry hash (the task's id)
-- KEYS[10] DLQ lex index   KEYS[11] DLQ counts
-- KEYS[12] idempotency key (only when the task holds one, as its hash names it)
-- ARGV[1]  task id
-- ARGV[2]  the outcome record to keep when it had not started, JSON ({"status":
--          "cancelled", "by": <request token>, "running": false})
-- ARGV[3]  how long it is kept, ms (RESULT_TTL_S)
-- ARGV[4]  the record to keep when it was running ("running": true)
-- ARGV[5]  the fence the caller read with the task's envelope, '' when it read none
-- ARGV[6]  '' to remove the task; else the DLQ entry (JSON, built by the caller from
--          the envelope at ARGV[5]) that files a workflow's member with its workflow
-- ARGV[7]  with ARGV[6]: the history event (JSON object without its opening brace)
-- ARGV[8]  with ARGV[6]: task name   ARGV[9]: queue   ARGV[10]: one-line summary
-- ARGV[11] with ARGV[6]: a chord member's group id, kept on the entry as dead_letter.lua
--          keeps it, else ''
-- A run is 'running', or handed off by a draining worker whose body may still run
-- ('handoff' from 'running' with cause 'drain': handoff.lua marks 'ho_from').
-- A gated task leaves its line if parked, or frees its slot for the next (_limits.lua).
-- RETURNS  1 cancelled before it started (scheduled, parked, queued, handed off unstarted)
--          2 cancelled while running: that incarnation is fenced off
--          0 nothing to cancel: finished (its outcome stands), or unknown
--          -1 the task moved on since the caller read it (a new incarnation): read
--             again and call again
--          A replay of this call after a lost reply finds its own record (the token
--          in it) and answers as the first call did.
-- Counts: 'cancelled' once per task cancelled (a replay answers before counting); a
-- member filed in the DLQ also 'dlq:cancelled' and the minute's and hour's 'dlq'.
-- @include _dlq_index
-- @include _metrics
-- @include _limits
local id = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'state', 'fence', 'ho_from', 'ho_cause', 'lim')
local state = f[1]
if not state then
  local kept = redis.call('GET', KEYS[5])
  if kept == ARGV[2] then
    return 1
  elseif kept == ARGV[4] then
    return 2
  end
  return 0
end
if ARGV[5] ~= '' and f[2] ~= ARGV[5] then
  return -1
end
local running = state == 'running' or (state == 'handoff' and f[3] == 'running' and f[4] == 'drain')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[6] ~= '' then
  redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',' .. ARGV[7])
  local history = redis.call('LRANGE', KEYS[2], 0, -1)
  local earlier = redis.call('HMGET', KEYS[1], 'dlq_first_ms', 'dlq_failures', 'partial')
  local first_ms, failures = now_ms, 1
  if earlier[1] then
    first_ms, failures = tonumber(earlier[1]), tonumber(earlier[2]) + 1
  end
  dlq_index_remove(KEYS[8], KEYS[10], KEYS[11], KEYS[9], id)
  redis.call('DEL', KEYS[9])
  redis.call('HSET', KEYS[9], 'entry', ARGV[6],
    'history', '[' .. table.concat(history, ',') .. ']', 'at_ms', now_ms,
    'first_ms', first_ms, 'failures', failures, 'task_id', id, 'fence', f[2],
    'task', ARGV[8], 'reason', 'cancelled', 'queue', ARGV[9], 'error', ARGV[10])
  if earlier[3] then
    redis.call('HSET', KEYS[9], 'partial', earlier[3])
  end
  if ARGV[11] ~= '' then
    redis.call('HSET', KEYS[9], 'chord', ARGV[11])
  end
  dlq_index_add(KEYS[8], KEYS[10], KEYS[11], id, ARGV[8], 'cancelled', now_ms)
  metric_count(KEYS[6], 'dlq:cancelled')
  metric_window(KEYS[7], now_ms, 'dlq')
end
if f[5] and f[5] ~= '' then
  -- A parked task leaves its line; one holding a slot frees it for the next (G14).
  limit_release(limit_prefix(KEYS[3]), KEYS[1], id, string.format('%d', now_ms), KEYS[6])
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('SET', KEYS[5], running and ARGV[4] or ARGV[2], 'PX', tonumber(ARGV[3]))
if KEYS[12] and redis.call('GET', KEYS[12]) == id then
  redis.call('DEL', KEYS[12])
end
metric_count(KEYS[6], 'cancelled')
return running and 2 or 1
