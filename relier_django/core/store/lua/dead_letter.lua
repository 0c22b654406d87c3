-- dead_letter.lua: move a task into the DLQ with its history, tell receipts it failed,
-- release its idempotency key (compare-and-delete) and clean up, atomically.
-- Serves G5 (nothing disappears: every failure lands here with a reason, indexed and
-- counted in the same step), G4 (a failed idempotent task frees its key at once) and G7.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index   KEYS[4]  result key
-- KEYS[5]  DLQ time index   KEYS[6]  DLQ entry hash   KEYS[7]  DLQ lex index
-- KEYS[8]  DLQ counts
-- KEYS[9]  metrics counters   KEYS[10]  metrics windows ('' each when metrics are off)
-- KEYS[11] idempotency key (only for idempotent tasks)
-- ARGV[1]  task id
-- ARGV[2]  fence of the failing incarnation, or '' for a message that cannot be tied
--          to a stored task (malformed, bad checksum): then only the entry is written
-- ARGV[3]  DLQ entry id
-- ARGV[4]  entry JSON (reason, error, envelope or raw body, ...), built by the caller
-- ARGV[5]  outcome record, JSON, as receipts read it
-- ARGV[6]  result TTL, ms
-- ARGV[7]  history event: JSON object without its opening brace (see start.lua)
-- ARGV[8]  task name ('' when unknown)   ARGV[9]  reason code   ARGV[10] queue
-- ARGV[11] one-line error summary, for listings
-- ARGV[12] the state the caller holds the task in ('' when unfenced): 'running' (a
--          runner that started it), 'queued' (a message refused before it started: an
--          unknown task), 'dying' (the scanner's lease past the resurrection limit).
--          A second copy of the incarnation, delivered to a worker that cannot run it
--          while the first copy runs, must not take the task from under it (G10).
-- ARGV[13] request token: unique per call, the same in a replay of it
-- ARGV[14] a chord's header member: the chord's group id, kept on the entry (field
--          'chord') so that deleting the entry gives the chord's state its TTL back
--          (dlq_delete.lua); '' or absent otherwise
-- Celery's link_error= (errbacks, created when a fenced task is filed, with the filing):
-- ARGV[15] n, the number of errbacks (absent: 0); with n > 0, KEYS[11] and ARGV[14] are
--          given ('' when unused)
-- ARGV[16+6i .. 21+6i] errback i (0-based): its id, its envelope (fence 1), its task
--          name, its queue, its max resurrections, its flow-control gate ('' for none)
-- KEYS[12+2i], KEYS[13+2i] errback i's task hash and result key
-- A hand-over instead (a partitioned store: the errbacks live in other partitions;
-- store/handover.py): ARGV[15] 0, ARGV[16] the hand-over record (JSON: the errbacks),
-- kept under its token ARGV[17] in KEYS[13] and indexed by the filing time in KEYS[12]
-- (KEYS[11] and ARGV[14] given, '' when unused); only with a fenced filing.
-- Each errback is created once, as _links.lua says: by the filing call (a replay of it
-- answers before, from its token), and never while its id has a task or a result.
-- The task's latest checkpoint (field 'partial') moves into the entry, and release.lua
-- gives it to the next incarnation. A gated task's slot is freed and handed to the next
-- parked task of its scope (_limits.lua, G14).
-- RETURNS  {1, at_ms}             dead-lettered (a replay of this call after a lost
--                                 reply, found by its token in the entry, answers the
--                                 same; so does an unfenced message already filed
--                                 under its entry id: a second copy of it)
--          {0, current_fence, state}  rejected: the fence moved (-1: the task is
--                                 gone), or the task is not in the state held
-- Counts: 'dlq:<reason>' and the minute's and hour's 'dlq' once per filing (a second
-- copy of an unfenced message, filed already, is not counted again).
-- @include _dlq_index
-- @include _metrics
-- @include _limits
-- @include _links
local id = ARGV[1]
local fenced = ARGV[2] ~= ''
local gated = false
local filed = redis.call('HMGET', KEYS[6], 'req', 'at_ms')
if filed[1] == ARGV[13] or (not fenced and filed[2]) then
  return {1, tonumber(filed[2])}
end
if fenced then
  local current = redis.call('HMGET', KEYS[1], 'fence', 'state', 'lim')
  if current[1] ~= ARGV[2] or current[2] ~= ARGV[12] then
    return {0, tonumber(current[1]) or -1, current[2] or ''}
  end
  gated = current[3] and current[3] ~= ''
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local history = {}
local first_ms, failures = now_ms, 1
local partial = false
if fenced then
  partial = redis.call('HGET', KEYS[1], 'partial')
  redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',' .. ARGV[7])
  history = redis.call('LRANGE', KEYS[2], 0, -1)
  -- A task released from the DLQ carries its earlier failures (see release.lua).
  local earlier = redis.call('HMGET', KEYS[1], 'dlq_first_ms', 'dlq_failures')
  if earlier[1] then
    first_ms, failures = tonumber(earlier[1]), tonumber(earlier[2]) + 1
  end
end
-- The id can still name an older entry: one being released (its hash marked
-- 'releasing', out of the index) or one still indexed. Replace it whole, so that
-- release_done.lua finds no 'releasing' mark and leaves this failure alone.
dlq_index_remove(KEYS[5], KEYS[7], KEYS[8], KEYS[6], ARGV[3])
redis.call('DEL', KEYS[6])
-- 'fence' tells one failure of a task from the next (they share the entry id).
redis.call('HSET', KEYS[6], 'entry', ARGV[4], 'history', '[' .. table.concat(history, ',') .. ']',
  'at_ms', now_ms, 'first_ms', first_ms, 'failures', failures, 'task_id', id, 'fence', ARGV[2],
  'task', ARGV[8], 'reason', ARGV[9], 'queue', ARGV[10], 'error', ARGV[11], 'req', ARGV[13])
if partial then
  redis.call('HSET', KEYS[6], 'partial', partial)
end
if ARGV[14] and ARGV[14] ~= '' then
  redis.call('HSET', KEYS[6], 'chord', ARGV[14])
end
dlq_index_add(KEYS[5], KEYS[7], KEYS[8], ARGV[3], ARGV[8], ARGV[9], now_ms)
if fenced then
  redis.call('SET', KEYS[4], ARGV[5], 'PX', tonumber(ARGV[6]))
  if KEYS[11] and redis.call('GET', KEYS[11]) == id then
    redis.call('DEL', KEYS[11])
  end
  if gated then  -- its slot freed and handed over (G14)
    limit_release(limit_prefix(KEYS[3]), KEYS[1], id, string.format('%d', now_ms), KEYS[9])
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('ZREM', KEYS[3], id)
  local now_text = string.format('%d', now_ms)
  for i = 0, (tonumber(ARGV[15] or '0') or 0) - 1 do
    local a = 16 + 6 * i
    link_create(KEYS[3], KEYS[12 + 2 * i], KEYS[13 + 2 * i], ARGV[a], ARGV[a + 1],
      ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], now_ms, now_text, KEYS[9])
  end
  -- Hand-over: recorded with the filing, so the errbacks are never lost with it.
  if ARGV[16] and ARGV[16] ~= '' and tonumber(ARGV[15]) == 0 then
    redis.call('ZADD', KEYS[12], now_text, ARGV[17])
    redis.call('HSET', KEYS[13], ARGV[17], ARGV[16])
  end
end
metric_count(KEYS[9], 'dlq:' .. ARGV[9])
metric_window(KEYS[10], now_ms, 'dlq')
return {1, now_ms}
