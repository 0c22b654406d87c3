-- release_abort.lua: the broker refused a released task: put the entry back in the DLQ
-- and remove the re-created task, if nothing has touched it since release.lua.
-- Serves G5: a failed release leaves the entry where it was.
--
-- KEYS[1]  DLQ time index   KEYS[2]  DLQ entry hash   KEYS[3]  task hash
-- KEYS[4]  history list   KEYS[5]  expiry index   KEYS[6]  DLQ lex index
-- KEYS[7]  DLQ counts   KEYS[8]  idempotency key (only for idempotent tasks)
-- ARGV[1]  entry id   ARGV[2]  task id   ARGV[3]  the fence release.lua minted
-- RETURNS  1 restored (a replay of this call after a lost reply, which finds the entry
--            restored from this fence, answers 1 again); 0 the task had moved on (it
--            started: let it run), nothing touched
-- @include _dlq_index
local mark = redis.call('HMGET', KEYS[2], 'releasing', 'restored')
if mark[1] ~= ARGV[3] then
  return mark[2] == ARGV[3] and 1 or 0
end
local fields = redis.call('HMGET', KEYS[3], 'fence', 'state')
if fields[1] ~= ARGV[3] or fields[2] ~= 'queued' then
  return 0
end
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[5], ARGV[2])
if KEYS[8] and redis.call('GET', KEYS[8]) == ARGV[2] then
  redis.call('DEL', KEYS[8])
end
redis.call('HDEL', KEYS[2], 'releasing')
redis.call('HSET', KEYS[2], 'restored', ARGV[3])
local f = redis.call('HMGET', KEYS[2], 'task', 'reason', 'at_ms')
dlq_index_add(KEYS[1], KEYS[6], KEYS[7], ARGV[1], f[1] or '', f[2] or '', f[3])
return 1
