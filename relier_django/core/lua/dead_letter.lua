-- dead_letter.lua: move a task into the DLQ with its history, tell receipts it failed,
-- release its idempotency key (compare-and-delete) and clean up, atomically.
-- Serves G5 (nothing disappears: every failure lands here with a reason), G4 (a failed
-- idempotent task frees its key at once) and G7.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index   KEYS[4]  result key
-- KEYS[5]  DLQ index (zset)   KEYS[6]  DLQ entry hash
-- KEYS[7]  idempotency key (only for idempotent tasks)
-- ARGV[1]  task id
-- ARGV[2]  fence of the failing incarnation, or '' for a message that cannot be tied
--          to a stored task (malformed, bad checksum): then only the entry is written
-- ARGV[3]  DLQ entry id
-- ARGV[4]  entry JSON (reason, error, envelope or raw body, ...), built by the caller
-- ARGV[5]  outcome record, JSON, as receipts read it
-- ARGV[6]  result TTL, ms
-- ARGV[7]  history event: JSON object without its opening brace (see start.lua)
-- RETURNS  {1, at_ms}             dead-lettered
--          {0, current_fence}     rejected: the fence moved (-1: the task is gone)
local id = ARGV[1]
local fenced = ARGV[2] ~= ''
if fenced then
  local current = redis.call('HGET', KEYS[1], 'fence')
  if current ~= ARGV[2] then
    return {0, tonumber(current) or -1}
  end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local history = {}
if fenced then
  redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',' .. ARGV[7])
  history = redis.call('LRANGE', KEYS[2], 0, -1)
end
-- 'fence' tells one failure of a task from the next (they share the entry id).
redis.call('HSET', KEYS[6], 'entry', ARGV[4], 'history', '[' .. table.concat(history, ',') .. ']',
  'at_ms', now_ms, 'task_id', id, 'fence', ARGV[2])
redis.call('ZADD', KEYS[5], now_ms, ARGV[3])
if fenced then
  redis.call('SET', KEYS[4], ARGV[5], 'PX', tonumber(ARGV[6]))
  if KEYS[7] and redis.call('GET', KEYS[7]) == id then
    redis.call('DEL', KEYS[7])
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('ZREM', KEYS[3], id)
end
return {1, now_ms}
