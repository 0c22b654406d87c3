-- adopt.lua: store a plain Celery message for an @rl_task (send_task by name, raw
-- arguments: no relier envelope) as a task under its Celery id, marked held by the
-- adopting worker, in one step; or, adopted already, answer what is stored.
-- Serves G1 from adoption on (the task is stored, covered by the expiry index within
-- one heartbeat TTL, and held by a worker whose death the scanner sees: orphans.lua),
-- G2 (it then runs fenced, fence 1, through start.lua like a pushed task) and G10 (a
-- second delivery of the same message, to any worker, adopts nothing: its id is taken,
-- and the caller's start.lua refuses a second start).
--
-- KEYS[1]  task hash            <p>:t:{id}
-- KEYS[2]  history list         <p>:h:{id}
-- KEYS[3]  expiry index (zset)  <p>:expiry
-- KEYS[4]  DLQ entry hash       <p>:dlq:e:{id}
-- KEYS[5]  outcome (result) key <p>:r:{id}
-- KEYS[6]  metrics counters, KEYS[7] metrics windows ('' each when metrics are off)
-- ARGV[1]  task id (the Celery message's id)
-- ARGV[2]  envelope, canonical JSON, fence 1, built by the worker from the message
-- ARGV[3]  task name
-- ARGV[4]  queue the message arrived on
-- ARGV[5]  the adopting worker's id (hostname:pid), as its liveness connection names it
-- ARGV[6]  heartbeat TTL, ms: the task is due within it unless the adopter's
--          reservation heartbeat ('queued') or its start (start.lua) covers it
-- ARGV[7]  max resurrections for this task
-- ARGV[8]  history event: a JSON object without its opening brace; the script
--          prefixes {"at_ms":<server time>,
-- ARGV[9]  adoption token: unique per adopt call, the same in a replay of that call
--          (a client retry after a lost reply), which is then answered {1, envelope}
-- RETURNS  {1, envelope}       adopted now: stored, fence 1, 'queued', held by ARGV[5]
--          {0, envelope, state} adopted before (this message delivered again, or this
--                              call replayed after a lost reply): the stored envelope
--                              (current fence) and state; the caller hands it to
--                              start.lua, which runs it only if it still waits
--          {-2, ''}           a DLQ entry holds this id: nothing adopted, nothing run
--          {-4, ''}           it finished and its outcome is still kept: a redelivery
--                              of a finished message runs nothing
-- A replay after a lost reply is answered as the call it replays (its token is the
-- one stored): the same answer, nothing written twice. Counts 'pushed' once per
-- adoption (not on a redelivery, not on a replay).
-- @include _metrics
-- @include _clock
local id = ARGV[1]
local existing = redis.call('HMGET', KEYS[1], 'env', 'state', 'adopt')
if existing[1] then
  if existing[3] == ARGV[9] then
    return {1, existing[1]}
  end
  return {0, existing[1], existing[2] or ''}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {-2, ''}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {-4, ''}
end
local now_ms, now_text = clock()
redis.call('HSET', KEYS[1],
  'env', ARGV[2], 'fence', '1', 'state', 'queued', 'attempt', '1', 'res', '0',
  'name', ARGV[3], 'queue', ARGV[4], 'idem', '', 'created_ms', now_text,
  'maxres', ARGV[7], 'pushers', '1', 'worker', ARGV[5], 'adopt', ARGV[9])
redis.call('ZADD', KEYS[3], ms(now_ms + tonumber(ARGV[6])), id)
redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_text .. ',' .. ARGV[8])
metric_count(KEYS[6], 'pushed')
return {1, ARGV[2]}
