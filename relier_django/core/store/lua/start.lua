-- start.lua: accept a delivered message only if it carries the task's current fence.
-- Serves G2 (an older incarnation's copy, redelivered by the broker, never runs) and
-- G1 (a started task is covered by a heartbeat deadline in the expiry index).
-- One start per fence: a second delivery of the same incarnation is refused too. A
-- replay of this very call (the client retrying after a lost reply; same run token)
-- is answered as the start it was, so a worker never abandons its own valid run.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  metrics counters   KEYS[5]  metrics windows ('' each when metrics are off)
-- ARGV[1]  task id
-- ARGV[2]  fence carried by the message
-- ARGV[3]  worker id (hostname:pid)
-- ARGV[4]  heartbeat TTL, ms
-- ARGV[5]  history event: a JSON object without its opening brace; the script
--          prefixes {"at_ms":<server time>,
-- ARGV[6]  run token: unique per start attempt, the same in a replay of it
-- RETURNS  {1, '', fence, checkpoint, due_ms}  started; checkpoint: the task's latest
--                                          (ctx.set_partial) record, or '' if none;
--                                          due_ms: when it was due (a countdown, an eta,
--                                          a periodic tick), '' when pushed to run now
--          {0, 'expired', fence}          its expiry passed before it started: the
--                                          caller dead-letters it (expired), never runs it
--          {0, 'gone', -1}                no such task (finished, dead-lettered, never stored)
--          {0, 'stale', current_fence}    the fence has moved on
--          {0, 'started', current_fence}  this incarnation already started elsewhere
-- Observes, once per start (a replay answers before): histogram 'queue_wait', from when
-- this incarnation could first start (pushed, sent again, or due) to now; and, for an
-- incarnation a resurrection made, the recovery it ends. resurrect.lua marked the task
-- (rc_cause, rc_seen: its last sign of life, rc_found: when a scanner leased it) and
-- resurrected.lua added rc_sent (when the broker took it): 'recovery:<cause>' (seen ->
-- now), 'detection' (seen -> found), 'redispatch' (found -> sent), 'restart' (sent ->
-- now), and the minute's recovery count, sum and maximum. The marks then go.
-- @include _metrics
-- @include _clock
local id = ARGV[1]
-- One read for every path: a refused start costs the same, an accepted one a call less.
local current, partial, state, run, due, expires, created, queued, cause, seen, found, sent =
  unpack(redis.call('HMGET', KEYS[1], 'fence', 'partial', 'state', 'run', 'due_ms',
    'expires_ms', 'created_ms', 'q_ms', 'rc_cause', 'rc_seen', 'rc_found', 'rc_sent'))
if not current then
  return {0, 'gone', -1}
end
if current ~= ARGV[2] then
  return {0, 'stale', tonumber(current)}
end
if state ~= 'queued' then
  if state == 'running' and run == ARGV[6] then
    return {1, '', tonumber(current), partial or '', due or ''}
  end
  return {0, 'started', tonumber(current)}
end
local now_ms, now_text = clock()
if expires and tonumber(expires) < now_ms then
  return {0, 'expired', tonumber(current)}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[3], 'started_ms', now_text,
  'run', ARGV[6])
redis.call('ZADD', KEYS[3], ms(now_ms + tonumber(ARGV[4])), id)
redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_text .. ',' .. ARGV[5])
if KEYS[4] ~= '' then
  local ready = math.max(tonumber(queued or created) or now_ms, tonumber(due) or 0)
  metric_observe(KEYS[4], 'queue_wait', now_ms - ready)
  if found then
    seen, found, sent = tonumber(seen), tonumber(found), tonumber(sent) or now_ms
    metric_observe(KEYS[4], 'recovery:' .. (cause or 'unknown'), now_ms - seen)
    metric_observe(KEYS[4], 'detection', found - seen)
    metric_observe(KEYS[4], 'redispatch', sent - found)
    metric_observe(KEYS[4], 'restart', now_ms - sent)
    metric_window_recovery(KEYS[5], now_ms, now_ms - seen)
    redis.call('HDEL', KEYS[1], 'rc_cause', 'rc_seen', 'rc_found', 'rc_sent')
  end
end
return {1, '', tonumber(current), partial or '', due or ''}
